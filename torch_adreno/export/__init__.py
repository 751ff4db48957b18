"""A captured training step written as one ONNX model (the layout: :mod:`torch_adreno.runner.format`).

    step = torch_adreno.TrainingStep(model, loss_fn, optimizer)
    step(x, y); step(x, y)          # the second call captures the step
    step.export("step.onnx")

The model is the launch list of the step's replay (:mod:`torch_adreno.replay.step`), each
launch a node calling a model-local function (domain ``torch_adreno``) whose body is the standard
ONNX ops of what the kernel fused (:mod:`.kernel_bodies`), each node carrying the kernel's OpenCL
source, launch geometry and buffers, and the step's memory plan in the model's metadata, with the
SHA-256 digests of the tensors, kernel sources and operations that every runner checks
(:mod:`torch_adreno.runner.integrity`). So onnxruntime runs the step from the bodies, Netron shows
it as our kernels, and :mod:`torch_adreno.runner` runs the kernels themselves without PyTorch.

Invariant: the graph's state inputs carry the values the step's tensors have at export (synchronized
from the device first), and feeding its outputs back as inputs computes the steps that follow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from torch_adreno import ir
from torch_adreno.config import VERSION
from torch_adreno.export.attention_bodies import attention_body
from torch_adreno.export.kernel_bodies import (
    ONNX_TYPE,
    Body,
    ExportError,
    SplitK,
    split_slices,
    translate_node,
)
from torch_adreno.kernels.program import KernelSource, assemble
from torch_adreno.replay.capture import BATCH, INTERNAL, PERSISTENT, RecordedCopy, StepRecording
from torch_adreno.replay.guards import state_tensors
from torch_adreno.runner import format as fmt
from torch_adreno.runner import integrity

__all__ = ["ExportError", "export_step", "load_state", "step_model"]

TORCH_TO_IR = {torch.float32: ir.DType.F32, torch.int64: ir.DType.I64, torch.int32: ir.DType.I32,
               torch.bool: ir.DType.BOOL, torch.uint8: ir.DType.U8}


def export_step(step: Any, path: str | Path, predict: torch.Tensor | None = None) -> onnx.ModelProto:
    """Write ``step`` (a :class:`~torch_adreno.TrainingStep` whose step was captured for replay) to
    ``path`` as ONNX and return the model. The state's values are the current ones.

    ``predict``: an example of the model's input (the geometry of batch argument 0): the file then
    also holds the model's forward in eval mode on batch argument 0 (output ``logits``, from the
    state before the step), which the runner uses to measure accuracy."""
    replay = step.replay
    if replay is None:
        reasons = "; ".join(sorted(set(step.unreplayable_reasons)))
        raise ExportError("export needs a captured step: call the TrainingStep at least twice with batches of one "
                          "geometry first (the second call captures it)" + (f"; not captured: {reasons}" if reasons else ""))
    recording = replay.recording
    memory = replay.memory
    step.synchronize()
    prediction = None if predict is None else record_prediction(step, predict)
    names = state_names(step.model, step.optimizer)
    model = step_model(recording, memory.slot_of, memory.slot_bytes, names, replay._loss_shape, prediction)
    onnx.save(model, str(path))
    return model


@dataclass(frozen=True)
class Prediction:
    """The model's forward, recorded as a launch list (see :func:`record_prediction`)."""

    recording: StepRecording
    slot_of: dict[int, int]
    slot_bytes: tuple[int, ...]
    shape: tuple[int, ...]


def record_prediction(step: Any, example: torch.Tensor) -> Prediction:
    """Record the forward of ``step.model`` on ``example`` in eval mode without gradients (compiled
    for the step's device); the model's train/eval mode is restored after."""
    from torch_adreno.replay.capture import StepRecorder, recording_of
    from torch_adreno.replay.memory import plan_step_memory

    model = step.model
    runtime = step._residency.runtime
    compiled = torch.compile(model, backend="adreno", options=dict(step.options), dynamic=False, fullgraph=True)
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
    return Prediction(recording_of(recorder, output), memory.slot_of, memory.slot_bytes, tuple(logits.shape))


