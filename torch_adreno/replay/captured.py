"""A replayed step frozen for export: what :mod:`torch_adreno.export` writes, as one value.

    captured = step.captured_step(predict=x)     # a TrainingStep's (torch_adreno.training)
    captured = replay.captured()                 # a ReplayedStep's: no state names, no forward
    torch_adreno.export.export_step(captured, "step.onnx")

A :class:`CapturedStep` holds the step's launches and copies (with their kernel programs), its
memory identities, the memory plan of its internal memory (slot of each identity, bytes of each
slot), its batch inputs' geometry, its loss's identity, shape and dtype, which persistent
identities are scalar inputs, and a copy of every persistent tensor's value taken when it was
made. The producers (:meth:`ReplayedStep.captured <torch_adreno.replay.step.ReplayedStep.captured>`,
:meth:`TrainingStep.captured_step <torch_adreno.TrainingStep.captured_step>`) are the only code
that reads a replay's own fields; an export reads this.

Invariants: the values in :attr:`CapturedStep.state` are the host copies' at the moment it was made
(made only while none of them is out of date: the step synchronized), and do not change when the
step trains on; the recording's persistent identities still name their live tensors (to match a
recorded forward's reads to the step's), but an export reads values only from :attr:`state`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from torch_adreno.replay.capture import PERSISTENT, StepRecording
from torch_adreno.replay.memory import StepMemoryPlan
from torch_adreno.replay.operations import CaptureError
from torch_adreno.runtime.residency import Residency

__all__ = ["CapturedForward", "CapturedStep", "captured_step"]


@dataclass(frozen=True)
class CapturedForward:
    """A model's forward (eval mode, no gradients) on the step's batch argument 0, recorded as a
    launch list over the same persistent tensors: an export adds it as the file's prediction."""

    recording: StepRecording
    slot_of: Mapping[int, int]
    slot_bytes: tuple[int, ...]
    #: The shape of its output (the logits).
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CapturedStep:
    """One recorded training step, frozen (see the module docstring)."""

    #: The launches and copies in order, with their kernel sources and programs; the memory
    #: identities; the batch inputs' geometry (:attr:`StepRecording.batch`); seeds; fills; the
    #: loss's identity; the persistent identities the step updates.
    recording: StepRecording
    #: The memory plan of the step's internal memory: each internal identity's slot, each slot's bytes.
    slot_of: Mapping[int, int]
    slot_bytes: tuple[int, ...]
    loss_shape: tuple[int, ...]
    loss_dtype: torch.dtype
    #: The value of each persistent identity (by identity index) when this was made: a copy.
    state: Mapping[int, torch.Tensor]
    #: Persistent identities that are scalar inputs (a tensor learning rate, Adam's betas): read by
    #: the step, not updated, uploaded by a replay whenever the host changes them.
    scalar_inputs: tuple[int, ...] = ()
    #: The name an export gives each persistent identity (by identity index); one without a name
    #: is written as ``captured.<label>``.
    state_names: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The model's forward to export with the step (None: none).
    forward: CapturedForward | None = None

    @property
    def batch_inputs(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...], int, torch.dtype] | None, ...]:
        """Shape, strides, storage offset and dtype of each batch argument (None: not a tensor)."""
        return self.recording.batch


def captured_step(recording: StepRecording, memory: StepMemoryPlan, loss: tuple[tuple[int, ...], torch.dtype],
                  scalar_inputs: Iterable[torch.Tensor], residency: Residency,
                  state_names: Mapping[int, str] | None = None, forward: CapturedForward | None = None) -> CapturedStep:
    """A :class:`CapturedStep` of a replay's ``recording`` and ``memory`` plan; ``loss``: its shape
    and dtype; ``state_names``: export names by ``id`` of the persistent tensors. Copies the
    persistent tensors' values; a :class:`CaptureError` where a host copy is out of date."""
    persistent = [i for i in recording.identities if i.kind is PERSISTENT and i.tensor is not None]
    stale = [i.label for i in persistent if residency.is_deferred(i.tensor)]  # type: ignore[arg-type]
    if stale:
        raise CaptureError(f"the host copies of the step's state are out of date ({', '.join(stale[:3])}): "
                           "synchronize the step (TrainingStep.synchronize()) before capturing it for export")
    with torch.no_grad():
        state = {i.index: i.tensor.detach().clone() for i in persistent}  # type: ignore[union-attr]
    scalars = {id(t) for t in scalar_inputs}
    names = state_names or {}
    return CapturedStep(
        recording, MappingProxyType(dict(memory.slot_of)), tuple(memory.slot_bytes), tuple(loss[0]), loss[1],
        MappingProxyType(state), tuple(i.index for i in persistent if id(i.tensor) in scalars),
        MappingProxyType({i.index: names[id(i.tensor)] for i in persistent if id(i.tensor) in names}), forward)
