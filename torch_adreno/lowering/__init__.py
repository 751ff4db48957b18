"""Lowering: an ATen-level FX GraphModule -> :class:`torch_adreno.ir.Graph`.

One file per op family registers its lowerings in :data:`context.LOWERINGS`. An op without a
lowering raises :class:`UnsupportedOpError` naming the op, its FX node and the user's source line,
unless the config asks for the host fallback, which is explicit, warned about once per op and
counted by the profiler.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.errors import LoweringError, SymbolicShapeError, UnsupportedOpError
from torch_adreno.lowering import (  # noqa: F401  (registers)
    assertions,
    attention,
    conv,
    experts,
    histogram,
    linalg,
    pointwise,
    pooling,
    random,
    reduction,
    scatter,
    sorting,
    views,
)
from torch_adreno.lowering.checks import check_like_eager
from torch_adreno.lowering.context import (
    LoweringContext,
    Value,
    ir_dtype,
    lowering_for,
    representable,
    supported_dtype_names,
    supported_ops,
    user_source,
)

__all__ = ["LoweringError", "UnsupportedOpError", "lower_graph", "supported_ops"]

_warned_host_ops: set[str] = set()


def lower_graph(gm: GraphModule, config: Config, name: str, num_host_outputs: int | None = None) -> ir.Graph:
    """Lower ``gm`` to an IR graph named ``name``.

    Outputs ``[0, num_host_outputs)`` go back to the caller on the host; later ones (tensors saved
    for the backward) stay on the device. ``None`` means every output goes to the host.
    """
    ctx = LoweringContext(name, config)
    env: dict[Node, Value] = {}
    constants: dict[str, Value] = {}
    for node in gm.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            env[node] = _lower_placeholder(ctx, node)
        elif node.op == "call_function":
            env[node] = _lower_call(ctx, node, env)
        elif node.op == "output":
            _lower_outputs(ctx, node, env, num_host_outputs)
        elif node.op == "get_attr":
            target = str(node.target)
            if target not in constants:  # one buffer per constant, however many nodes read it
                constants[target] = _lower_constant(ctx, node, getattr(gm, target))
            env[node] = constants[target]
        else:
            raise LoweringError(f"FX node {node.name}: op kind {node.op!r} is not supported")
    ctx.node = None
    return ctx.graph


def _lower_placeholder(ctx: LoweringContext, node: Node) -> Value:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        if any(not isinstance(s, int) for s in val.shape):
            raise SymbolicShapeError(
                f"graph input {node.name} has a symbolic shape {tuple(val.shape)}; the adreno backend "
                "compiles static shapes: call torch.compile(..., dynamic=False)"
            )
        view = ctx.add_input(tuple(val.shape), ir_dtype(val.dtype, f"graph input {node.name}", val.numel()), node.name)
        if val.dtype == torch.float64:
            ctx.graph.float64_inputs.add(node.name)
        return view
    if isinstance(val, (int, float, bool)) or val is None:
        ctx.graph.inputs.append(None)
        return val
    raise SymbolicShapeError(
        f"graph input {node.name} is a {type(val).__name__}; symbolic values are not supported: "
        "call torch.compile(..., dynamic=False)"
    )


def _lower_constant(ctx: LoweringContext, node: Node, value: Any) -> Value:
    """A tensor the FX graph holds as an attribute (``torch.tensor([...])`` in traced code, lifted
    by AOTAutograd): one element becomes a literal in the kernels that read it, none an empty
    buffer, more a buffer of the graph whose values the runtime binds (:attr:`ir.Graph.constants`)."""
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"FX node {node.name}: a graph attribute of type {type(value).__name__} is not supported "
                            "(only tensor constants are)")
    if value.device.type != "cpu":
        raise LoweringError(f"FX node {node.name}: the tensor constant is on {value.device}; the adreno backend "
                            "computes on its own OpenCL device from CPU tensors: create it on the CPU")
    shape = tuple(int(s) for s in value.shape)
    dtype = ir_dtype(value.dtype, f"tensor constant {node.name}")
    # AOTAutograd calls the compiler inside its fake mode; the constant is a real tensor, and
    # reading it must not dispatch through that mode (which refuses non-fake tensors).
    with unset_fake_temporarily():
        if value.numel() == 0:
            return ctx.pointwise(shape, dtype, lambda idx: ir.const(0, dtype))
        if value.numel() == 1:
            scalar = value.item()
            return ctx.pointwise(shape, dtype, lambda idx: ir.const(scalar, dtype))
        return ctx.add_constant(value, node.name)


def _lower_call(ctx: LoweringContext, node: Node, env: dict[Node, Value]) -> Value:
    if node.target is operator.getitem:
        container, i = node.args
        return env[container][i]  # type: ignore[index]
    check_like_eager(node, ctx.graph.name)
    args = tree_map(lambda a: env[a] if isinstance(a, Node) else a, node.args)
    kwargs = tree_map(lambda a: env[a] if isinstance(a, Node) else a, dict(node.kwargs))
    lowering = lowering_for(node.target)
    val = node.meta.get("val")
    elsewhere = [v.device for v in tree_flatten(val)[0] if isinstance(v, torch.Tensor) and v.device.type != "cpu"]
    if elsewhere:
        # Outputs are handed back as CPU tensors; computing one "on cuda" would return it on the
        # wrong device, and a host fallback would mix devices inside one graph.
        raise LoweringError(
            f"{node.target} (FX node '{node.name}' in graph {ctx.graph.name}) makes a tensor on {elsewhere[0]}; "
            "the adreno backend computes on its own OpenCL device and returns CPU tensors. Create the tensor "
            "on the CPU inside the compiled function and move it to another device outside it."
        )
    made = next((v for v in tree_flatten(val)[0] if isinstance(v, torch.Tensor) and not representable(v.dtype, v.numel())),
                None)
    if made is not None:
        raise UnsupportedOpError(_unrepresentable_result_message(node, ctx.graph.name, made.dtype))
    if lowering is not None and isinstance(val, torch.Tensor) and val.numel() == 0:
        # An empty result has no element to compute, whatever the op: only its shape matters, and
        # lowerings need not handle zero-size operands (an empty index may even have another rank).
        meta = ctx.meta()
        return ctx.pointwise(meta.shape, meta.dtype, lambda i: ir.const(0, meta.dtype))
    if lowering is not None:
        try:
            return lowering(ctx, node, *args, **kwargs)
        except UnsupportedOpError as err:
            reason = str(err)
    else:
        reason = "no lowering is registered for it"
    if ctx.config.fallback == "host":
        return _host_fallback(ctx, node, args, kwargs, reason)
    raise UnsupportedOpError(_unsupported_message(node, ctx.graph.name, reason), host_fallback=True)


def _unsupported_message(node: Node, graph_name: str, reason: str) -> str:
    """What could not run, and where in the user's code (the ways on follow: UnsupportedOpError)."""
    source = user_source(node)
    where = f"\n  from your code: {source}" if source else ""
    return f"the adreno backend cannot run {node.target} (FX node '{node.name}' in graph {graph_name}): {reason}.{where}"