def state_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """ONNX input names of the step's persistent tensors, by ``id``: ``state_dict`` names for the
    model's, ``optimizer.<parameter>.<key>`` for optimizer state, ``lr`` for a tensor learning rate."""
    names: dict[int, str] = {}
    single_group = len(optimizer.param_groups) == 1
    for tensor, place in state_tensors(model, optimizer):
        if place[0] == "module":
            name = place[1]
        elif place[0] == "group":
            name = "lr" if single_group and place[2] == "lr" else f"optimizer.group{place[1]}.{place[2]}"
        else:
            name = f"optimizer.{names.get(id(place[1]), 'parameter')}.{place[2]}"
        names.setdefault(id(tensor), name)
    return names


@dataclass
class _Value:
    """The value a memory identity holds at a point of the step: a flat tensor of the graph."""

    name: str
    dtype: ir.DType
    numel: int


class _StepGraph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.functions: dict[str, onnx.FunctionProto] = {}
        self.body = Body("v")  # value names of the main graph
        self._node_names: set[str] = set()

    def node_name(self, wanted: str) -> str:
        """``wanted``, or with a number when another node has it (ONNX node names are unique)."""
        name, number = wanted, 1
        while name in self._node_names:
            number += 1
            name = f"{wanted}#{number}"
        self._node_names.add(name)
        return name


def step_model(recording: StepRecording, slot_of: dict[int, int], slot_bytes: Sequence[int],
               names: dict[int, str], loss_shape: tuple[int, ...],
               prediction: Prediction | None = None) -> onnx.ModelProto:
    """The ONNX model of ``recording`` (see the module docstring); ``slot_of``/``slot_bytes``: the
    replay's memory plan; ``names``: names of persistent tensors by ``id``."""
    if recording.seeds:
        raise ExportError("the step draws random numbers (dropout?): exporting random ops is not supported yet")
    g = _StepGraph()
    body = g.body
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    initializers: list[onnx.TensorProto] = []
    digests: dict[str, str] = {}  # of the initializers' values, hashed from their arrays
    values: dict[int, _Value] = {}
    plan: dict[str, Any] = {"identities": [], "slots": list(slot_bytes), "batch": [], "loss": None}

    batch_flat: dict[int, tuple[str, ir.DType, tuple[int, ...], int]] = {}
    for position, arg in enumerate(recording.batch):
        if arg is None:
            continue
        shape, stride, offset, torch_dtype = arg
        if torch_dtype not in TORCH_TO_IR:
            raise ExportError(f"batch argument {position} is {torch_dtype}; exportable: {sorted(map(str, TORCH_TO_IR))}")
        if stride != _contiguous(shape):
            raise ExportError(f"batch argument {position} is not contiguous: pass contiguous batches to the captured step")
        name = f"batch_{position}"
        inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[TORCH_TO_IR[torch_dtype]], list(shape)))
        batch_flat[position] = (body.op("Reshape", [name, body.ints([-1])], f"{name}_flat"), TORCH_TO_IR[torch_dtype],
                                shape, offset)
        plan["batch"].append({"input": name, "position": position, "shape": list(shape),
                              "dtype": str(torch_dtype).removeprefix("torch.")})

    updated = set(recording.updated)
    for identity in recording.identities:
        entry: dict[str, Any] = {"index": identity.index, "kind": identity.kind, "nbytes": identity.nbytes,
                                 "label": identity.label}
        if identity.kind is PERSISTENT:
            tensor = identity.tensor
            assert tensor is not None
            if tensor.dtype not in TORCH_TO_IR:
                raise ExportError(f"{identity.label} is {tensor.dtype}; exportable: {sorted(map(str, TORCH_TO_IR))}")
            name = names.get(id(tensor), f"captured.{identity.label}")
            array = tensor.detach().cpu().contiguous().numpy()
            initializers.append(numpy_helper.from_array(array, name))
            digests[name] = integrity.array_digest(array)
            dtype = TORCH_TO_IR[tensor.dtype]
            inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], list(tensor.shape)))
            values[identity.index] = _Value(body.op("Reshape", [name, body.ints([-1])], "state"), dtype, tensor.numel())
            entry.update(input=name, shape=list(tensor.shape), output=f"{name}.new" if identity.index in updated else None)
        elif identity.kind is BATCH:
            assert identity.view is not None
            flat_name, dtype, shape, offset = batch_flat[identity.batch_position]
            view_shape, view_stride, view_offset = identity.view
            positions = np.lib.stride_tricks.as_strided(
                np.arange(math.prod(shape), dtype=np.int64), view_shape,
                [s * 8 for s in view_stride]) if view_shape else np.zeros((), np.int64)
            whole = view_shape == shape and view_stride == _contiguous(shape) and view_offset == offset
            if whole:
                value = flat_name
            else:
                index = (positions + (view_offset - offset)).reshape(-1)
                value = body.op("Gather", [flat_name, body.constant(index, ir.DType.INDEX)], "batch_view", axis=0)
            values[identity.index] = _Value(value, dtype, math.prod(view_shape))
            entry.update(position=identity.batch_position,
                         view=None if whole else [list(view_shape), list(view_stride), view_offset - offset])
        elif identity.kind is INTERNAL:
            entry["slot"] = slot_of.get(identity.index)
        plan["identities"].append(entry)

    plan[fmt.FILLS_KEY] = [[f.before, f.identity, f.offset, f.nbytes] for f in recording.fills]
    at_input = dict(values)
    for op in recording.operations:
        if isinstance(op, RecordedCopy):
            _copy(g, op, values)
        else:
            _launch(g, op.graph, op.source, op.args, recording.programs[op.graph], values)
    if prediction is not None:
        persistent = {id(i.tensor): i.index for i in recording.identities if i.kind is PERSISTENT}
        _add_prediction(g, prediction, at_input, persistent, plan, batch_flat, outputs, len(recording.operations))

    for identity in recording.identities:
        if identity.kind is PERSISTENT and identity.index in updated:
            tensor = identity.tensor
            assert tensor is not None
            name = f"{names.get(id(tensor), f'captured.{identity.label}')}.new"
            value = _read(g, values, identity.index, TORCH_TO_IR[tensor.dtype], tensor.numel(), name)
            g.nodes.append(helper.make_node("Reshape", [value, body.ints(list(tensor.shape))], [name]))
            outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[TORCH_TO_IR[tensor.dtype]], list(tensor.shape)))
    loss = values.get(recording.loss)
    if loss is None:
        raise ExportError("no kernel of the step writes the loss")
    loss_value = _read(g, values, recording.loss, loss.dtype, math.prod(loss_shape), "loss")
    g.nodes.append(helper.make_node("Reshape", [loss_value, body.ints(list(loss_shape))], ["loss"]))
    outputs.insert(0, helper.make_tensor_value_info("loss", ONNX_TYPE[loss.dtype], list(loss_shape)))
    plan["loss"] = {"identity": recording.loss, "dtype": np.dtype(_numpy(loss.dtype)).name, "shape": list(loss_shape)}

    # The main graph's constants (reshape targets, batch view indices) come before every use.
    nodes = [*body.nodes, *g.nodes]
    graph = helper.make_graph(nodes, "training_step", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", fmt.OPSET),
                                                    helper.make_opsetid(fmt.DOMAIN, 1)],
                              functions=list(g.functions.values()), producer_name=fmt.PRODUCER,
                              producer_version=_version())
    model.doc_string = ("One training step compiled by torch_adreno: inputs are the batch and the training state, "
                        "outputs the loss and the updated state. Each node is one OpenCL kernel of the step.")
    helper.set_model_props(model, {fmt.FORMAT_KEY: str(fmt.FORMAT_VERSION), fmt.PLAN_KEY: json.dumps(plan)})
    return integrity.seal(model, digests)


