"""The operations of a replayed step's launch list, every kernel argument bound once
(:class:`~torch_adreno.replay.step.ReplayedStep` builds its lists from them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from torch_adreno.replay.arena_kernels import MergedCopies, ReplayKernel
from torch_adreno.replay.batch import REPLAY_GRAPH, BatchBinding
from torch_adreno.replay.buffers import StepBuffers
from torch_adreno.replay.capture import RecordedCopy, RecordedFill, StepRecorder
from torch_adreno.replay.launch_list import Copy, Fill, Flush, Launch, Operation
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.images import image_views

__all__ = ["FLUSH_AFTER", "BoundOperations", "CaptureError", "bind_operations"]

#: Launch counts after which a replay flushes the queue: early, then at doubling intervals.
FLUSH_AFTER = frozenset({4, 16, 48, 112, 240, 496, 1008})


class CaptureError(RuntimeError):
    """A recorded step cannot be replayed; the message says why (the step runs the full path)."""


@dataclass
class BoundOperations:
    """A step's device work in order: the operations of a launch list (``listed``), per operation
    the (graph, source) a profile reports (``described``; None: a copy, a fill, a flush) and the
    positions of the recorded operations it does (``covered``: a merged run of copies, several; a
    fill, a flush or an image refresh, none); per launch its graph, source and kernel
    (``launches``) and its offset arguments (``offset_arguments``, ints); the images the kernels
    read (``images``: a kernel argument holds no reference)."""

    listed: list[Operation] = field(default_factory=list)
    described: list[tuple[str, Any] | None] = field(default_factory=list)
    covered: list[tuple[int, ...]] = field(default_factory=list)
    launches: list[tuple[str, Any, cl.Kernel]] = field(default_factory=list)
    offset_arguments: list[int] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)


def bind_operations(runtime: DeviceRuntime, recorder: StepRecorder, buffers: StepBuffers, kernels: list[ReplayKernel],
                    copies: MergedCopies, batch_of: dict[int, BatchBinding],
                    fills: dict[int, list[RecordedFill]]) -> BoundOperations:
    """The step's device work in order, every kernel argument bound once (see
    :class:`BoundOperations`). ``kernels``: per recorded launch, its replay kernel; ``copies``: the
    runs of copies merged into kernels; ``batch_of``: the batch bindings by identity (a consumer of
    one bound in place is left to each replay); ``fills``: by operation, the fills right before it."""
    bound = BoundOperations()
    listed, described, covered = bound.listed, bound.described, bound.covered

    def merged_run(first: int) -> tuple[int, ...]:
        """The positions of the run of copies merged into the kernel at ``first``."""
        end = first + 1
        while end in copies.by_position and copies.by_position[end] is None:
            end += 1
        return tuple(range(first, end))
    launched = iter(kernels)

    def bind_or_defer(kernel: cl.Kernel, position: int, index: int, buffer: cl.Buffer | None) -> None:
        if index in batch_of and batch_of[index].buffer is None:
            batch_of[index].consumers.append((kernel, position))  # bound by each replay
        else:
            kernel.set_arg(position, buffer)

    def launch(graph: str, kernel: cl.Kernel, source: Any, positions: tuple[int, ...], offsets: int = 0) -> None:
        bound.launches.append((graph, source, kernel))
        bound.offset_arguments.append(offsets)
        listed.append(Launch(kernel, source.global_size, source.local_size, source.name))
        described.append((graph, source))
        covered.append(positions)

    def other(operation: Operation) -> None:
        listed.append(operation)
        described.append(None)
        covered.append(())

    for position, op in enumerate(recorder.operations):
        for fill in fills.get(position, ()):
            buffer, at = buffers.place(fill.identity)
            for operation in Fill.of(buffer, at + fill.offset, fill.nbytes):
                other(operation)
        if isinstance(op, RecordedCopy):
            if position in copies.by_position:
                merged = copies.by_position[position]
                if merged is not None:
                    # (the run it starts: every position merged into this one kernel)
                    launch(REPLAY_GRAPH, merged[0], merged[1], merged_run(position))
                continue
            try:
                (destination, at), (source_buffer, start) = buffers.place(op.destination), buffers.place(op.source)
            except ValueError as err:
                raise CaptureError(str(err)) from None
            listed.append(Copy(source_buffer, destination, start, at, op.nbytes))
            described.append(None)
            covered.append((position,))
            continue
        replay_kernel = next(launched)
        kernel, slabs, source = replay_kernel.kernel, replay_kernel.slabs, op.source
        kept = [index for argument, index in enumerate(op.args) if argument not in replay_kernel.placed]
        if slabs is None:
            # Kept as compiled, bound to the arena's sub-buffers (images over them: a copied image
            # is refreshed before each read).
            for argument, index in enumerate(op.args):
                bind_or_defer(kernel, argument, index, buffers.buffer(index) if index not in batch_of
                              or batch_of[index].buffer is not None else None)
            if source.images:
                named = list(zip(source.params, op.args, strict=True))
                by_param = {name: buffers.buffer(index) for name, index in named}
                in_arena = {name: where for name, index in named
                            if index in buffers.layout.offset_of and (where := buffers.located(index)) is not None}
                for image in image_views(runtime).bind(kernel, source, by_param.__getitem__, in_arena.get):
                    bound.images.append(image)
                    if not image.shared:
                        other(image.refresh)
        else:  # (its slabs and offsets bound already)
            for argument, index in enumerate(kept, start=replay_kernel.first_argument):
                bind_or_defer(kernel, argument, index, buffers.buffers[index])
        if source.checks_indices:  # the device's index error record and the launch's token, after those
            runtime.index_errors.bind(kernel, source, replay_kernel.first_argument + len(kept))
        launch(op.graph, kernel, source, (position,), len(replay_kernel.offsets))
        if len(bound.launches) in FLUSH_AFTER:
            # Hand what is enqueued to the device now, so that it computes while the host enqueues
            # the rest (some drivers submit only at a flush or a blocking call).
            other(Flush())
    return bound

