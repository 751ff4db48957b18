"""A replay's scalar inputs: host tensors (a learning rate, Adam's betas) the step reads and does not
update, uploaded before a replay whenever the host changed them since the device got them (a
schedule's new value), instead of the step being captured again."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import torch

from torch_adreno.replay.capture import PERSISTENT, MemoryIdentity
from torch_adreno.runtime.residency import Residency


@dataclass
class _ScalarInput:
    tensor: torch.Tensor
    buffer: Any
    #: The version of ``tensor`` whose value the device holds.
    version: int


class ScalarInputs:
    """The identities of ``identities`` whose tensor is one of ``inputs`` and not updated by the step."""

    def __init__(self, identities: Iterable[MemoryIdentity], updated: set[int], inputs: Sequence[torch.Tensor],
                 residency: Residency, graph: str) -> None:
        wanted = {id(t) for t in inputs}
        self._entries = [_ScalarInput(i.tensor, i.buffer, int(i.tensor._version)) for i in identities
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
