"""The ONNX writer: a :class:`~torch_adreno.replay.captured.CapturedStep` as one ONNX model, in the
step format of :mod:`torch_adreno.runner.format` (its one home: the layout, the plan's JSON, what
each runner checks).

The graph's inputs are the batch arguments and the persistent tensors the step reads (with their
values as initializers), its outputs the loss and the updated persistent tensors; its nodes the
step's operations (:mod:`.step_graph`), then, where the capture holds the model's forward, the
forward's (output ``logits``). The model's metadata holds the plan (memory identities, slots,
batch inputs, loss, fills, the forward's operations) and the digests of
:mod:`torch_adreno.runner.integrity`.

Invariant: the graph's state inputs carry the values the capture copied, and feeding its outputs
back as inputs computes the steps that follow. The bytes written depend only on the capture.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from torch_adreno import ir
from torch_adreno.config import VERSION
from torch_adreno.export.kernel_bodies import NUMPY_TYPE, ONNX_TYPE, ExportError
from torch_adreno.export.step_graph import StepGraph, Value, copy_node, launch_node, read_value
from torch_adreno.replay.capture import BATCH, INTERNAL, PERSISTENT, RecordedCopy
from torch_adreno.replay.captured import CapturedForward, CapturedStep
from torch_adreno.runner import format as fmt
from torch_adreno.runner import integrity

__all__ = ["EXPORTABLE_DTYPES", "export_step", "step_model"]

#: The element types a step's batch and state may have in an exported file.
EXPORTABLE_DTYPES = {torch.float32: ir.DType.F32, torch.int64: ir.DType.I64, torch.int32: ir.DType.I32,
                     torch.bool: ir.DType.BOOL, torch.uint8: ir.DType.U8}


def export_step(captured: CapturedStep, path: str | Path) -> onnx.ModelProto:
    """Write ``captured`` to ``path`` as ONNX (the model of :func:`step_model`) and return the
    model. A TrainingStep gives its capture with ``step.captured_step(predict=None)`` (or writes
    it with ``step.export(path, predict=None)``)."""
    if not isinstance(captured, CapturedStep):
        hint = ("pass its capture, `step.captured_step(predict=None)`, or call `step.export(path)`"
                if hasattr(captured, "captured_step") else
                "make one with a TrainingStep's `captured_step()` (or a ReplayedStep's `captured()`)")
        raise TypeError(f"export_step takes a CapturedStep, not a {type(captured).__name__}: {hint}")
    model = step_model(captured)
    onnx.save(model, str(path))
    return model


def step_model(captured: CapturedStep) -> onnx.ModelProto:
    """The ONNX model of ``captured`` (see the module docstring)."""
    recording, slot_of, names, loss_shape = captured.recording, captured.slot_of, captured.state_names, captured.loss_shape
    if recording.seeds:
        raise ExportError("the step draws random numbers (dropout?): exporting random ops is not supported yet")
    g = StepGraph()
    body = g.body
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    initializers: list[onnx.TensorProto] = []
    digests: dict[str, str] = {}  # of the initializers' values, hashed from their arrays
    values: dict[int, Value] = {}
    plan: dict[str, Any] = {"identities": [], "slots": list(captured.slot_bytes), "batch": [], "loss": None}

    batch_flat: dict[int, tuple[str, ir.DType, tuple[int, ...], int]] = {}
    for position, arg in enumerate(recording.batch):
        if arg is None:
            continue
        shape, stride, offset, torch_dtype = arg
        if torch_dtype not in EXPORTABLE_DTYPES:
            raise ExportError(f"batch argument {position} is {torch_dtype}; exportable: {sorted(map(str, EXPORTABLE_DTYPES))}")
        if stride != contiguous_strides(shape):
            raise ExportError(f"batch argument {position} is not contiguous: pass contiguous batches to the captured step")
        name = f"batch_{position}"
        inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[EXPORTABLE_DTYPES[torch_dtype]], list(shape)))
        batch_flat[position] = (body.op("Reshape", [name, body.ints([-1])], f"{name}_flat"), EXPORTABLE_DTYPES[torch_dtype],
                                shape, offset)
        plan["batch"].append({"input": name, "position": position, "shape": list(shape),
                              "dtype": str(torch_dtype).removeprefix("torch.")})

    updated = set(recording.updated)
    for identity in recording.identities:
        entry: dict[str, Any] = {"index": identity.index, "kind": identity.kind, "nbytes": identity.nbytes,
                                 "label": identity.label}
        if identity.kind is PERSISTENT:
            tensor = captured.state[identity.index]
            if tensor.dtype not in EXPORTABLE_DTYPES:
                raise ExportError(f"{identity.label} is {tensor.dtype}; exportable: {sorted(map(str, EXPORTABLE_DTYPES))}")
            name = names.get(identity.index, f"captured.{identity.label}")
            array = tensor.detach().cpu().contiguous().numpy()
            initializers.append(numpy_helper.from_array(array, name))
            digests[name] = integrity.array_digest(array)
            dtype = EXPORTABLE_DTYPES[tensor.dtype]
            inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], list(tensor.shape)))
            values[identity.index] = Value(body.op("Reshape", [name, body.ints([-1])], "state"), dtype, tensor.numel())
            entry.update(input=name, shape=list(tensor.shape), output=f"{name}.new" if identity.index in updated else None)
        elif identity.kind is BATCH:
            assert identity.view is not None
            flat_name, dtype, shape, offset = batch_flat[identity.batch_position]
            view_shape, view_stride, view_offset = identity.view
            positions = np.lib.stride_tricks.as_strided(
                np.arange(math.prod(shape), dtype=np.int64), view_shape,
                [s * 8 for s in view_stride]) if view_shape else np.zeros((), np.int64)
            whole = view_shape == shape and view_stride == contiguous_strides(shape) and view_offset == offset
            if whole:
                value = flat_name
            else:
                index = (positions + (view_offset - offset)).reshape(-1)
                value = body.op("Gather", [flat_name, body.constant(index, ir.DType.INDEX)], "batch_view", axis=0)
            values[identity.index] = Value(value, dtype, math.prod(view_shape))
            entry.update(position=identity.batch_position,
                         view=None if whole else [list(view_shape), list(view_stride), view_offset - offset])
        elif identity.kind is INTERNAL:
            entry["slot"] = slot_of.get(identity.index)
        plan["identities"].append(entry)

    plan[fmt.FILLS_KEY] = [[f.before, f.identity, f.offset, f.nbytes] for f in recording.fills]
    at_input = dict(values)
    for op in recording.operations:
        if isinstance(op, RecordedCopy):
            copy_node(g, op, values)
        else:
            launch_node(g, op.graph, op.source, op.args, recording.programs[op.graph], values)
    if captured.forward is not None:
        persistent = {id(i.tensor): i.index for i in recording.identities if i.kind is PERSISTENT}
        _add_forward(g, captured.forward, at_input, persistent, plan, batch_flat, outputs, len(recording.operations))

    for identity in recording.identities:
        if identity.kind is PERSISTENT and identity.index in updated:
            tensor = captured.state[identity.index]
            name = f"{names.get(identity.index, f'captured.{identity.label}')}.new"
            value = read_value(g, values, identity.index, EXPORTABLE_DTYPES[tensor.dtype], tensor.numel(), name)
            g.nodes.append(helper.make_node("Reshape", [value, body.ints(list(tensor.shape))], [name]))
            outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[EXPORTABLE_DTYPES[tensor.dtype]], list(tensor.shape)))
    loss = values.get(recording.loss)
    if loss is None:
        raise ExportError("no kernel of the step writes the loss")
    loss_value = read_value(g, values, recording.loss, loss.dtype, math.prod(loss_shape), "loss")
    g.nodes.append(helper.make_node("Reshape", [loss_value, body.ints(list(loss_shape))], ["loss"]))
    outputs.insert(0, helper.make_tensor_value_info("loss", ONNX_TYPE[loss.dtype], list(loss_shape)))
    plan["loss"] = {"identity": recording.loss, "dtype": np.dtype(NUMPY_TYPE[loss.dtype]).name, "shape": list(loss_shape)}

    # The main graph's constants (reshape targets, batch view indices) come before every use.
    nodes = [*body.nodes, *g.nodes]
    graph = helper.make_graph(nodes, "training_step", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", fmt.OPSET),
                                                    helper.make_opsetid(fmt.DOMAIN, 1)],
                              functions=list(g.functions.values()), producer_name=fmt.PRODUCER,
                              producer_version=VERSION)
    model.doc_string = ("One training step compiled by torch_adreno: inputs are the batch and the training state, "
                        "outputs the loss and the updated state. Each node is one OpenCL kernel of the step.")
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    return integrity.seal(model, digests)


def _add_forward(g: StepGraph, forward: CapturedForward, at_input: dict[int, Value], persistent: dict[int, int],
                 plan: dict[str, Any], batch_flat: dict[int, tuple[str, ir.DType, tuple[int, ...], int]],
                 outputs: list[onnx.ValueInfoProto], first_operation: int) -> None:
    """The forward's launches (the prediction) after the step's (``first_operation`` of them): memory identities
    numbered after the step's, the state read as it is at the step's input (shared with the step:
    the same buffers in a runner), the input from batch argument 0; its output ``logits``; its
    fills after the step's. The plan's ``predict`` entry counts its operations (the last ones of
    the file) and names its output."""
    recording = forward.recording
    first_identity, first_slot = len(plan["identities"]), len(plan["slots"])
    plan["slots"].extend(forward.slot_bytes)
    mapping: dict[int, int] = {}
    values: dict[int, Value] = {}
    for identity in recording.identities:
        index = first_identity + identity.index
        if identity.kind is PERSISTENT:
            shared = persistent.get(id(identity.tensor))
            if shared is None:
                raise ExportError(f"the prediction reads {identity.label}, a tensor the training step does not read")
            mapping[identity.index] = shared
            values[shared] = at_input[shared]
            continue
        mapping[identity.index] = index
        entry: dict[str, Any] = {"index": index, "kind": identity.kind, "nbytes": identity.nbytes,
                                 "label": identity.label, "program": "predict"}
        if identity.kind is BATCH:
            geometry = recording.batch[0]
            if 0 not in batch_flat or geometry is None or identity.batch_position != 0 \
                    or identity.view != (geometry[0], geometry[1], geometry[2]) or geometry[0] != batch_flat[0][2]:
                raise ExportError("the prediction's input must have the geometry of the step's batch argument 0")
            flat_name, dtype, shape, _ = batch_flat[0]
            values[index] = Value(flat_name, dtype, math.prod(shape))
            entry.update(position=0, view=None)
        elif identity.kind is INTERNAL:
            slot = forward.slot_of.get(identity.index)
            entry["slot"] = None if slot is None else first_slot + slot
        plan["identities"].append(entry)
    operations = 0
    for op in recording.operations:
        operations += 1
        if isinstance(op, RecordedCopy):
            copy_node(g, RecordedCopy(op.graph, mapping[op.destination], mapping[op.source], op.nbytes), values)
        else:
            launch_node(g, op.graph, op.source, [mapping[a] for a in op.args], recording.programs[op.graph], values)
    plan[fmt.FILLS_KEY] += [[first_operation + f.before, mapping[f.identity], f.offset, f.nbytes] for f in recording.fills]
    output = mapping[recording.loss]
    value = values[output]
    flat_logits = read_value(g, values, output, value.dtype, math.prod(forward.shape), "logits")
    g.nodes.append(helper.make_node("Reshape", [flat_logits, g.body.ints(list(forward.shape))], ["logits"]))
    outputs.append(helper.make_tensor_value_info("logits", ONNX_TYPE[value.dtype], list(forward.shape)))
    plan["predict"] = {"operations": operations, "output": {"identity": output, "dtype": np.dtype(NUMPY_TYPE[value.dtype]).name,
                                                             "shape": list(forward.shape)}}


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))