def _add_prediction(g: _StepGraph, prediction: Prediction, at_input: dict[int, _Value], persistent: dict[int, int],
                    plan: dict[str, Any], batch_flat: dict[int, tuple[str, ir.DType, tuple[int, ...], int]],
                    outputs: list[onnx.ValueInfoProto], first_operation: int) -> None:
    """The prediction's launches after the step's (``first_operation`` of them): memory identities
    numbered after the step's, the state read as it is at the step's input (shared with the step:
    the same buffers in a runner), the input from batch argument 0; its output ``logits``; its
    fills after the step's. The plan's ``predict`` entry counts its operations (the last ones of
    the file) and names its output."""
    recording = prediction.recording
    first_identity, first_slot = len(plan["identities"]), len(plan["slots"])
    plan["slots"].extend(prediction.slot_bytes)
    mapping: dict[int, int] = {}
    values: dict[int, _Value] = {}
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
            values[index] = _Value(flat_name, dtype, math.prod(shape))
            entry.update(position=0, view=None)
        elif identity.kind is INTERNAL:
            slot = prediction.slot_of.get(identity.index)
            entry["slot"] = None if slot is None else first_slot + slot
        plan["identities"].append(entry)
    operations = 0
    for op in recording.operations:
        operations += 1
        if isinstance(op, RecordedCopy):
            _copy(g, RecordedCopy(op.graph, mapping[op.destination], mapping[op.source], op.nbytes), values)
        else:
            _launch(g, op.graph, op.source, [mapping[a] for a in op.args], recording.programs[op.graph], values)
    plan[fmt.FILLS_KEY] += [[first_operation + f.before, mapping[f.identity], f.offset, f.nbytes] for f in recording.fills]
    output = mapping[recording.loss]
    value = values[output]
    flat_logits = _read(g, values, output, value.dtype, math.prod(prediction.shape), "logits")
    g.nodes.append(helper.make_node("Reshape", [flat_logits, g.body.ints(list(prediction.shape))], ["logits"]))
    outputs.append(helper.make_tensor_value_info("logits", ONNX_TYPE[value.dtype], list(prediction.shape)))
    plan["predict"] = {"operations": operations, "output": {"identity": output, "dtype": np.dtype(_numpy(value.dtype)).name,
                                                             "shape": list(prediction.shape)}}