def _unrepresentable_result_message(node: Node, graph_name: str, dtype: torch.dtype) -> str:
    """An op whose result has a type the backend has none of (an FFT's complex values): neither a
    lowering nor the host fallback can hold it on the device, so the ways on are outside the graph."""
    problem = _unsupported_message(
        node, graph_name, f"it makes a {dtype} tensor, and the backend computes in {supported_dtype_names()} only, "
        "so neither the device nor the host fallback can hold its result")
    if dtype.is_complex:
        real_ops = ("compute it with real ops (an FFT's real and imaginary parts are matmuls with cosine and sine "
                    "matrices)" if "fft" in str(node.target) else "compute it with real ops on real and imaginary "
                    "parts kept as two float tensors")
    else:
        real_ops = "compute it in float32 (no .double() or dtype=torch.float64 inside the compiled code)"
    return (f"{problem}\nHow to proceed:\n"
            "  * keep this computation out of the compiled graph: in a function decorated with "
            "@torch.compiler.disable it runs on the host, between two graphs (a TrainingStep then runs "
            "in pieces, not replayed), and hands back real tensors;\n"
            f"  * or {real_ops}.")


def _host_fallback(ctx: LoweringContext, node: Node, args: Any, kwargs: Any, reason: str) -> Value:
    op_name = str(node.target)
    if op_name not in _warned_host_ops:
        _warned_host_ops.add(op_name)
        warnings.warn(
            f"torch_adreno: {op_name} runs on the host ({reason}); it costs host<->device copies",
            stacklevel=2,
        )
    flat, spec = tree_flatten((args, kwargs))
    tensor_slots = [i for i, a in enumerate(flat) if isinstance(a, ir.View)]
    inputs = tuple(ctx.materialize(flat[i]) for i in tensor_slots)
    val = node.meta.get("val")
    out_vals = list(val) if isinstance(val, (tuple, list)) else [val]
    outputs: list[ir.View | None] = []
    for v in out_vals:
        if v is None:
            outputs.append(None)
        elif isinstance(v, torch.Tensor):
            outputs.append(ir.View.of(ctx.new_buffer(tuple(v.shape), ir_dtype(v.dtype))))
        else:
            raise LoweringError(f"{node.name}: host fallback of an op returning {type(v).__name__} is not supported")
    target = node.target

    def run(*tensors: torch.Tensor) -> list[torch.Tensor | None]:
        values = list(flat)
        for slot, t in zip(tensor_slots, tensors, strict=True):
            values[slot] = t
        call_args, call_kwargs = tree_unflatten(values, spec)
        result = target(*call_args, **call_kwargs)  # type: ignore[operator]
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        return [r.contiguous() if isinstance(r, torch.Tensor) else r for r in results]

    ctx.graph.nodes.append(ir.HostOp(
        ctx.fresh("host"), op_name, inputs, tuple(o.buffer for o in outputs if o is not None), run, ctx.origins,
    ))
    if isinstance(val, (tuple, list)):
        return tuple(outputs)
    return outputs[0]


