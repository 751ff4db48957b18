"""A replayed step that returns once its loss is on the host, while the device finishes the step.

The loss is the only value a step hands back, and it is computed early: after the forward and the
loss itself, the backward and the optimizer step still take most of the device's time. A replay
that waited for its last operation kept the device idle while the host did the next step's own
work (the guard, the batch copied into pinned memory, the enqueue) and while the batch crossed to
the device. Overlapped, a step:

1. writes its batch and seeds into a second device buffer, the *landing*, on a queue of its own
   (:meth:`~torch_adreno.replay.batch.BatchInput.land`), and has its step queue wait for the writes;
2. copies the landing into the arena with its first operation (on the step queue, so after every
   kernel of the previous step that reads the arena's copy), and reads the loss, without blocking,
   right after the last operation that uses the loss's memory, with the device's index error record
   where kernels before it check indices;
3. after its last operation, puts a marker on the step queue that the runtime's queue waits for
   (the compiled graphs, the residency's reads and writes of parameters, profiled steps and every
   other transfer of the package go there) and that another replay waits for before its own step
   (:func:`wait_for_other_replays`);
4. waits for the loss read alone, and returns.

Why the memory reused each step is free when the next step writes it: the landing and the pinned
staging memory were last read by the previous step's upload and landing copy, both ordered before
its loss read, which the previous call waited for; the arena's copy is rewritten on the step
queue, after the previous step's last kernel.

It applies (:func:`overlap_refusal`) where the batch is copied to the device (with zero-copy the
host reads the parameters in place, where the device is still writing them), where a recording in
the driver may be enqueued again while it still runs, and not under ``torch_adreno.profile()``.
Results are the same bits: the same operations run in the same order, and the landing copy puts
the same bytes in the same place.

Index errors: an out-of-range index met by a kernel up to the loss is raised by the step that met
it, as without overlap. One met by a kernel after the loss (the backward, the optimizer) stays in
the device's record until the next read of it: the next step's (which raises it) or a sync point's
(``synchronize()``, ``state_dict()``, the compiled graphs). Where the backward checks the indices
the forward checked (a target's gather and scatter, an embedding's lookup and its gradient: every
model here), the forward's check raises first, at the step that made the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from torch_adreno.replay.batch import BatchInput, BatchMode
from torch_adreno.replay.capture import RecordedLaunch, StepRecorder
from torch_adreno.replay.driver_recording import DriverRecording
from torch_adreno.replay.launch_list import Copy, Operation
from torch_adreno.replay.operations import BoundOperations
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.enqueue import read_buffer

__all__ = ["StepOverlap", "last_use", "overlap_refusal", "wait_for_other_replays"]


def overlap_refusal(wanted: bool, mode: BatchMode, zero_copy: bool,
                    recording: DriverRecording | None) -> str | None:
    """Why a replay waits for its whole step before returning; None where it may overlap."""
    if not wanted:
        return "off: replay_overlap=False"
    if mode is BatchMode.IN_PLACE or zero_copy:
        return "zero-copy: the host reads the parameters in place, where the device writes them"
    if recording is not None and recording.kind and not recording.reenqueue_while_running:
        return f"the driver's {recording.kind} may not be enqueued again while it still runs ({recording.detail})"
    return None


def last_use(recorder: StepRecorder, identity: int, covered: Sequence[tuple[int, ...]]) -> int | None:
    """The position in the launch list (``covered``: per operation, the recorded operations it
    does) of the last operation that reads or writes ``identity``; None where none does."""
    uses = {position for position, op in enumerate(recorder.operations)
            if identity in (op.args if isinstance(op, RecordedLaunch) else (op.destination, op.source))}
    listed = [index for index, positions in enumerate(covered) if uses.intersection(positions)]
    return listed[-1] if listed else None


def wait_for_other_replays(runtime: DeviceRuntime, queue: cl.CommandQueue) -> None:
    """Have ``queue`` wait for a step another replay left running on its own queue."""
    in_flight = runtime.replay_in_flight
    if in_flight is not None and in_flight[0] is not queue:
        cl.enqueue_barrier(queue, wait_for=[in_flight[1]])


def finished(runtime: DeviceRuntime) -> None:
    """A step waited for all of itself (and so for every step before it): none is in flight."""
    runtime.replay_in_flight = None


class StepOverlap:
    """The overlapped form of one replay's step (see the module docstring). ``loss_used_last``: the
    launch list's last operation that uses the loss; ``checks``: the launches that check indices
    up to it and after it."""

    @classmethod
    def of(cls, runtime: DeviceRuntime, batch_input: BatchInput, recorder: StepRecorder, loss_identity: int,
           bound: BoundOperations, loss_place: tuple[cl.Buffer, int], loss_shape: tuple[int, ...],
           loss_dtype: np.dtype[Any]) -> StepOverlap | None:
        """The overlapped form of the step ``bound`` holds (its loss identity ``loss_identity``, at
        ``loss_place``); None where no operation uses the loss."""
        loss_used_last = last_use(recorder, loss_identity, bound.covered)
        if loss_used_last is None:
            return None
        checks = [d is not None and d[1].checks_indices for d in bound.described]
        return cls(runtime, batch_input, loss_place, loss_shape, loss_dtype, loss_used_last,
                   (sum(checks[:loss_used_last + 1]), sum(checks[loss_used_last + 1:])))

    def __init__(self, runtime: DeviceRuntime, batch_input: BatchInput, loss_place: tuple[cl.Buffer, int],
                 loss_shape: tuple[int, ...], loss_dtype: np.dtype[Any], loss_used_last: int,
                 checks: tuple[int, int]) -> None:
        self._runtime = runtime
        #: The queue the batch and seeds go up on, beside the step queue.
        self.upload_queue = cl.CommandQueue(runtime.context)
        landed = batch_input.land(self.upload_queue)
        #: The landing copy, the step's first operation (none where nothing lands).
        self.head: list[Operation] = [] if landed is None else [Copy(landed[0], batch_input.arena, 0, landed[1],
                                                                     landed[2])]
        self._loss_buffer, self._loss_offset = loss_place
        self._loss_shape, self._loss_dtype = loss_shape, loss_dtype
        self._loss_used_last = loss_used_last
        self._checks_before, self._checks_after = checks
        self._loss: np.ndarray | None = None
        self._read: cl.Event | None = None
        self._index_read: cl.Event | None = None
        self._queue: cl.CommandQueue | None = None

    def operations(self, listed: Sequence[Operation]) -> list[Operation]:
        """``listed`` with the landing copy first and the loss read (and the index record's) after
        the last operation that uses the loss."""
        at = self._loss_used_last + 1
        return [*self.head, *listed[:at], self._read_loss, *listed[at:]]

    def _read_loss(self, queue: cl.CommandQueue) -> None:
        self._queue = queue
        self._loss = np.empty(self._loss_shape, dtype=self._loss_dtype)
        self._read = read_buffer(queue, self._loss_buffer, self._loss, self._loss_offset, blocking=False)
        index_errors = self._runtime.index_errors
        index_errors.launches += self._checks_before
        self._index_read = index_errors.enqueue_read(queue)
        index_errors.launches += self._checks_after  # (read by the next step, or at a sync point)

    def leave_running(self, queue: cl.CommandQueue) -> None:
        """After the step's last operation: the runtime's queue and the other replays wait for it;
        the device is handed what is enqueued."""
        end = cl.enqueue_marker(queue)
        cl.enqueue_barrier(self._runtime.queue, wait_for=[end])
        self._runtime.replay_in_flight = (queue, end)
        queue.flush()

    def loss(self) -> np.ndarray:
        """The loss once read (the one wait of an overlapped step)."""
        assert self._read is not None and self._loss is not None, "the step's operations were not enqueued"
        self._read.wait()
        loss, self._loss, self._read = self._loss, None, None
        return loss

    def check_indices(self) -> None:
        """Raise an index error the kernels up to the loss met (read with the loss)."""
        read, self._index_read = self._index_read, None
        if read is not None:
            read.wait()
            assert self._queue is not None
            self._runtime.index_errors.raise_if_set(self._queue)
