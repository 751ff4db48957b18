"""A replayed step's launch lists (:class:`StepLaunches`): its bound operations as one
:class:`~torch_adreno.replay.launch_list.LaunchList` on the replay's own queue (recorded in the
driver, or the C loop, where available), overlapped where that applies (:mod:`.overlap`: the
landing copy first, the loss read right after its last use), and as Python calls on the runtime's
queue for profiled and stepwise runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from torch_adreno.replay.batch import BatchMode
from torch_adreno.replay.bound_step import BoundStep
from torch_adreno.replay.capture import StepRecorder
from torch_adreno.replay.launch_list import LaunchList
from torch_adreno.replay.options import ReplayOptions
from torch_adreno.replay.overlap import StepOverlap, overlap_refusal
from torch_adreno.runtime.events import BUS, LaunchRecord

__all__ = ["StepLaunches", "step_launches"]


@dataclass(frozen=True)
class StepLaunches:
    """How a replay enqueues its step. Invariant: ``operations`` (less the overlap's landing copy
    and loss read) and ``profiled`` do the same operations in the same order."""

    #: The step's device operations on the replay's own queue (recorded in the driver, or the C
    #: loop, where available), with the overlap's where it applies.
    operations: LaunchList
    #: Under profile(): on the runtime's queue, from Python, each call returning its event.
    profiled: list[Callable[[], Any]]
    #: Per operation, the (graph, kernel source) a profile reports for it (None: a copy, a flush).
    described: list[tuple[str, Any] | None]
    #: The overlapped form of the step (None: a call waits for all of its step).
    overlap: StepOverlap | None
    #: Why a call waits for all of its step before returning (None: it returns once the loss is
    #: read, the device finishing the step: :mod:`.overlap`).
    overlap_refused: str | None

    def enqueue_profiled(self, label: str) -> None:
        """The step from Python, operation by operation (:attr:`profiled`), each launch reported
        to a profile with its event (``label``: the runtime's entry)."""
        for operation, described in zip(self.profiled, self.described, strict=True):
            event = operation()
            if described is not None:
                BUS.launch(LaunchRecord(described[0], described[1], event, label))


def step_launches(recorder: StepRecorder, queue: cl.CommandQueue, bound: BoundStep, mode: BatchMode, zero_copy: bool,
                  loss_identity: int, loss_shape: tuple[int, ...], loss_dtype: np.dtype[Any],
                  options: ReplayOptions) -> StepLaunches:
    """``bound``'s operations listed for ``queue`` (the replay's own), the batch put in place by
    ``mode``; overlapped where ``options.overlap`` asks and it applies
    (:func:`~torch_adreno.replay.overlap.overlap_refusal`), the loss (``loss_identity``, of
    ``loss_shape`` and ``loss_dtype``) then read right after its last use."""
    runtime = recorder.runtime
    listed = bound.operations.listed
    refused = overlap_refusal(options.overlap, mode, zero_copy, options.recording)
    overlap = None if refused else StepOverlap.of(runtime, bound.batch_input, recorder, loss_identity,
                                                  bound.operations, bound.buffers.place(loss_identity), loss_shape,
                                                  loss_dtype)
    return StepLaunches(
        LaunchList(queue, overlap.operations(listed) if overlap else listed, recording=options.recording),
        LaunchList(runtime.queue, listed, native=False).calls, bound.operations.described, overlap,
        refused or (None if overlap else "no operation of the step uses the loss"))
