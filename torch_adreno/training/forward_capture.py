"""A model's forward recorded as a launch list, for an export's prediction (the file's ``logits``
output, which the runners use to measure accuracy): compiled for the step's device with the
step's options, run once to compile and once recorded, in eval mode without gradients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torch_adreno.export import ExportError
from torch_adreno.replay.capture import StepRecorder, recording_of
from torch_adreno.replay.captured import CapturedForward
from torch_adreno.replay.memory import plan_step_memory
from torch_adreno.runtime.device import DeviceRuntime


def record_forward(model: torch.nn.Module, options: Mapping[str, Any], runtime: DeviceRuntime,
                   example: torch.Tensor) -> CapturedForward:
    """The forward of ``model`` on ``example`` in eval mode without gradients, compiled with
    ``options`` and recorded on ``runtime``; the model's train/eval modes are restored after. An
    :class:`ExportError` where the forward is not one launch list writing a tensor, or updates state."""
    compiled = torch.compile(model, backend="adreno", options=dict(options), dynamic=False, fullgraph=True)
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            compiled(example)  # compiles
            recorder = StepRecorder(runtime, (example,))
            with recorder:
                logits = compiled(example)
    finally:
        for module, training in modes.items():
            module.training = training
    output = recorder.output_identity(logits) if isinstance(logits, torch.Tensor) else None
    if recorder.unsupported is not None or output is None:
        raise ExportError("the model's forward cannot be exported as the prediction: "
                          + (recorder.unsupported or "its output is not a tensor a kernel wrote"))
    if recorder.updated:
        raise ExportError("the model's forward in eval mode updates state: no prediction exported")
    memory = plan_step_memory(recorder, {output})
    return CapturedForward(recording_of(recorder, output), memory.slot_of, memory.slot_bytes, tuple(logits.shape))
