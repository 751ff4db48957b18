"""A replay's host tensors: its scalar inputs (:class:`ScalarInputs`: a learning rate, Adam's
betas), which the step reads and does not update, uploaded before a replay whenever the host changed
them since the device got them (a schedule's new value), instead of the step being captured again;
and the tensors it updates (:class:`UpdatedTensors`), whose values stay on the device until a sync
point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import torch

from torch_adreno.replay.capture import PERSISTENT, StepRecorder
from torch_adreno.runtime.residency import Residency


@dataclass
class _ScalarInput:
    tensor: torch.Tensor
    buffer: Any
    #: The version of ``tensor`` whose value the device holds.
    version: int


class ScalarInputs:
    """The persistent identities of ``recorder``'s step whose tensor is one of ``inputs`` and not
    updated by the step (uploaded as ``graph``'s transfers)."""

    def __init__(self, recorder: StepRecorder, inputs: Sequence[torch.Tensor], residency: Residency,
                 graph: str) -> None:
        wanted = {id(t) for t in inputs}
        updated = {index for _, index in recorder.updated}
        self._entries = [_ScalarInput(i.tensor, i.buffer, int(i.tensor._version)) for i in recorder.identities
                         if i.kind is PERSISTENT and i.tensor is not None and id(i.tensor) in wanted
                         and i.index not in updated]
        self._residency = residency
        self._graph = graph

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [entry.tensor for entry in self._entries]

    def upload(self, queue: cl.CommandQueue, keep: list[Any]) -> None:
        """Each changed input's value into its device buffer, on ``queue`` before what is enqueued
        there next; the host memory a copy reads goes into ``keep`` (alive until the queue drains)."""
        for entry in self._entries:
            if entry.tensor._version != entry.version:
                entry.version = entry.tensor._version
                kept = self._residency.refresh(entry.tensor, entry.buffer, queue, self._graph)
                if kept is not None:
                    keep.append(kept)


class UpdatedTensors:
    """The tensors ``recorder``'s step updates (parameters, optimizer state), with the device
    buffers that hold their current values after a replay."""

    def __init__(self, recorder: StepRecorder, residency: Residency) -> None:
        self._updated = [(tensor, recorder.identities[index].buffer) for tensor, index in recorder.updated]
        self._residency = residency
        self._synchronizations_seen = -1

    def defer(self) -> None:
        """The updated tensors' current values are on the device: keep the residency's deferral
        records (made at capture, cleared by a synchronize) in place for the next sync point."""
        synchronizations = self._residency.synchronizations
        if synchronizations != self._synchronizations_seen:
            for tensor, buffer in self._updated:
                self._residency.defer(tensor, buffer)
            self._synchronizations_seen = synchronizations