def _lower_outputs(ctx: LoweringContext, node: Node, env: dict[Node, Value], num_host_outputs: int | None) -> None:
    results: Sequence[Any] = node.args[0]  # type: ignore[assignment]
    if not isinstance(results, (tuple, list)):
        results = [results]
    for pos, result in enumerate(results):
        role = ir.OutputRole.HOST if num_host_outputs is None or pos < num_host_outputs else ir.OutputRole.DEVICE
        value = env[result] if isinstance(result, Node) else result
        traced = result.meta.get("val") if isinstance(result, Node) else None
        if isinstance(traced, torch.Tensor) and traced.dtype == torch.float64:
            ctx.graph.float64_outputs.add(pos)
        if value is None:
            ctx.graph.outputs.append(ir.GraphOutput(None, role))
            continue
        if not isinstance(value, ir.View):
            raise LoweringError(
                f"graph output {pos} is a {type(value).__name__}; only tensor outputs are supported "
                "(symbolic shapes: call torch.compile(..., dynamic=False))"
            )
        ctx.node = result if isinstance(result, Node) else None
        if value.buffer in ctx.graph.constants:
            # An output that is an input comes back as the caller's own object: a constant must
            # not (the caller could change the values every later call reads).
            value = _copy_of(ctx, value)
        if not value.is_identity() and value.is_contiguous_reshape():
            ctx.graph.outputs.append(ir.GraphOutput(value.buffer, role, tuple(value.shape)))
            continue
        view = ctx.materialize(value)
        ctx.graph.outputs.append(ir.GraphOutput(view.buffer, role))


def _copy_of(ctx: LoweringContext, view: ir.View) -> ir.View:
    return ctx.pointwise(view.shape, view.dtype, lambda idx: view.load(idx))
