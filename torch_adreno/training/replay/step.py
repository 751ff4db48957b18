"""A recorded training step, replayed: one launch list over buffers fixed at capture.

Built from a :class:`~torch_adreno.training.replay.capture.StepRecorder` that watched one whole step
(forward, backward, optimizer). Every kernel of the step gets its own kernel object with every
argument bound once; memory made during the step (arena slots, saved activations, gradients,
scratch, the loss) is laid out anew by one memory plan spanning the whole step, so a saved
activation's bytes are free after its last backward read and a gradient's after the optimizer's;
persistent tensors (parameters, optimizer state) keep the residency's buffers. The step's own
memory, its seeds and (where copied) its batch live in one buffer, the arena (:class:`ArenaLayout`),
and the kernels are rebuilt to take it as one argument and find those operands at constant
offsets (:mod:`torch_adreno.kernels.arena_params`): a driver's enqueue costs time per argument
(NVIDIA's ~0.45 us each with the device busy), and resnet_mini's step passes 300 arguments instead
of 648. A replay then:

1. puts the batch in place: on a unified-memory device with zero-copy, binds each new batch's host
   memory to the kernels that read it (a host-pointer buffer made over it, nothing copied); on a
   device with memory of its own, copies it into pinned staging memory mapped once and uploads
   that asynchronously, with the step's seeds, in one write (a driver stages pageable memory
   itself, synchronously, and charges each write's enqueue); else (zero-copy off on unified memory)
   uploads it from its own memory;
2. draws fresh random seeds from torch's default generator in the capture's order (staged: into
   the same write);
3. enqueues the launches in one loop with nothing in it but the enqueue;
4. reads the loss (the one blocking wait of the step).

No Dynamo, AOTAutograd wrapper or autograd engine runs. What a replay assumes (the same batch
geometry, the same tensors, hyperparameters, modes) is checked by its owner before each call
(:mod:`torch_adreno.training.guards`). The enqueue loop is :meth:`ReplayedStep._enqueue_all`: the one
place a driver-recorded queue (``cl_qcom_recordable_queues``) would replace.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl
import torch

from torch_adreno.kernels.arena_params import copy_ranges, place_in_arena
from torch_adreno.kernels.program import KernelSource
from torch_adreno.runtime.build import build_kernels
from torch_adreno.runtime.events import BUS, LaunchRecord
from torch_adreno.runtime.heap import device_heap, placement
from torch_adreno.runtime.images import image_views
from torch_adreno.runtime.residency import Residency, host_array, shared_buffer
from torch_adreno.training.replay.capture import (
    BATCH,
    INTERNAL,
    PERSISTENT,
    RecordedCopy,
    RecordedLaunch,
    StepRecorder,
    recording_of,
)
from torch_adreno.training.replay.launch_list import Copy, Flush, Launch, LaunchList, Operation
from torch_adreno.training.replay.memory import ArenaLayout, plan_step_memory, verify_step_memory

REPLAY_GRAPH = "replayed_step"

#: Launch counts after which a replay flushes the queue: early, then at doubling intervals.
FLUSH_AFTER = frozenset({4, 16, 48, 112, 240, 496, 1008})

#: Whether a replay's kernels are rewritten to take the arena as one argument (read when a replay
#: is built). False binds them as compiled, to sub-buffers of the arena: benchmarks/replay.py
#: measures both in one run, and tests check they agree bit for bit.
ARENA_KERNELS = True
#: Whether runs of copies between heap regions are one kernel (see :meth:`ReplayedStep._merged_copies`).
MERGE_COPIES = True


class CaptureError(RuntimeError):
    """A recorded step cannot be replayed; the message says why (the step runs the full path)."""


#: How a replay puts a batch argument in place (see the module docstring).
IN_PLACE, STAGED, UPLOADED = "in place", "staged", "uploaded"


def _unmap_all(maps: list[Any], queue: cl.CommandQueue) -> None:
    for mapping in maps:
        mapping.release(queue)
    queue.finish()


def batch_mode(zero_copy: bool, unified_memory: bool) -> str:
    """How a replay puts the batch in place on a device (see the module docstring)."""
    if unified_memory:
        return IN_PLACE if zero_copy else UPLOADED
    return STAGED


@dataclass
class _BatchBinding:
    position: int
    #: as_strided geometry when the bound view differs from the batch argument itself.
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None
    nbytes: int
    label: str
    #: The replay's own device buffer the batch is uploaded into (None: bound in place), and
    #: where in it.
    buffer: cl.Buffer | None
    offset: int = 0
    #: Staged: the pinned staging memory, mapped for the replay's lifetime, as bytes.
    staging: np.ndarray | None = None
    #: In place: the (kernel, argument index) pairs that read the batch.
    consumers: list[tuple[cl.Kernel, int]] = field(default_factory=list)


class ReplayedStep:
    """One recorded step as a static list of device operations (see the module docstring)."""

    def __init__(self, recorder: StepRecorder, loss: torch.Tensor, residency: Residency,
                 heap_group: Hashable = None, verify_memory: bool = False) -> None:
        """``heap_group``: the device heap group of the step's persistent tensors (the arena joins
        their slab, so that most kernels take one slab argument). ``verify_memory``: prove the
        arena layout against the recorded operations first (:func:`verify_step_memory`)."""
        if recorder.unsupported is not None:
            raise CaptureError(recorder.unsupported)
        loss_identity = recorder.output_identity(loss)
        if loss_identity is None or recorder.identities[loss_identity].kind is not INTERNAL:
            raise CaptureError("the loss is not an output a graph of the step wrote on the device")
        self.runtime = recorder.runtime
        self.residency = residency
        self.graphs = tuple(recorder.graphs)
        self.memory = plan_step_memory(recorder, {loss_identity})
        #: The recorded step without its internal buffers (what an export translates).
        self.recording = recording_of(recorder, loss_identity)
        context = self.runtime.context
        # A queue of the replay's own, without profiling: some drivers take twice as long to enqueue
        # on a profiling queue (NVIDIA's: ~14 vs ~7 us). Under profile() the runtime's queue is used.
        self._queue = cl.CommandQueue(context)
        self._batch: list[_BatchBinding] = []
        batch_of: dict[int, _BatchBinding] = {}
        #: How the batch is put in place: IN_PLACE, STAGED or UPLOADED (see the module docstring).
        self.batch_mode = batch_mode(residency.zero_copy, self.runtime.profile.unified_memory)
        if self.batch_mode is IN_PLACE and any(not isinstance(op, RecordedCopy) and op.source.images
                                              for op in recorder.operations):
            # An image is made over a buffer once, at binding: a batch bound anew each step would
            # need new images each step, so the batch goes into the replay's own buffers instead.
            self.batch_mode = UPLOADED
        # Staged: the pinned buffers, each mapped once (the mapping lives as long as the replay).
        self._staging_buffers: list[cl.Buffer] = []
        self._staging_maps: list[Any] | None = None
        # In place: the host-pointer buffers bound by the last replay, with the memory under them;
        # kept until the next replay binds others, so no kernel points at a released buffer.
        self._bound_batch: list[tuple[cl.Buffer, Any]] = []
        # The memory made during the step, the seeds and the batch's own copy live in one buffer,
        # the arena, each at a fixed offset (internal identities at their slot's).
        self.arena = ArenaLayout.of(recorder, self.memory, self.batch_mode is not IN_PLACE,
                                    self.runtime.device.mem_base_addr_align // 8)
        if verify_memory:
            verify_step_memory(recorder, self.arena, {loss_identity})
        # Where the persistent tensors are device copies (heap regions), a region of the same heap
        # group, so that the kernels reach it and them in one slab through one argument; its own
        # copies, writes and reads address the region. Otherwise a buffer of its own: with
        # zero-copy the parameters are host memory, and a slab would only reserve memory (a phone's).
        # A replay binding kernels as compiled (images, or ARENA_KERNELS off) binds sub-buffers of
        # its arena: then too the arena is a buffer of its own, their parent (on the H200, NVIDIA's
        # driver crashed releasing such sub-buffers made over a slab; over a buffer of their own,
        # as before the heap, it does not).
        if ARENA_KERNELS and not residency.zero_copy and not any(
                isinstance(op, RecordedLaunch) and op.source.images for op in recorder.operations):
            self._arena = device_heap(self.runtime).allocate(self.arena.nbytes, heap_group)
            located = placement(self._arena)
            assert located is not None
            self._arena_base, self._arena_start = located
        else:
            self._arena = cl.Buffer(context, cl.mem_flags.READ_WRITE, max(self.arena.nbytes, 1))
            self._arena_base, self._arena_start = self._arena, 0
        self._sub_buffers: dict[int, cl.Buffer] = {}
        self._recorded_nbytes = {identity.index: identity.nbytes for identity in recorder.identities}
        buffers: dict[int, cl.Buffer | None] = {}
        for identity in recorder.identities:
            if identity.kind is PERSISTENT:
                buffers[identity.index] = identity.buffer
            elif identity.kind is BATCH:
                assert identity.tensor is not None and identity.view is not None
                own = tuple(identity.tensor.shape), tuple(identity.tensor.stride()), identity.tensor.storage_offset()
                base = recorder.batch[identity.batch_position]
                whole = own == (tuple(base.shape), tuple(base.stride()), base.storage_offset())
                binding = _BatchBinding(identity.batch_position, None if whole else identity.view,
                                        identity.nbytes, identity.label, None)
                if self.batch_mode is not IN_PLACE:
                    binding.buffer, binding.offset = self._arena, self.arena.offset_of[identity.index]
                self._batch.append(binding)
                batch_of[identity.index] = binding
                buffers[identity.index] = binding.buffer if self.batch_mode is IN_PLACE else None
        self._seeds = [self.arena.offset_of[i] for i in recorder.seeds]
        # Staged: the batch and the seeds go up in one write from one pinned buffer mirroring the
        # arena's bytes from the first of them to the last (they are placed after the step's slots).
        self._tail: np.ndarray | None = None
        self._tail_start = 0
        self._seed_slots: list[torch.Tensor] = []
        if self.batch_mode is STAGED:
            spans = [(self.arena.offset_of[i.index], i.nbytes) for i in recorder.identities
                     if i.kind is BATCH and i.nbytes] + [(offset, 8) for offset in self._seeds]
            if spans:
                self._tail_start = min(at for at, _ in spans)
                self._tail = self._staging(max(at + n for at, n in spans) - self._tail_start)
                for binding in self._batch:
                    if binding.nbytes:
                        at = binding.offset - self._tail_start
                        binding.staging = self._tail[at:at + binding.nbytes]
                self._seed_slots = [torch.from_numpy(self._tail[at - self._tail_start:at - self._tail_start + 8]
                                                     .view(np.int64)).reshape(()) for at in self._seeds]
        # A kernel argument holds no reference to its buffer: the residency may drop its entry for
        # a persistent tensor (evicted, replaced) while this replay's kernels still point at the
        # buffer, which must then stay alive (a released one faults at the next enqueue), with the
        # host memory under it (zero-copy).
        self._persistent = [(i.buffer, i.tensor) for i in recorder.identities if i.kind is PERSISTENT]
        self._launches: list[tuple[str, Any, cl.Kernel]] = []
        #: The images the kernels read (a kernel argument holds no reference).
        self._images: list[Any] = []
        #: Per operation, the (graph, kernel source) a profile reports for it (None: a copy, a flush).
        self._described: list[tuple[str, Any] | None] = []
        kernels = self._arena_kernels(recorder)
        #: Per launch, whether its kernel was rewritten to take the arenas (else bound as compiled).
        self._rewritten = [bases is not None for _, bases, _ in kernels]
        #: The slabs the rewritten kernels take (a kernel argument holds no reference).
        self._bases = list({id(b): b for _, bases, _ in kernels for b in bases or ()}.values())
        # The step's device work in order, queue-neutral: bound once into each queue's partials below.
        steps: list[tuple[Any, ...]] = []
        launched = iter(kernels)
        merged = self._merged_copies(recorder)
        for position, op in enumerate(recorder.operations):
            if isinstance(op, RecordedCopy):
                if position in merged:
                    copies = merged[position]
                    if copies is not None:
                        self._launches.append((REPLAY_GRAPH, copies[1], copies[0]))
                        steps.append(("launch", copies[0], copies[1], (REPLAY_GRAPH, copies[1])))
                    continue
                (destination, at), (source, start) = self._place(op.destination, buffers), self._place(op.source, buffers)
                steps.append(("copy", destination, source, op.nbytes, at, start))
                continue
            kernel, bases, placed = next(launched)
            source = op.source
            if bases is None:
                # Kept as compiled, bound to the arena's sub-buffers (images over them: a copied image
                # is refreshed before each read).
                for position, index in enumerate(op.args):
                    if index in batch_of and batch_of[index].buffer is None:
                        batch_of[index].consumers.append((kernel, position))  # bound by each replay
                    else:
                        kernel.set_arg(position, self._buffer(index, buffers))
                if source.images:
                    named = list(zip(source.params, op.args, strict=True))
                    by_param = {name: self._buffer(index, buffers) for name, index in named}
                    in_arena = {name: (self._arena_base, self._arena_start + self.arena.offset_of[index])
                                for name, index in named if index in self.arena.offset_of}
                    for image in image_views(self.runtime).bind(kernel, source, by_param.__getitem__, in_arena.get):
                        self._images.append(image)
                        if not image.shared:
                            steps.append(("refresh", image))
            else:
                for position, base in enumerate(bases):
                    kernel.set_arg(position, base)
                kept = [index for position, index in enumerate(op.args) if position not in placed]
                for position, index in enumerate(kept, start=len(bases)):
                    if index in batch_of and batch_of[index].buffer is None:
                        batch_of[index].consumers.append((kernel, position))  # bound by each replay
                    else:
                        kernel.set_arg(position, buffers[index])
            if source.checks_indices:  # the device's index error record, the launch's token
                first = len(bases) + len(op.args) - len(placed) if bases is not None else len(op.args)
                self.runtime.index_errors.bind(kernel, source, first)
            self._launches.append((op.graph, source, kernel))
            steps.append(("launch", kernel, source, (op.graph, source)))
            if len(self._launches) in FLUSH_AFTER:
                # Hand what is enqueued to the device now, so that it computes while the host enqueues
                # the rest (some drivers submit only at a flush or a blocking call).
                steps.append(("flush",))
        listed: list[Operation] = []
        for step in steps:
            if step[0] == "copy":
                listed.append(Copy(step[2], step[1], step[5], step[4], step[3]))
            elif step[0] == "refresh":
                listed.append(step[1].refresh)
            elif step[0] == "launch":
                listed.append(Launch(step[1], step[2].global_size, step[2].local_size))
            else:
                listed.append(Flush())
        #: The step's device operations on the replay's own queue (the C loop where available).
        self._operations = LaunchList(self._queue, listed)
        # Under profile(): on the runtime's queue, from Python, each call returning its event.
        self._profiled_operations = LaunchList(self.runtime.queue, listed, native=False).calls
        self._described = [step[3] if step[0] == "launch" else None for step in steps]
        #: Buffer arguments a replay's enqueues pass (the driver's cost grows with them).
        self.kernel_arguments = sum(kernel.num_args for _, _, kernel in self._launches)
        self._checking_launches = sum(1 for _, source, _ in self._launches if source.checks_indices)
        self._loss_offset = self.arena.offset_of[loss_identity]
        self._loss_shape = tuple(loss.shape)
        self._loss_dtype = host_array(torch.empty(0, dtype=loss.dtype)).dtype
        self._loss_torch_dtype = loss.dtype
        self._updated = [(tensor, recorder.identities[index].buffer) for tensor, index in recorder.updated]
        self._synchronizations_seen = -1
        self._graph_calls_seen = -1
        #: Host seconds of the last replay's own work (the caller's checks, batch, seeds, enqueue
        #: loop), before it waits for the loss.
        self.last_host_seconds = 0.0
        #: Seconds of the last replay by phase: "guard" (the caller's checks), "batch" (batch and
        #: seeds in place), "enqueue" (the launch loop), "loss_read" (waits for the device: not host
        #: work), and "after" (the caller's bookkeeping once the loss is read; set by the caller).
        self.last_phases: dict[str, float] = dict.fromkeys(("guard", "batch", "enqueue", "loss_read", "after"), 0.0)
        self.loss_read_at = 0.0

    def _located(self, recorder: StepRecorder, index: int) -> tuple[cl.Buffer, int] | None:
        """Where identity ``index``'s bytes are as (slab, byte offset), if in a heap region (the
        arena, a persistent tensor's device copy); None for any other buffer (a batch bound in
        place, host memory shared in place, a graph output's pool block)."""
        if index in self.arena.offset_of:
            return self._arena_base, self._arena_start + self.arena.offset_of[index]
        identity = recorder.identities[index]
        return placement(identity.buffer) if identity.kind is PERSISTENT else None

    def _arena_kernels(self, recorder: StepRecorder) -> list[tuple[cl.Kernel, list[cl.Buffer] | None, set[int]]]:
        """A kernel object per launch of the recording, in order, with the slabs it takes first
        (None: bound as compiled) and the argument positions found in them. A rewritten kernel
        reaches each operand in a heap region (the arena, persistent tensors) at its constant
        offset in the region's slab, each slab one argument (the arena's first); the programs are
        built one per occurrence of a kernel symbol. A kernel reading images stays as it was compiled
        (its images are made over buffers, bound through sub-buffers of the arena)."""
        launches = [op for op in recorder.operations if isinstance(op, RecordedLaunch)]
        rewritten: list[Any] = []
        launch_bases: list[list[cl.Buffer] | None] = []
        launch_placed: list[set[int]] = []
        for op in launches:
            located = {position: where for position, index in enumerate(op.args)
                       if (where := self._located(recorder, index)) is not None}
            if op.source.images or not ARENA_KERNELS or not located:
                rewritten.append(None)
                launch_bases.append(None)
                launch_placed.append(set())
                continue
            bases, number = self._numbered_slabs([base for base, _ in located.values()])
            rewritten.append(place_in_arena(op.source, {p: at for p, (_, at) in located.items()},
                                            {p: number[id(base)] for p, (base, _) in located.items()}))
            launch_bases.append(bases)
            launch_placed.append(set(located))
        # A program holds each symbol (C function name) once. Symbols repeat where a graph runs
        # twice in a step, and where two graphs differ only in their number (a symbol drops it):
        # the n-th occurrence of a symbol goes into program n. (Names differ where symbols do.)
        programs: list[dict[str, Any]] = []
        occurrence: list[int] = []
        for source in rewritten:
            if source is None:
                occurrence.append(-1)
                continue
            index = next((i for i, program in enumerate(programs) if source.symbol not in program), len(programs))
            if index == len(programs):
                programs.append({})
            programs[index][source.symbol] = source
            occurrence.append(index)
        built = [build_kernels(self.runtime, list(program.values())) for program in programs]
        kernels: list[tuple[cl.Kernel, list[cl.Buffer] | None, set[int]]] = []
        for op, index, slabs, placed in zip(launches, occurrence, launch_bases, launch_placed, strict=True):
            # A kernel object of its own: its arguments are bound once and no other caller rebinds them.
            template = op.kernel if index < 0 else built[index][op.source.name]
            kernels.append((cl.Kernel(template.program, template.function_name), slabs, placed))
        return kernels

    def _numbered_slabs(self, slabs: list[cl.Buffer]) -> tuple[list[cl.Buffer], dict[int, int]]:
        """The distinct buffers of ``slabs`` in the order a kernel takes them (the arena's first, the
        others as they come), and each one's argument number by ``id``."""
        distinct = sorted({id(slab): slab for slab in slabs}.values(), key=lambda slab: slab is not self._arena_base)
        return distinct, {id(slab): n for n, slab in enumerate(distinct)}

    def _merged_copies(self, recorder: StepRecorder) -> dict[int, tuple[cl.Kernel, KernelSource] | None]:
        """Runs of two or more consecutive copies between heap regions (a graph call writing back
        the inputs it updated: batch norm's running statistics), each done by one kernel: by the
        position of a run's first copy, its kernel (bound) and source; the run's other positions
        map to None. A run ends before a copy whose bytes overlap a destination of the run, or
        whose destination overlaps a source (the copies of one kernel run in no order)."""
        if not (ARENA_KERNELS and MERGE_COPIES):
            return {}
        Placed = tuple[cl.Buffer, int]

        def overlaps(a: Placed, n: int, b: Placed, m: int) -> bool:
            return a[0] is b[0] and a[1] < b[1] + m and b[1] < a[1] + n

        runs: list[list[tuple[int, RecordedCopy, Placed, Placed]]] = [[]]
        for position, op in enumerate(recorder.operations):
            to = self._located(recorder, op.destination) if isinstance(op, RecordedCopy) else None
            of = self._located(recorder, op.source) if isinstance(op, RecordedCopy) else None
            if not isinstance(op, RecordedCopy) or to is None or of is None:
                runs.append([])
                continue
            if any(overlaps(to, op.nbytes, d, c.nbytes) or overlaps(to, op.nbytes, f, c.nbytes)
                   or overlaps(of, op.nbytes, d, c.nbytes) for _, c, d, f in runs[-1]):
                runs.append([])
            runs[-1].append((position, op, to, of))
        merged: dict[int, tuple[cl.Kernel, KernelSource] | None] = {}
        sources: list[tuple[list[Any], list[cl.Buffer], KernelSource]] = []
        for run in (r for r in runs if len(r) >= 2):
            slabs, number = self._numbered_slabs([b for _, _, d, f in run for b, _ in (d, f)])
            names = [f"{recorder.identities[c.destination].label} <- {recorder.identities[c.source].label}"
                     for _, c, _, _ in run]
            sources.append((run, slabs, copy_ranges(
                f"replay_copies_{len(sources)}",
                [(number[id(d[0])], d[1], number[id(f[0])], f[1], c.nbytes) for _, c, d, f in run], names)))
        built = build_kernels(self.runtime, [source for _, _, source in sources])
        for run, slabs, source in sources:
            kernel = cl.Kernel(built[source.name].program, built[source.name].function_name)
            for position, slab in enumerate(slabs):
                kernel.set_arg(position, slab)
            self._bases += [slab for slab in slabs if all(slab is not b for b in self._bases)]
            merged[run[0][0]] = (kernel, source)
            merged.update(dict.fromkeys((position for position, _, _, _ in run[1:]), None))
        return merged

    def _place(self, index: int, buffers: dict[int, cl.Buffer | None]) -> tuple[cl.Buffer, int]:
        """The buffer holding identity ``index`` and its byte offset there."""
        if index in self.arena.offset_of:
            return self._arena, self.arena.offset_of[index]
        buffer = buffers[index]
        if buffer is None:
            raise CaptureError("a batch argument bound in place is copied within the step")
        return buffer, 0

    def _buffer(self, index: int, buffers: dict[int, cl.Buffer | None]) -> cl.Buffer:
        """A buffer of identity ``index`` alone (a sub-buffer of the arena where it lives there)."""
        if index not in self.arena.offset_of:
            buffer = buffers[index]
            assert buffer is not None
            return buffer
        if index not in self._sub_buffers:
            nbytes = max(self._recorded_nbytes[index], 1)
            # (A sub-buffer of the slab: OpenCL makes none of a sub-buffer.)
            self._sub_buffers[index] = self._arena_base.get_sub_region(self._arena_start + self.arena.offset_of[index],
                                                                       nbytes)
        return self._sub_buffers[index]

    @property
    def kernel_launches(self) -> int:
        return len(self._launches)

    def _staging(self, nbytes: int) -> np.ndarray:
        """Pinned host memory of ``nbytes``: a host-allocated buffer mapped once. A write from it
        is a DMA the host does not wait for; one from pageable memory is staged by the driver."""
        buffer = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        flags: Any = cl.map_flags.WRITE | cl.map_flags.READ
        mapped: Any = cl.enqueue_map_buffer(self._queue, buffer, flags, 0,
                                            (nbytes,), np.dtype(np.uint8), is_blocking=True)
        self._staging_buffers.append(buffer)
        array: np.ndarray = mapped[0]
        if self._staging_maps is None:
            self._staging_maps = []
            # Unmapped when the replay goes (a recapture, an evicted geometry), not left to the
            # order in which the collector frees buffer and mapping.
            weakref.finalize(self, _unmap_all, self._staging_maps, self._queue)
        self._staging_maps.append(array.base)
        return array

    def _bind_batch(self, batch: tuple[Any, ...], queue: cl.CommandQueue, keep: list[Any]) -> None:
        record = BUS.active
        if self.batch_mode is IN_PLACE:
            bound: list[tuple[cl.Buffer, Any]] = []
            for binding in self._batch:
                tensor = batch[binding.position]
                view = tensor if binding.view is None else tensor.as_strided(*binding.view)
                # A buffer made over the memory as it is now (what a device caches of host memory
                # is defined at creation): nothing is copied on a unified-memory device. (This was
                # once turned off after crashes in long PoCL runs; their cause was the capture
                # taking a released buffer's reused handle for another identity, since fixed:
                # tests/test_replay.py's fresh-tensor, dropout and interleaved tests guard it.)
                buffer = shared_buffer(self.runtime, view)
                bound.append((buffer, view))
                for kernel, position in binding.consumers:
                    kernel.set_arg(position, buffer)
                if record:
                    BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", copied=False)
            self._bound_batch = bound  # the previous replay's buffers are released here, unused
            return
        if self._tail is not None:
            # Staged. The previous replay's upload has finished (its loss read waited for the queue).
            for binding in self._batch:
                if binding.staging is not None:
                    tensor = batch[binding.position]
                    array = host_array(tensor if binding.view is None else tensor.as_strided(*binding.view))
                    np.copyto(binding.staging, array.reshape(-1).view(np.uint8))
            for slot in self._seed_slots:
                # As the full path draws them (Executable), into the pinned bytes the write sends.
                torch.randint(0, 2**62, (), dtype=torch.int64, out=slot)
            written: cl.Event | None = _cl._enqueue_write_buffer(queue, self._arena, self._tail, self._tail_start,
                                                                 None, False)
            if record:
                for binding in self._batch:
                    BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", event=written)
                    written = None  # (the one write's time is reported once)
                for _ in self._seed_slots:
                    BUS.transfer(REPLAY_GRAPH, "h2d", 8, "seed", "input")
            return
        for binding in self._batch:
            tensor = batch[binding.position]
            array = host_array(tensor if binding.view is None else tensor.as_strided(*binding.view))
            keep.append(array)
            assert binding.buffer is not None  # not in place
            event = _cl._enqueue_write_buffer(queue, binding.buffer, array, binding.offset, None, False)
            if record:
                BUS.transfer(REPLAY_GRAPH, "h2d", binding.nbytes, binding.label, "input", event=event)

    def _upload_seeds(self, queue: cl.CommandQueue, keep: list[Any]) -> None:
        if self._tail is not None:
            return  # staged with the batch
        for offset in self._seeds:
            # As the full path draws them (Executable): torch.manual_seed(n) makes replays repeat too.
            seed = host_array(torch.randint(0, 2**62, (), dtype=torch.int64))
            keep.append(seed)
            _cl._enqueue_write_buffer(queue, self._arena, seed, offset, None, False)
            BUS.transfer(REPLAY_GRAPH, "h2d", seed.nbytes, "seed", "input")

    def _enqueue_all(self, profiled: bool) -> None:
        if not profiled:
            self._operations()
            return
        for operation, described in zip(self._profiled_operations, self._described, strict=True):
            event = operation()
            if described is not None:
                BUS.launch(LaunchRecord(described[0], described[1], event))

    def __call__(self, batch: tuple[Any, ...], started: float | None = None) -> torch.Tensor:
        """Run the step on ``batch`` (checked by the caller to match the capture's) and return the
        loss. ``started``: the ``time.perf_counter()`` at which the caller's own host work for this
        step began (its checks), counted in :attr:`last_host_seconds`."""
        start = time.perf_counter() if started is None else started
        keep: list[Any] = []
        bind_start = time.perf_counter()
        profiled = BUS.active  # profiling: the runtime's queue, whose events time each launch
        queue = self.runtime.queue if profiled else self._queue
        if not profiled and self.runtime.graph_calls != self._graph_calls_seen:
            # Graphs enqueued on the runtime's queue since the last replay (the compiled path, an
            # evaluation) may still be running: the replay's queue is not ordered after them.
            # (The residency's own copies are waited for where they are made.)
            self.runtime.queue.finish()
            self._graph_calls_seen = self.runtime.graph_calls
        self._bind_batch(batch, queue, keep)
        self._upload_seeds(queue, keep)
        enqueue_start = time.perf_counter()
        self._enqueue_all(profiled)
        index_errors = self.runtime.index_errors
        index_errors.launches += self._checking_launches
        index_check = index_errors.enqueue_read(queue)  # read in the loss's wait (None: nothing checked)
        end = time.perf_counter()
        self.last_host_seconds = end - start
        phases = self.last_phases
        phases["guard"], phases["batch"], phases["enqueue"] = bind_start - start, enqueue_start - bind_start, \
            end - enqueue_start
        loss = np.empty(self._loss_shape, dtype=self._loss_dtype)
        # Blocking, on the queue of the launches: when it returns, the whole step is done.
        _cl._enqueue_read_buffer(queue, self._arena, loss, self._loss_offset, None, True)
        #: When the loss was read: the caller counts its own work after it as "after".
        self.loss_read_at = time.perf_counter()
        phases["loss_read"] = self.loss_read_at - end
        BUS.transfer(REPLAY_GRAPH, "d2h", loss.nbytes, "loss", "output")
        self._defer_updates()
        if index_check is not None:
            index_errors.raise_if_set(queue)
        del keep  # the batch's memory and the seeds were in use until the blocking read above
        return torch.from_numpy(loss).view(self._loss_torch_dtype)  # (bfloat16 is read as its bits)

    def _defer_updates(self) -> None:
        """The updated tensors' current values are on the device: keep the residency's deferral
        records (made at capture, cleared by a synchronize) in place for the next sync point."""
        synchronizations = self.residency.synchronizations
        if synchronizations != self._synchronizations_seen:
            for tensor, buffer in self._updated:
                self.residency.defer(tensor, buffer)
            self._synchronizations_seen = synchronizations