def _version() -> str:
    return VERSION


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def _numpy(dtype: ir.DType) -> Any:
    from torch_adreno.export.kernel_bodies import NUMPY_TYPE

    return NUMPY_TYPE[dtype]


def _read(g: _StepGraph, values: dict[int, _Value], identity: int, dtype: ir.DType, numel: int, what: str) -> str:
    """The current value of ``identity`` as ``numel`` elements of ``dtype``."""
    value = values.get(identity)
    if value is None:
        raise ExportError(f"{what} reads memory identity {identity} before anything of the step wrote it")
    if ONNX_TYPE[value.dtype] != ONNX_TYPE[dtype]:
        raise ExportError(f"{what} reads memory identity {identity} as {dtype.value}, written as {value.dtype.value}: "
                          "reinterpreting bytes is not exportable")
    if value.numel == numel:
        return value.name
    if value.numel < numel:
        raise ExportError(f"{what} reads {numel} elements of memory identity {identity}, which holds {value.numel}")
    body = g.body
    out = body.fresh("part")
    g.nodes.append(helper.make_node("Slice", [value.name, body.ints([0]), body.ints([numel])], [out]))
    return out


def _copy(g: _StepGraph, op: RecordedCopy, values: dict[int, _Value]) -> None:
    source = values.get(op.source)
    if source is None:
        raise ExportError(f"{op.graph} copies memory identity {op.source} before anything wrote it")
    itemsize = np.dtype(_numpy(source.dtype)).itemsize
    if op.nbytes % itemsize:
        raise ExportError(f"{op.graph} copies {op.nbytes} bytes, not whole {source.dtype.value} elements")
    value = _read(g, values, op.source, source.dtype, op.nbytes // itemsize, f"a copy of {op.graph}")
    if fmt.COPY_OP not in g.functions:
        g.functions[fmt.COPY_OP] = helper.make_function(
            fmt.DOMAIN, fmt.COPY_OP, ["source"], ["destination"], [helper.make_node("Identity", ["source"], ["destination"])],
            [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.COPY_ATTRIBUTES))
    out = g.body.fresh("copied")
    g.nodes.append(helper.make_node(fmt.COPY_OP, [value], [out], domain=fmt.DOMAIN, name=g.node_name(f"{op.graph}.copy"),
                                    destination=op.destination, source=op.source, nbytes=op.nbytes))
    values[op.destination] = _Value(out, source.dtype, op.nbytes // itemsize)


def _split_of(graph: ir.Graph, source: KernelSource) -> SplitK | None:
    """For a launch of a split-K GEMM (its slices, or their sum): the split; else None."""
    producers = graph.producers()
    gemms = {f"{n.name}_slices": n for n in graph.nodes if isinstance(n, ir.Gemm)}
    partials = [p for p in dict.fromkeys((*source.writes, *source.reads)) if p not in producers and p in gemms]
    if not partials:
        return None
    (name,) = partials
    gemm = gemms[name]
    defines = dict(o[2:].partition("=")[::2] for o in source.build_options if o.startswith("-D"))
    rows = defines.get("ROW_SUM") == "1"
    outputs = gemm.batch * gemm.m * gemm.n + (gemm.batch * gemm.m if rows else 0)
    split = graph.buffers[name].numel // outputs
    return SplitK(gemm, name, split, math.ceil(gemm.k / split), rows)


def _launch(g: _StepGraph, graph_name: str, source: KernelSource, args: Sequence[int], program: Any,
            values: dict[int, _Value]) -> None:
    graph: ir.Graph = program.graph
    if not source.writes:
        raise ExportError(f"kernel {source.name} carries no record of the buffers it writes (KernelSource.writes): "
                          "compiled by a torch_adreno that did not keep one; compile the step again")
    # What the launch writes and the arguments its function takes, as the kernels stage recorded
    # them (no signature is parsed): every argument not declared writable, and a split GEMM's
    # partials in its sum launch.
    split = _split_of(graph, source)
    writes = list(dict.fromkeys(source.writes))
    reads = [p for p in source.params if p not in source.writable
             or (split is not None and p == split.partials and source.kind != "gemm")]
    identity_of = dict(zip(source.params, args, strict=True))
    function_name = source.name
    if function_name not in g.functions:
        g.functions[function_name] = _kernel_function(function_name, graph, source, reads, writes, split)
    node_inputs = [_read(g, values, identity_of[p], graph.buffers[p].dtype, graph.buffers[p].numel,
                         f"kernel {source.name} (argument {p})") for p in reads]
    node_outputs = []
    for p in writes:
        out = g.body.fresh(p)
        node_outputs.append(out)
        values[identity_of[p]] = _Value(out, graph.buffers[p].dtype, graph.buffers[p].numel)
    kernel_text, _ = assemble([source])
    _, program_options = assemble(program.kernels)
    g.nodes.append(helper.make_node(
        function_name, node_inputs, node_outputs, domain=fmt.DOMAIN, name=g.node_name(source.name),
        kernel_name=source.symbol, opencl_source=kernel_text, build_options=list(program_options) or [""],
        extensions=list(source.extensions) or [""],
        global_size=list(source.global_size), local_size=list(source.local_size), buffers=list(args),
        parameters=list(source.params), fx_nodes=list(source.fx_nodes) or [""], graph=graph_name,
        index_checks=int(source.checks_indices)))


def _kernel_function(name: str, graph: ir.Graph, source: KernelSource, reads: list[str], writes: list[str],
                     split: SplitK | None) -> onnx.FunctionProto:
    body = Body("t")
    values = {p: f"in_{p}" for p in reads}
    slices = split is not None and source.kind == "gemm"
    # The slice launch of a split GEMM computes the operands (and any prologue fused into them).
    targets = ir.node_inputs(split.gemm) if slices and split is not None else writes
    for node in kernel_nodes(graph, targets, set(reads), name):
        if isinstance(node, ir.TemplateOp):  # (fused attention: several outputs)
            values.update(attention_body(body, node, values, graph.buffers, name))
            continue
        values[ir.node_outputs(node)[0]] = translate_node(
            body, node, values, graph.buffers, name,
            split if split is not None and isinstance(node, ir.Gemm) and node is split.gemm else None)
    if slices and split is not None:
        values[split.partials] = split_slices(body, split, values, graph.buffers, name)
    for p in writes:
        body.nodes.append(helper.make_node("Identity", [values[p]], [f"out_{p}"]))
    return helper.make_function(fmt.DOMAIN, name, [f"in_{p}" for p in reads], [f"out_{p}" for p in writes],
                                body.nodes, [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.KERNEL_ATTRIBUTES),
                                doc_string=source.header[:4000])


def kernel_nodes(graph: ir.Graph, writes: Sequence[str], reads: set[str], kernel: str) -> list[ir.Node]:
    """The IR nodes that compute ``writes`` from ``reads``, in the graph's order."""
    producers = graph.producers()
    needed: set[int] = set()
    stack = list(writes)
    seen: set[str] = set()
    while stack:
        buffer = stack.pop()
        if buffer in seen or buffer in reads:
            continue
        seen.add(buffer)
        node = producers.get(buffer)
        if node is None:
            raise ExportError(f"kernel {kernel}: writes or reads buffer {buffer}, which no IR node of graph "
                              f"{graph.name} computes and the kernel does not take as an argument")
        needed.add(id(node))
        stack.extend(ir.node_inputs(node))
    return [n for n in graph.nodes if id(n) in needed]


def load_state(module: torch.nn.Module, path: str | Path, optimizer: torch.optim.Optimizer | None = None) -> list[str]:
    """Load the state a run of :mod:`torch_adreno.runner` (``.npz`` or ``.onnx``) or of the native
    runtime, ``torch-adreno-step`` (``.safetensors``), wrote into
    ``module``, and into ``optimizer`` its state (``optimizer.*``, ``lr``: by the names the export
    gave them; without ``optimizer`` those are not loaded). Returns the names loaded; a name of the
    file that neither has is an error, as is a parameter of the module the file lacks."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as archive:
            arrays = {k: archive[k] for k in archive.files}
    elif path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
    else:
        model = onnx.load(str(path))
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    arrays = {k: v for k, v in arrays.items() if not k.startswith("captured.")}
    if optimizer is None:
        arrays = {k: v for k, v in arrays.items() if not (k == "lr" or k.startswith(("optimizer.", "lr.")))}
    targets: dict[str, torch.Tensor] = dict(module.state_dict(keep_vars=True))
    if optimizer is not None:
        ids = state_names(module, optimizer)
        tensors = {id(v): v for group in optimizer.param_groups for v in group.values() if isinstance(v, torch.Tensor)}
        tensors.update({id(v): v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)})
        targets.update({ids[i]: t for i, t in tensors.items() if i in ids})
        # State an optimizer makes at its first step (momentum, Adam's moments) is made here.
        params = dict(module.named_parameters())
        for name, array in arrays.items():
            owner, _, key = name.removeprefix("optimizer.").rpartition(".")
            if name.startswith("optimizer.") and name not in targets and owner in params:
                tensor = torch.zeros(array.shape, dtype=torch.from_numpy(np.asarray(array).reshape(-1)[:0].copy()).dtype)
                optimizer.state[params[owner]][key] = targets[name] = tensor
        # Hyperparameters the file holds as tensors (a TrainingStep reads learning rates and betas
        # as inputs) that this optimizer holds as numbers: set as numbers.
        for name in [n for n in arrays if n not in targets]:
            place = _group_hyperparameter(name, len(optimizer.param_groups))
            if place is not None:
                _set_group_number(optimizer.param_groups[place[0]], place[1], place[2], arrays.pop(name))
    unknown = sorted(set(arrays) - set(targets))
    if unknown:
        raise KeyError(f"{path} holds state this model/optimizer has not: {', '.join(unknown[:5])}"
                       + ("" if optimizer is not None else " (pass the optimizer to load its state)"))
    missing = sorted(n for n, _ in module.named_parameters() if n not in arrays)
    if missing:
        raise KeyError(f"{path} lacks parameters of the model: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, array in arrays.items():
            target = targets[name]
            if tuple(target.shape) != array.shape:
                raise ValueError(f"{name}: {path} holds shape {list(array.shape)}, the model {list(target.shape)}")
            target.copy_(torch.from_numpy(np.array(array)))  # (ascontiguousarray makes 0-d arrays 1-d)
    return sorted(arrays)


def _group_hyperparameter(name: str, groups: int) -> tuple[int, str, int | None] | None:
    """(group, key, position in a tuple or None) of an export's hyperparameter name (``lr``,
    ``optimizer.group1.lr``, ``optimizer.group0.betas.1``); None for any other name."""
    if name == "lr":
        return (0, "lr", None) if groups == 1 else None
    parts = name.split(".")
    if len(parts) in (3, 4) and parts[0] == "optimizer" and parts[1].startswith("group") and parts[1][5:].isdigit():
        index = int(parts[1][5:])
        if index < groups:
            return index, parts[2], int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None
    return None


def _set_group_number(group: dict[str, Any], key: str, position: int | None, array: np.ndarray) -> None:
    value = float(np.asarray(array).reshape(-1)[0])
    if key not in group:
        raise KeyError(f"the optimizer has no hyperparameter {key!r} to load")
    if position is None:
        group[key] = value
        return
    current = list(group[key])
    current[position] = value
    group[key] = tuple(current)


def reset_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, initial: dict[str, torch.Tensor]) -> None:
    """Put the model's state back to ``initial`` (a ``state_dict`` copy) and zero the optimizer's
    state tensors: the state before a first step, for optimizers whose first step from zeroed state
    is their first step (SGD with momentum, Adam)."""
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            tensor.copy_(initial[name])
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
