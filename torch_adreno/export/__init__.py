"""A captured training step written as one ONNX model (the layout: :mod:`torch_adreno.runner.format`).

    step = torch_adreno.TrainingStep(model, loss_fn, optimizer)
    step(x, y); step(x, y)                          # the second call captures the step
    step.export("step.onnx")                        # or, the same:
    export_step(step.captured_step(), "step.onnx")

What is written is a :class:`~torch_adreno.replay.captured.CapturedStep`, the step's replay
(:mod:`torch_adreno.replay.step`) frozen with a copy of the state's values: each launch a node
calling a model-local function (domain ``torch_adreno``) whose body is the standard ONNX ops of what
the kernel fused, each node carrying the kernel's OpenCL source, launch geometry and buffers, and
the step's memory plan in the model's metadata, with the SHA-256 digests of the tensors, kernel
sources and operations that every runner checks (:mod:`torch_adreno.runner.integrity`). So
onnxruntime runs the step from the bodies, Netron shows it as our kernels, and
:mod:`torch_adreno.runner`, the native runtime (``torch-adreno-step``, ``native/``) and a remote
device (its step server) run the kernels themselves without PyTorch.

The step format has one home, :mod:`torch_adreno.runner.format` (torch-free, so every reader
imports it); this package writes it:

- :mod:`.onnx_writer`: :func:`export_step`, the model of a capture (inputs, outputs, the plan);
- :mod:`.step_graph`: one node per launch or copy, and each kernel's function;
- :mod:`.kernel_bodies`, :mod:`.attention_bodies`: a kernel's computation in standard ONNX ops;
- :mod:`.training_state`: the state's names in a file, and loading a run's state back;
- :mod:`.data_file`: the batches a run of an exported step takes.

Invariant: the graph's state inputs carry the values the capture copied, and feeding its outputs
back as inputs computes the steps that follow.
"""

from __future__ import annotations

from torch_adreno.export.kernel_bodies import ExportError
from torch_adreno.export.onnx_writer import export_step, step_model
from torch_adreno.export.training_state import load_state, reset_state, state_names
from torch_adreno.replay.captured import CapturedForward, CapturedStep

__all__ = ["CapturedForward", "CapturedStep", "ExportError", "export_step", "load_state", "reset_state",
           "state_names", "step_model"]
