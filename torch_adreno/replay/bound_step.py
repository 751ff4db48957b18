"""A replayed step bound to the device (:class:`BoundStep`): its arena allocated, its batch input
made, its kernels rebuilt for the arena, runs of copies merged, the recording's fills placed and
every operation's arguments bound once, its footprint counted again with the images it made.

Made from a :class:`~torch_adreno.replay.step_memory.StepMemory` (the memory it allocates was held
to the limits first); a :class:`~torch_adreno.replay.step_launches.StepLaunches` lists it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from torch_adreno.memory.footprint import DeviceFootprint
from torch_adreno.replay.arena_kernels import MergedCopies, arena_kernels, merged_copies
from torch_adreno.replay.batch import BatchInput, BatchMode, batch_mode
from torch_adreno.replay.buffers import StepBuffers
from torch_adreno.replay.capture import PERSISTENT, RecordedLaunch, StepRecorder
from torch_adreno.replay.memory import step_fills, step_footprint
from torch_adreno.replay.operations import BoundOperations, bind_operations
from torch_adreno.replay.options import ReplayOptions
from torch_adreno.replay.step_memory import StepMemory
from torch_adreno.runtime.residency import Residency

__all__ = ["BoundStep", "bind_step", "reads_images", "step_batch_mode"]


def reads_images(recorder: StepRecorder) -> bool:
    """Whether a kernel of the step reads images (each made over a buffer once, at binding)."""
    return any(isinstance(op, RecordedLaunch) and op.source.images for op in recorder.operations)


def step_batch_mode(recorder: StepRecorder, zero_copy: bool, options: ReplayOptions) -> BatchMode:
    """How a replay of ``recorder``'s step puts its batch in place (:func:`~torch_adreno.replay.batch.batch_mode`):
    never bound anew each step where a kernel reads images or the driver records the launch list."""
    return batch_mode(zero_copy, recorder.runtime.profile.unified_memory,
                      reads_images(recorder) or options.recording is not None)


@dataclass(frozen=True)
class BoundStep:
    """A step's device work, every kernel argument bound once (:func:`bind_step`). Invariant:
    ``operations`` reads and writes only ``buffers`` (the arena's buffers, the persistent tensors'
    and the batch's bindings in ``batch_input``), and what its kernels take is held here: a kernel
    argument holds no reference to its buffer."""

    #: Where each identity lives: the arena (allocated), the persistent tensors' buffers, the batch's.
    buffers: StepBuffers
    #: The batch arguments and seeds a replay puts in place (:mod:`.batch`).
    batch_input: BatchInput
    #: Per launch, whether its kernel was rewritten to take the arenas (else bound as compiled).
    rewritten: list[bool]
    #: The slabs the kernels take.
    slabs: list[cl.Buffer]
    #: The persistent tensors' buffers, with the tensors (the host memory under them, zero-copy): the
    #: residency may drop its entry for one (evicted, replaced) while the kernels still point at the
    #: buffer, which must then stay alive (a released one faults at the next enqueue).
    persistent: list[tuple[Any, Any]]
    #: The operations of the launch list, in order, with their launches, images and what they cover.
    operations: BoundOperations
    #: The device memory the step holds, its images included, held to the limits once more.
    footprint: DeviceFootprint

    @property
    def checking_launches(self) -> int:
        """The launches that check their indices (each writes the device's index error record)."""
        return sum(1 for _, source, _ in self.operations.launches if source.checks_indices)

    @property
    def offset_arguments(self) -> int:
        """The launches' arena offset arguments (an ``int`` each)."""
        return sum(self.operations.offset_arguments)

    @property
    def kernel_arguments(self) -> int:
        """The launches' arguments but the arena offsets: the buffers, mostly."""
        return sum(kernel.num_args for _, _, kernel in self.operations.launches) - self.offset_arguments


def bind_step(recorder: StepRecorder, memory: StepMemory, residency: Residency, heap_group: Hashable,
              mode: BatchMode, queue: cl.CommandQueue, options: ReplayOptions) -> BoundStep:
    """``recorder``'s step on its device in ``memory``'s arena (a region of ``heap_group`` where
    the kernels take it with the persistent tensors' slab), the batch put in place by ``mode`` on
    ``queue``; a :class:`~torch_adreno.errors.DeviceMemoryError` where its images make it too large
    for ``memory.limits``."""
    runtime = recorder.runtime
    in_heap = options.arena_kernels and not residency.zero_copy and not reads_images(recorder)
    buffers = StepBuffers(runtime, recorder, memory.arena, in_heap, heap_group)
    bindings = buffers.batch_bindings(recorder, mode is BatchMode.IN_PLACE)
    # Seeds and batch share one arena buffer and one write; valid_for prestages through it.
    batch_input = BatchInput(runtime, queue, mode, list(bindings.values()), buffers.arenas[memory.arena.inputs_part],
                             [memory.arena.offset_of[i] for i in recorder.seeds])
    persistent = [(i.buffer, i.tensor) for i in recorder.identities if i.kind is PERSISTENT]
    kernels = arena_kernels(runtime, recorder, buffers.located, buffers.slabs, options.arena_kernels)
    copies = (merged_copies(runtime, recorder, buffers.located, buffers.slabs)
              if options.arena_kernels and options.merge_copies else MergedCopies({}, []))
    slabs = list({id(b): b for k in kernels for b in k.slabs or ()}.values())
    slabs += [slab for slab in copies.slabs if all(slab is not b for b in slabs)]
    fills = step_fills(recorder, memory.plan) if options.fill_uninitialized_memory else {}
    bound = bind_operations(runtime, recorder, buffers, kernels, copies, bindings, fills)
    own_images = {id(image.image): image.nbytes for image in bound.images if not image.shared}
    footprint = step_footprint(recorder, memory.arena, list(own_images.values()), memory.limits, residency.name_of)
    return BoundStep(buffers, batch_input, [k.slabs is not None for k in kernels], slabs, persistent, bound,
                     footprint)
