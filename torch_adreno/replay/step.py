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
enqueue launch by launch, each with its event). A replay is built in three stages, each a value
the next reads: :mod:`.step_memory` (the memory planned, laid out in the arena and held to the
limits, before anything is allocated), :mod:`.bound_step` (the arena allocated, the batch input
made, the kernels rebuilt, every argument bound) and :mod:`.step_launches` (the launch lists, with
the overlap). Their parts: :mod:`.batch` (the batch and seeds), :mod:`.buffers` (where identities
live), :mod:`.arena_kernels` (the kernels rebuilt for the arena), :mod:`.operations` (the
operations, arguments bound), :mod:`.overlap` (the early return). :class:`ReplayOptions`
(:mod:`.options`) says how.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.replay.batch import REPLAY_GRAPH, BatchMode
from torch_adreno.replay.bound_step import bind_step, step_batch_mode
from torch_adreno.replay.capture import INTERNAL, StepRecorder, recording_of
from torch_adreno.replay.captured import CapturedForward, CapturedStep, captured_step
from torch_adreno.replay.inputs import ScalarInputs, UpdatedTensors
from torch_adreno.replay.operations import CaptureError
from torch_adreno.replay.options import ReplayOptions
from torch_adreno.replay.overlap import finished, wait_for_other_replays
from torch_adreno.replay.step_launches import step_launches
from torch_adreno.replay.step_memory import step_memory
from torch_adreno.runtime.enqueue import read_buffer
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.residency import Residency, host_array

__all__ = ["REPLAY_GRAPH", "BatchMode", "CaptureError", "ReplayOptions", "ReplayedStep"]


def _replayable_loss(recorder: StepRecorder, loss: torch.Tensor) -> int:
    """The identity of ``loss`` in ``recorder``'s step; a :class:`CaptureError` where the step
    cannot be replayed (the recorder met something it cannot replay, or the loss is not memory a
    graph of the step wrote on the device)."""
    if recorder.unsupported is not None:
        raise CaptureError(recorder.unsupported)
    loss_identity = recorder.output_identity(loss)
    if loss_identity is None or recorder.identities[loss_identity].kind is not INTERNAL:
        raise CaptureError("the loss is not an output a graph of the step wrote on the device")
    return loss_identity


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
        loss_identity = _replayable_loss(recorder, loss)
        self.runtime, self.residency, self.graphs = recorder.runtime, residency, tuple(recorder.graphs)
        #: The recorded step without its internal buffers (what an export translates).
        self.recording = recording_of(recorder, loss_identity)
        # A queue of the replay's own, without profiling: some drivers take twice as long to enqueue
        # on a profiling queue (NVIDIA's does). Under profile() the runtime's queue is used.
        self._queue = cl.CommandQueue(self.runtime.context)
        #: How the batch is put in place: in place, staged or uploaded (see :mod:`.batch`).
        self.batch_mode = step_batch_mode(recorder, residency.zero_copy, options)
        planned = step_memory(recorder, loss_identity, self.batch_mode, residency.name_of, options)
        #: The step's memory plan and where its memory lies in the arena (:mod:`.step_memory`).
        self.memory, self.arena = planned.plan, planned.arena
        bound = self._bound = bind_step(recorder, planned, residency, heap_group, self.batch_mode, self._queue, options)
        #: The device memory the step holds (held to the limits before the arena was made, images included).
        self.footprint, self.batch_input, self._buffers = bound.footprint, bound.batch_input, bound.buffers
        #: Per launch: graph, source, kernel object; per listed operation: the recorded ones it does.
        self._launches, self.covered = bound.operations.launches, bound.operations.covered
        self._scalar_inputs = ScalarInputs(recorder, inputs, residency, REPLAY_GRAPH)
        self._loss_buffer, self._loss_offset = self._buffers.place(loss_identity)
        self._loss_shape, self._loss_torch_dtype = tuple(loss.shape), loss.dtype
        self._loss_dtype = host_array(torch.empty(0, dtype=loss.dtype)).dtype
        launches = self._launch_lists = step_launches(recorder, self._queue, bound, self.batch_mode, residency.zero_copy,
                                                      loss_identity, self._loss_shape, self._loss_dtype, options)
        #: Why a call waits for all of its step before returning (:attr:`StepLaunches.overlap_refused`).
        self._overlap, self.overlap_refused = launches.overlap, launches.overlap_refused
        self._operations, self._profiled_operations = launches.operations, launches.profiled
        #: A replay's enqueues' arena offsets (an ``int`` each), and its other arguments (the buffers, mostly).
        self.offset_arguments, self.kernel_arguments = bound.offset_arguments, bound.kernel_arguments
        self._checking_launches, self._graph_calls_seen = bound.checking_launches, -1
        self._updates = UpdatedTensors(recorder, residency)
        #: Host seconds of the last replay's own work (the caller's checks, batch, seeds, enqueue
        #: loop), before it waits for the loss.
        self.last_host_seconds = self.loss_read_at = 0.0
        #: Seconds of the last replay by phase: "guard" (the caller's checks), "batch" (batch and
        #: seeds in place), "enqueue" (the launch loop), "loss_read" (waits for the device: not host
        #: work), and "after" (the caller's bookkeeping once the loss is read; set by the caller).
        self.last_phases: dict[str, float] = dict.fromkeys(("guard", "batch", "enqueue", "loss_read", "after"), 0.0)

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
        if profiled:
            self._launch_lists.enqueue_profiled(self.runtime.entry.label)
        else:
            self._operations()

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
        """The updated tensors' current values are on the device (:meth:`UpdatedTensors.defer`)."""
        self._updates.defer()
