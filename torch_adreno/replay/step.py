"""A recorded training step, replayed: one launch list over buffers fixed at capture.

Built from a :class:`~torch_adreno.replay.capture.StepRecorder` that watched one whole step
(forward, backward, optimizer). Every kernel of the step gets its own kernel object with every
argument bound once; memory made during the step (arena slots, saved activations, gradients,
scratch, the loss) is laid out anew by one memory plan spanning the whole step, so a saved
activation's bytes are free after its last backward read and a gradient's after the optimizer's;
persistent tensors (parameters, optimizer state) keep the residency's buffers. The step's own
memory, its seeds and (where copied) its batch live in one buffer, the arena (:class:`ArenaLayout`;
several buffers where one would exceed the largest allocation of the device or target, each then
an argument of its own), and the kernels are rebuilt to take it as one argument and find those
operands at offsets passed as ``int`` arguments, bound once (:mod:`torch_adreno.kernels.arena_params`:
the kernels of repeated blocks are then one function, built once): a driver's enqueue costs time
per buffer argument (``docs/design/replay.md`` has NVIDIA's figure), and a step passes far fewer
buffer arguments so. A replay then:

1. puts the batch in place: on a unified-memory device with zero-copy, binds each new batch's host
   memory to the kernels that read it (a host-pointer buffer made over it, nothing copied; not
   where the list is recorded in the driver, which keeps arguments as recorded: then it is
   uploaded); on a device with memory of its own, copies it into pinned staging memory mapped once
   and uploads that asynchronously, with the step's seeds, in one write (a driver stages pageable
   memory itself, synchronously, and charges each write's enqueue); else (zero-copy off on unified
   memory) uploads it from its own memory;
2. draws fresh random seeds from torch's default generator in the capture's order (staged: into
   the same write);
3. enqueues the launches: the list recorded once into a ``cl_khr_command_buffer`` where the device
   offers one (:mod:`.driver_recording`), else in one C loop with nothing in it but the enqueue
   (with ``fill_uninitialized_memory``, fills of the step's memory before its first writes among
   them);
4. reads the loss (the one wait of the step): with the batch copied and not zero-copy, right after
   the loss is computed, the device running the backward and optimizer on after the call returns
   while the next batch lands in a second buffer (:mod:`.overlap`); else after the whole step.

Before it allocates anything, a replay holds its device footprint (persistent state, arena,
images, the compiled graphs' arenas: :attr:`ReplayedStep.footprint`) to the global memory and
largest allocation of its limits (:class:`ReplayOptions`), refusing with a
:class:`~torch_adreno.errors.DeviceMemoryError` that says what would make it fit.

No Dynamo, AOTAutograd wrapper or autograd engine runs. What a replay assumes (the same batch
geometry, the same tensors, hyperparameters, modes) is checked by its owner before each call
(:mod:`torch_adreno.replay.guards`). The enqueue is :meth:`ReplayedStep._enqueue_all`, over a
:class:`~torch_adreno.replay.launch_list.LaunchList` (recorded in the driver or not; profiled calls
enqueue launch by launch, each with its event). The parts: :mod:`.batch` (the batch and seeds),
:mod:`.buffers` (where identities live), :mod:`.arena_kernels` (the kernels rebuilt for the arena),
:mod:`.operations` (the operations, arguments bound), :mod:`.overlap` (the early return).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.memory.footprint import MemoryLimits
from torch_adreno.replay.arena_kernels import (
    MergedCopies,
    arena_kernels,
    merged_copies,
)
from torch_adreno.replay.batch import REPLAY_GRAPH, BatchInput, BatchMode, batch_mode
from torch_adreno.replay.buffers import StepBuffers
from torch_adreno.replay.capture import (
    INTERNAL,
    PERSISTENT,
    RecordedLaunch,
    StepRecorder,
    recording_of,
)
from torch_adreno.replay.captured import CapturedForward, CapturedStep, captured_step
from torch_adreno.replay.driver_recording import DriverRecording
from torch_adreno.replay.inputs import ScalarInputs
from torch_adreno.replay.launch_list import LaunchList
from torch_adreno.replay.memory import (
    arena_layout,
    plan_step_memory,
    step_fills,
    step_footprint,
    verify_step_memory,
)
from torch_adreno.replay.operations import CaptureError, bind_operations
from torch_adreno.replay.overlap import StepOverlap, finished, overlap_refusal, wait_for_other_replays
from torch_adreno.runtime.enqueue import read_buffer
from torch_adreno.runtime.events import BUS, LaunchRecord
from torch_adreno.runtime.residency import Residency, host_array

__all__ = ["REPLAY_GRAPH", "BatchMode", "CaptureError", "ReplayOptions", "ReplayedStep"]

class ReplayOptions:
    """How a replay is built (from :class:`~torch_adreno.config.Config`): ``arena_kernels``
    rebuilds the kernels to take the arena as one argument (False binds them as compiled, to
    sub-buffers of the arena: benchmarks/replay.py measures both, tests check they agree bit for
    bit); ``merge_copies`` does runs of copies between heap regions with one kernel each;
    ``verify_memory`` proves the arena layout against the recorded operations first
    (:func:`verify_step_memory`); ``share_memory`` False gives every identity made during the step
    memory of its own; ``limits``: the largest allocation and global memory the replay
    is held to (a target's; None: the present device's); ``fill_uninitialized_memory``: the launch
    list fills each internal identity's bytes where the recording's fills say (before its first
    use, and a graph's slot again before each buffer it holds in turn), so that a read of memory
    nothing wrote in this step shows as NaN or an index error; ``recording``: how the driver records
    the launch list (:func:`~torch_adreno.replay.driver_recording.driver_recording`; None, or one
    of kind None: the C loop enqueues it operation by operation); ``overlap``: return once the loss
    is read where that applies (:mod:`torch_adreno.replay.overlap`)."""

    def __init__(self, arena_kernels: bool = True, merge_copies: bool = True, verify_memory: bool = False,
                 limits: MemoryLimits | None = None, share_memory: bool = True,
                 fill_uninitialized_memory: bool = False, recording: DriverRecording | None = None,
                 overlap: bool = False) -> None:
        self.arena_kernels = arena_kernels
        self.merge_copies = merge_copies
        self.verify_memory = verify_memory
        self.limits = limits
        #: False: every identity made during the step gets memory of its own (a reference replay).
        self.share_memory = share_memory
        self.fill_uninitialized_memory = fill_uninitialized_memory
        self.recording = recording if recording is not None and recording.kind else None
        self.overlap = overlap


class ReplayedStep:
    """One recorded step as a static list of device operations (see the module docstring)."""

    def __init__(self, recorder: StepRecorder, loss: torch.Tensor, residency: Residency,
                 heap_group: Hashable = None, options: ReplayOptions | None = None,
                 inputs: Sequence[torch.Tensor] = ()) -> None:
        """``heap_group``: the device heap group of the step's persistent tensors (the arena joins
        their slab, so that most kernels take one slab argument). ``inputs``: host tensors that are
        the step's scalar inputs (tensor hyperparameters): those the step reads and does not update
        are uploaded by a replay whenever their version moved (:attr:`scalar_inputs`)."""
        options = options or ReplayOptions()
        if recorder.unsupported is not None:
            raise CaptureError(recorder.unsupported)
        loss_identity = recorder.output_identity(loss)
        if loss_identity is None or recorder.identities[loss_identity].kind is not INTERNAL:
            raise CaptureError("the loss is not an output a graph of the step wrote on the device")
        self.runtime = recorder.runtime
        self.residency = residency
        self.graphs = tuple(recorder.graphs)
        self.memory = plan_step_memory(recorder, {loss_identity}, options.share_memory)
        #: The recorded step without its internal buffers (what an export translates).
        self.recording = recording_of(recorder, loss_identity)
        # A queue of the replay's own, without profiling: some drivers take twice as long to enqueue
        # on a profiling queue (NVIDIA's does). Under profile() the runtime's queue is used.
        self._queue = cl.CommandQueue(self.runtime.context)
        images = any(isinstance(op, RecordedLaunch) and op.source.images for op in recorder.operations)
        #: How the batch is put in place: in place, staged or uploaded (see :mod:`.batch`).
        self.batch_mode = batch_mode(residency.zero_copy, self.runtime.profile.unified_memory)
        if self.batch_mode is BatchMode.IN_PLACE and (images or options.recording is not None):
            # An image is made over a buffer once, at binding, and a recording in the driver keeps
            # the kernel arguments it was recorded with: a batch bound anew each step would need new
            # images, or a new recording, each step, so it goes into the replay's own memory instead.
            self.batch_mode = BatchMode.UPLOADED
        limits = options.limits or MemoryLimits.of(self.runtime.profile)
        # The memory made during the step, the seeds and the batch's own copy live in the arena, each at
        # a fixed offset (internal identities at their slot's) of one of its buffers, each within the limit.
        self.arena = arena_layout(recorder, self.memory, self.batch_mode is not BatchMode.IN_PLACE,
                                  self.runtime.device.mem_base_addr_align // 8, limits)
        if options.verify_memory:
            verify_step_memory(recorder, self.arena, {loss_identity})
        #: The device memory the step holds, held to ``limits`` before the arena is (images: once bound).
        self.footprint = step_footprint(recorder, self.arena, [], limits, residency.name_of)
        self._buffers = StepBuffers(self.runtime, recorder, self.arena,
                                    options.arena_kernels and not residency.zero_copy and not images, heap_group)
        self._arena = self._buffers.arenas[0]
        bindings = self._buffers.batch_bindings(recorder, self.batch_mode is BatchMode.IN_PLACE)
        # Seeds and batch share one arena buffer and one write; valid_for prestages through it.
        self.batch_input = BatchInput(self.runtime, self._queue, self.batch_mode, list(bindings.values()),
                                      self._buffers.arenas[self.arena.inputs_part], [self.arena.offset_of[i] for i in recorder.seeds])
        # A kernel argument holds no reference to its buffer: the residency may drop its entry for
        # a persistent tensor (evicted, replaced) while this replay's kernels still point at the
        # buffer, which must then stay alive (a released one faults at the next enqueue), with the
        # host memory under it (zero-copy).
        self._persistent = [(i.buffer, i.tensor) for i in recorder.identities if i.kind is PERSISTENT]
        self._scalar_inputs = ScalarInputs(recorder.identities, {index for _, index in recorder.updated}, inputs,
                                           residency, REPLAY_GRAPH)
        kernels = arena_kernels(self.runtime, recorder, self._buffers.located, self._buffers.slabs,
                                options.arena_kernels)
        #: Per launch, whether its kernel was rewritten to take the arenas (else bound as compiled).
        self._rewritten = [k.slabs is not None for k in kernels]
        copies = (merged_copies(self.runtime, recorder, self._buffers.located, self._buffers.slabs)
                  if options.arena_kernels and options.merge_copies else MergedCopies({}, []))
        #: The slabs the kernels take (a kernel argument holds no reference).
        self._bases = list({id(b): b for k in kernels for b in k.slabs or ()}.values())
        self._bases += [slab for slab in copies.slabs if all(slab is not b for b in self._bases)]
        fills = step_fills(recorder, self.memory) if options.fill_uninitialized_memory else {}
        bound = bind_operations(self.runtime, recorder, self._buffers, kernels, copies, bindings, fills)
        listed, described, covered = bound.listed, bound.described, bound.covered
        #: Per launch: its graph, source and kernel object; and its offset arguments (ints).
        self._launches, self._offset_arguments = bound.launches, bound.offset_arguments
        #: The images the kernels read (a kernel argument holds no reference).
        self._images = bound.images
        #: Per operation of the launch list, the positions of the recorded operations it does.
        self.covered = covered
        own_images = {id(image.image): image.nbytes for image in self._images if not image.shared}
        self.footprint = step_footprint(recorder, self.arena, list(own_images.values()), limits, residency.name_of)
        self._checking_launches = sum(1 for _, source, _ in self._launches if source.checks_indices)
        self._loss_buffer, self._loss_offset = self._buffers.place(loss_identity)
        self._loss_shape = tuple(loss.shape)
        self._loss_dtype = host_array(torch.empty(0, dtype=loss.dtype)).dtype
        refused = overlap_refusal(options.overlap, self.batch_mode, residency.zero_copy, options.recording)
        self._overlap = None if refused else StepOverlap.of(self.runtime, self.batch_input, recorder, loss_identity, bound,
                                                            (self._loss_buffer, self._loss_offset), self._loss_shape,
                                                            self._loss_dtype)
        #: Why a call waits for all of its step before returning (None: it returns once the loss
        #: is read, the device finishing the step: :mod:`.overlap`).
        self.overlap_refused = refused or (None if self._overlap else "no operation of the step uses the loss")
        #: The step's device operations on the replay's own queue (recorded in the driver, or the C
        #: loop, where available).
        self._operations = LaunchList(self._queue, self._overlap.operations(listed) if self._overlap else listed,
                                      recording=options.recording)
        # Under profile(): on the runtime's queue, from Python, each call returning its event.
        self._profiled_operations = LaunchList(self.runtime.queue, listed, native=False).calls
        #: Per operation, the (graph, kernel source) a profile reports for it (None: a copy, a flush).
        self._described = described
        #: A replay's enqueues' arguments but the arena offsets (an ``int`` each): the buffers, mostly.
        self.offset_arguments = sum(self._offset_arguments)
        self.kernel_arguments = sum(kernel.num_args for _, _, kernel in self._launches) - self.offset_arguments
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

    @property
    def kernel_launches(self) -> int:
        return len(self._launches)

    def captured(self, state_names: Mapping[int, str] | None = None,
                 forward: CapturedForward | None = None) -> CapturedStep:
        """This step frozen for export, with a copy of the state's values (host copies current:
        synchronize first); ``state_names``: export names by ``id`` of the persistent tensors;
        ``forward``: a model's forward to export with it (:mod:`torch_adreno.replay.captured`)."""
        return captured_step(self.recording, self.memory, (self._loss_shape, self._loss_torch_dtype),
                             self.scalar_inputs, self.residency, state_names, forward)

    def _enqueue_all(self, profiled: bool) -> None:
        if not profiled:
            self._operations()
            return
        for operation, described in zip(self._profiled_operations, self._described, strict=True):
            event = operation()
            if described is not None:
                BUS.launch(LaunchRecord(described[0], described[1], event, self.runtime.entry.label))

    @property
    def enqueue_path(self) -> str:
        """How an unprofiled call enqueues the step, and whether it returns before the device is
        done: e.g. ``command buffer (cl_khr_command_buffer 1.0.0): 2 calls per step for 506
        operations; returns once the loss is read``. (Profiled calls enqueue launch by launch.)"""
        overlap = ("returns once the loss is read" if self._overlap is not None
                   else f"waits for the whole step ({self.overlap_refused})")
        return f"{self._operations.describe()}; {overlap}"

    def __call__(self, batch: tuple[Any, ...], started: float | None = None) -> torch.Tensor:
        """Run the step on ``batch`` (checked by the caller to match the capture's) and return the
        loss. ``started``: the ``time.perf_counter()`` at which the caller's own host work for this
        step began (its checks), counted in :attr:`last_host_seconds`. Overlapped (:attr:`enqueue_path`),
        the device may still run the step's backward and optimizer when this returns."""
        start = time.perf_counter() if started is None else started
        keep: list[Any] = []
        bind_start = time.perf_counter()
        profiled = BUS.active  # profiling: the runtime's queue, whose events time each launch
        queue = self.runtime.queue if profiled else self._queue
        overlap = None if profiled else self._overlap
        if not profiled:
            if self.runtime.graph_calls != self._graph_calls_seen:
                # Graphs enqueued on the runtime's queue since the last replay (the compiled path, an
                # evaluation) may still be running: the replay's queue is not ordered after them.
                # (The residency's own copies are waited for where they are made.)
                self.runtime.queue.finish()
                self._graph_calls_seen = self.runtime.graph_calls
            wait_for_other_replays(self.runtime, queue)
        self.batch_input.bind(batch, queue, keep, landing=overlap is not None)
        self.batch_input.upload_seeds(queue, keep, landing=overlap is not None)
        if overlap is not None:
            self.batch_input.wait_for_landing(queue)
        self._scalar_inputs.upload(queue, keep)
        enqueue_start = time.perf_counter()
        self._enqueue_all(profiled)
        index_errors = self.runtime.index_errors
        index_check = None
        if overlap is not None:
            overlap.leave_running(queue)  # (the index record is read with the loss)
        else:
            index_errors.launches += self._checking_launches
            index_check = index_errors.enqueue_read(queue)  # read in the loss's wait (None: nothing checked)
        end = time.perf_counter()
        self.last_host_seconds = end - start
        phases = self.last_phases
        phases["guard"], phases["batch"], phases["enqueue"] = bind_start - start, enqueue_start - bind_start, \
            end - enqueue_start
        if overlap is not None:
            loss = overlap.loss()  # read after the loss's last use, while the device runs on
        else:
            loss = np.empty(self._loss_shape, dtype=self._loss_dtype)
            # Blocking, on the queue of the launches: when it returns, the whole step is done.
            read_buffer(queue, self._loss_buffer, loss, self._loss_offset, blocking=True)
            finished(self.runtime)
        #: When the loss was read: the caller counts its own work after it as "after".
        self.loss_read_at = time.perf_counter()
        phases["loss_read"] = self.loss_read_at - end
        BUS.transfer(REPLAY_GRAPH, "d2h", loss.nbytes, "loss", "output")
        self._defer_updates()
        if overlap is not None:
            overlap.check_indices()
        elif index_check is not None:
            index_errors.raise_if_set(queue)
        del keep  # the batch's memory and the seeds were in use until the loss was read
        return torch.from_numpy(loss).view(self._loss_torch_dtype)  # (bfloat16 is read as its bits)

    def run_stepwise(self, batch: tuple[Any, ...], after: Callable[[tuple[int, ...]], None]) -> torch.Tensor:
        """Run the step on ``batch`` as :meth:`__call__` does, one operation at a time on the
        runtime's queue, calling ``after(positions)`` once each has finished, with the positions
        of the recorded operations it did (:attr:`covered`); returns the loss. For checking a
        replay against a reference (:mod:`torch_adreno.replay.verify`), not for speed."""
        keep: list[Any] = []
        queue = self.runtime.queue
        self.runtime.queue.finish()
        self.batch_input.bind(batch, queue, keep)
        self.batch_input.upload_seeds(queue, keep)
        self._scalar_inputs.upload(queue, keep)
        for operation, positions in zip(self._profiled_operations, self.covered, strict=True):
            operation()
            queue.finish()
            if positions:
                after(positions)
        loss = np.empty(self._loss_shape, dtype=self._loss_dtype)
        read_buffer(queue, self._loss_buffer, loss, self._loss_offset, blocking=True)
        self._defer_updates()
        del keep
        return torch.from_numpy(loss).view(self._loss_torch_dtype)

    def identity_bytes(self, index: int) -> np.ndarray:
        """The bytes identity ``index`` holds now (where this replay keeps it), read blocking."""
        buffer, offset = self._buffers.place(index)
        data = np.empty(self.recording.identities[index].nbytes, dtype=np.uint8)
        if data.size:
            read_buffer(self.runtime.queue, buffer, data, offset, blocking=True)
        return data

    def write_identity(self, index: int, data: np.ndarray) -> None:
        """Put ``data`` (as :meth:`identity_bytes` read it) back into identity ``index``, blocking."""
        buffer, offset = self._buffers.place(index)
        if data.size:
            cl.enqueue_copy(self.runtime.queue, buffer, data, dst_offset=offset, is_blocking=True)

    @property
    def scalar_inputs(self) -> list[torch.Tensor]:
        """The host tensors each replay uploads when their version moved (a schedule's learning rate)."""
        return self._scalar_inputs.tensors

    def _defer_updates(self) -> None:
        """The updated tensors' current values are on the device: keep the residency's deferral
        records (made at capture, cleared by a synchronize) in place for the next sync point."""
        synchronizations = self.residency.synchronizations
        if synchronizations != self._synchronizations_seen:
            for tensor, buffer in self._updated:
                self.residency.defer(tensor, buffer)
            self._synchronizations_seen = synchronizations
