"""Elementwise ATen ops, constants and dtype conversions: one Pointwise IR node each."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch._inductor.inductor_prims  # (defines torch.ops.prims.fma, lowered here)
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, LoweringError, Value, ir_dtype, register

aten = torch.ops.aten

# ATen op -> IR op. The IR ops are names of the op table (torch_adreno.ir.ops.OPS), which says what
# each computes in a kernel and in the ONNX export; tests/lowering/test_op_table.py checks every name here.
_UNARY = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.tanh.default: "tanh",
    aten.sigmoid.default: "sigmoid", aten.relu.default: "relu", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.floor.default: "floor", aten.ceil.default: "ceil",
    aten.round.default: "round", aten.trunc.default: "trunc", aten.sign.default: "sign",
    aten.reciprocal.default: "reciprocal", aten.erf.default: "erf", aten.log1p.default: "log1p",
    aten.expm1.default: "expm1", aten.log2.default: "log2", aten.exp2.default: "exp2",
    aten.bitwise_not.default: "bitwise_not",
}

_BINARY = {
    "mul": (aten.mul.Tensor, aten.mul.Scalar),
    "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,),
    "fmod": (aten.fmod.Tensor, aten.fmod.Scalar),
    "remainder": (aten.remainder.Tensor, aten.remainder.Scalar),
    "atan2": (aten.atan2.default,),
    "bitwise_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bitwise_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    "bitwise_xor": (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
}

_COMPARE = {
    "eq": (aten.eq.Tensor, aten.eq.Scalar), "ne": (aten.ne.Tensor, aten.ne.Scalar),
    "lt": (aten.lt.Tensor, aten.lt.Scalar), "le": (aten.le.Tensor, aten.le.Scalar),
    "gt": (aten.gt.Tensor, aten.gt.Scalar), "ge": (aten.ge.Tensor, aten.ge.Scalar),
}

_LOGICAL = {
    "logical_and": aten.logical_and.default, "logical_or": aten.logical_or.default,
    "logical_xor": aten.logical_xor.default,
}


def _meta_value(arg: Any) -> Any:
    """A value torch.result_type understands: the FX node's fake tensor, or the Python number."""
    if isinstance(arg, Node):
        return arg.meta["val"]
    return arg


def promoted_dtype(ctx: LoweringContext, *fx_args: Any) -> ir.DType:
    """The dtype PyTorch computes an op in: type promotion over the FX arguments."""
    vals = [_meta_value(a) for a in fx_args]
    numel = max((int(v.numel()) for v in vals if isinstance(v, torch.Tensor)), default=1)
    if len(vals) == 1:
        v = vals[0]
        return ir_dtype(v.dtype if isinstance(v, torch.Tensor) else torch.tensor(v).dtype, numel=numel)
    return ir_dtype(torch.result_type(vals[0], vals[1]), numel=numel)


def elementwise(ctx: LoweringContext, op: str, args: list[Any], compute: ir.DType | None = None) -> ir.View:
    """``op`` over broadcast ``args`` computed in ``compute`` (default: the result dtype)."""
    out = ctx.meta()
    compute = out.dtype if compute is None else compute

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        return ir.call(op, *(ctx.load(a, idx, out.shape, compute) for a in args))

    return ctx.pointwise(out.shape, out.dtype, body)


def _register_unary(aten_op: Any, op: str) -> None:
    @register(aten_op)
    def lower(ctx: LoweringContext, node: Node, x: Value) -> Value:
        return elementwise(ctx, op, [x])


for _aten_op, _op in _UNARY.items():
    _register_unary(_aten_op, _op)


def _register_binary(ops: tuple[Any, ...], op: str) -> None:
    @register(*ops)
    def lower(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
        return elementwise(ctx, op, [a, b])


for _op, _aten_ops in _BINARY.items():
    _register_binary(_aten_ops, _op)


def _register_compare(ops: tuple[Any, ...], op: str) -> None:
    @register(*ops)
    def lower(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
        return elementwise(ctx, op, [a, b], promoted_dtype(ctx, *node.args[:2]))


for _op, _aten_ops in _COMPARE.items():
    _register_compare(_aten_ops, _op)


def _register_logical(aten_op: Any, op: str) -> None:
    @register(aten_op)
    def lower(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
        return elementwise(ctx, op, [a, b], ir.DType.BOOL)


for _op, _aten_op in _LOGICAL.items():
    _register_logical(_aten_op, _op)


@register(aten.logical_not.default)
def _logical_not(ctx: LoweringContext, node: Node, x: Value) -> Value:
    return elementwise(ctx, "logical_not", [x], ir.DType.BOOL)


@register(aten.isnan.default)
def _isnan(ctx: LoweringContext, node: Node, x: Value) -> Value:
    return elementwise(ctx, "isnan", [x], promoted_dtype(ctx, node.args[0]))


@register(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(ctx: LoweringContext, node: Node, a: Value, b: Value, *, alpha: Any = 1) -> Value:
    op = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    out = ctx.meta()

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        rhs = ctx.load(b, idx, out.shape, out.dtype)
        if alpha != 1:
            rhs = ir.call("mul", rhs, ir.const(alpha, out.dtype))
        return ir.call(op, ctx.load(a, idx, out.shape, out.dtype), rhs)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx: LoweringContext, node: Node, a: Value, b: Value, *, alpha: Any = 1) -> Value:
    out = ctx.meta()

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        lhs = ctx.load(a, idx, out.shape, out.dtype)
        if alpha != 1:
            lhs = ir.call("mul", lhs, ir.const(alpha, out.dtype))
        return ir.call("sub", ctx.load(b, idx, out.shape, out.dtype), lhs)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(ctx: LoweringContext, node: Node, a: Value, b: Value, *, rounding_mode: str | None = None) -> Value:
    out = ctx.meta()
    if rounding_mode is None:
        return elementwise(ctx, "div", [a, b])
    compute = promoted_dtype(ctx, *node.args[:2])

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        x, y = ctx.load(a, idx, out.shape, compute), ctx.load(b, idx, out.shape, compute)
        if compute.is_float:
            q = ir.call("div", x, y)
            return ir.call("floor" if rounding_mode == "floor" else "trunc", q)
        # Integer division: C truncates; floor mode adjusts when signs differ and a remainder exists.
        if rounding_mode == "trunc":
            return ir.Call("div", (x, y), compute)
        return ir.Call("floordiv", (x, y), compute)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
    out = ctx.meta()
    if isinstance(b, (int, float)) and not isinstance(b, bool) and out.dtype.is_float:
        if b == 2:
            return elementwise(ctx, "mul", [a, a])
        if b == 0.5:
            return elementwise(ctx, "sqrt", [a])
        if b == -0.5:
            return elementwise(ctx, "rsqrt", [a])
        if b == 1:
            return elementwise(ctx, "mul", [a, 1.0])
    return elementwise(ctx, "pow", [a, b])


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LoweringContext, node: Node, cond: Value, a: Value, b: Value) -> Value:
    out = ctx.meta()

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        c = ctx.load(cond, idx, out.shape, ir.DType.BOOL)
        return ir.where(c, ctx.load(a, idx, out.shape, out.dtype), ctx.load(b, idx, out.shape, out.dtype))

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.clamp.Tensor)
def _clamp(ctx: LoweringContext, node: Node, x: Value, lo: Value = None, hi: Value = None) -> Value:
    if node.target is aten.clamp_max.default:
        lo, hi = None, lo
    out = ctx.meta()

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        v = ctx.load(x, idx, out.shape, out.dtype)
        # maximum/minimum propagate NaN like torch.clamp does.
        if lo is not None:
            v = ir.call("maximum", v, ctx.load(lo, idx, out.shape, out.dtype))
        if hi is not None:
            v = ir.call("minimum", v, ctx.load(hi, idx, out.shape, out.dtype))
        return v

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.threshold_backward.default)
def _threshold_backward(ctx: LoweringContext, node: Node, grad: Value, x: Value, threshold: Any) -> Value:
    out = ctx.meta()
    compute = promoted_dtype(ctx, node.args[1])

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        below = ir.call("le", ctx.load(x, idx, out.shape, compute), ir.const(threshold, compute))
        return ir.where(below, ir.const(0, out.dtype), ctx.load(grad, idx, out.shape, out.dtype))

    return ctx.pointwise(out.shape, out.dtype, body)


# -- constants and conversions ---------------------------------------------------------------------


def _fill(ctx: LoweringContext, value: Any) -> ir.View:
    out = ctx.meta()
    if isinstance(value, float) and not out.dtype.is_float and not math.isfinite(value):
        raise LoweringError(f"cannot fill an integer tensor with {value}")
    return ctx.pointwise(out.shape, out.dtype, lambda idx: ir.const(value, out.dtype))


@register(aten.full.default)
def _full(ctx: LoweringContext, node: Node, size: Any, value: Any, **kwargs: Any) -> Value:
    return _fill(ctx, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx: LoweringContext, node: Node, value: Any, **kwargs: Any) -> Value:
    return _fill(ctx, value)


@register(aten.full_like.default)
def _full_like(ctx: LoweringContext, node: Node, x: Value, value: Any, **kwargs: Any) -> Value:
    return _fill(ctx, value)


@register(aten.zeros.default, aten.zeros_like.default)
def _zeros(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    return _fill(ctx, 0)


@register(aten.new_empty_strided.default, aten.empty_strided.default, aten.empty_permuted.default,
          aten.empty.memory_format, aten.new_empty.default, aten.empty_like.default)
def _empty_strided(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    # The contents are unspecified (the backward of an in-place assignment to a slice copies into
    # it), so zeros are one right answer; only the layout must be what was asked for.
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and not val.is_contiguous():
        raise LoweringError(f"{node.name}: {node.target} with strides {tuple(val.stride())} for shape "
                            f"{tuple(val.shape)}: only contiguous strides are supported")
    return _fill(ctx, 0)


@register(aten.ones.default, aten.ones_like.default)
def _ones(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    return _fill(ctx, 1)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    out = ctx.meta()
    if node.target is aten.arange.default:
        start, step = 0, 1
    elif node.target is aten.arange.start:
        start, step = args[0], 1
    else:
        start, step = args[0], args[2] if len(args) > 2 else kwargs.get("step", 1)
    compute = ir.DType.F32 if out.dtype.is_float or isinstance(start, float) or isinstance(step, float) else out.dtype

    def body(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        i = ir.cast(idx[0], compute)
        return ir.call("add", ir.call("mul", i, ir.const(step, compute)), ir.const(start, compute))

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten._to_copy.default, aten.clone.default, aten.lift_fresh_copy.default)
def _to_copy(ctx: LoweringContext, node: Node, x: Value, **kwargs: Any) -> Value:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        raise LoweringError(f"{node.name}: moving tensors to device {device} inside a compiled graph is not supported")
    if not isinstance(x, ir.View):
        raise LoweringError(f"{node.name}: expected a tensor")
    out = ctx.meta()
    widened = _widened_reduction(ctx, node, x, out.dtype)
    if widened is not None:
        return widened
    return ctx.pointwise(out.shape, out.dtype, lambda idx: ir.cast(x.load(idx), out.dtype))


@register(torch.ops.prims.convert_element_type.default)
def _convert_element_type(ctx: LoweringContext, node: Node, x: Value, dtype: torch.dtype) -> Value:
    return _to_copy(ctx, node, x)


def _widened_reduction(ctx: LoweringContext, node: Node, x: ir.View, dtype: ir.DType) -> ir.View | None:
    """A 16-bit reduction result that is only widened to float32 (autocast's bias gradient: a
    float16 sum cast to the float32 parameter's type): the reduction writes its float32 accumulator
    itself, so that the cast costs no kernel. Eager rounds the sum to 16 bits first; skipping that
    rounding brings the result closer to a float64 run, never further."""
    source = node.args[0]
    if not (dtype is ir.DType.F32 and x.dtype.is_half and x.is_identity() and isinstance(source, Node)
            and len(source.users) == 1):
        return None
    if not any(isinstance(n, ir.Reduction) and n.output == x.buffer and n.reduce_op == "sum" for n in ctx.graph.nodes):
        return None
    buffer = ctx.graph.buffers[x.buffer]
    widened = ir.Buffer(buffer.name, buffer.shape, ir.DType.F32)
    ctx.graph.buffers[buffer.name] = widened
    return ir.View.of(widened)


@register(torch.ops.prims.fma.default)
def _fma(ctx: LoweringContext, node: Node, a: Value, b: Value, c: Value) -> Value:
    out = ctx.meta()
    return ctx.pointwise(out.shape, out.dtype, lambda i: ir.call(
        "add", ir.call("mul", ctx.load(a, i, out.shape, out.dtype), ctx.load(b, i, out.shape, out.dtype)),
        ctx.load(c, i, out.shape, out.dtype)))


@register(aten.copy.default)
def _copy(ctx: LoweringContext, node: Node, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    """Functional copy: ``src``'s values (broadcast, cast) in ``dst``'s shape and dtype."""
    out = ctx.meta()
    return ctx.pointwise(out.shape, out.dtype, lambda i: ctx.load(src, i, out.shape, out.dtype))


@register(aten.copy_.default)
def _copy_(ctx: LoweringContext, node: Node, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    """An in-place update of a graph input (kept in the graph by AOTAutograd: an optimizer step,
    BatchNorm running statistics): the input's new value is recorded as a mutation."""
    if not isinstance(dst, ir.View) or not dst.is_identity() or dst.buffer not in ctx.graph.input_buffers():
        raise UnsupportedOpError(f"{node.name}: copy_ into anything but a whole graph input is not supported")
    out = ctx.meta()
    value = ctx.pointwise(out.shape, out.dtype, lambda i: ctx.load(src, i, out.shape, out.dtype))
    if dst.buffer in ctx.graph.mutations:
        raise UnsupportedOpError(f"{node.name}: graph input {dst.buffer} is updated twice")
    ctx.graph.mutations[dst.buffer] = value.buffer
    return value


@register(aten.round.decimals)
def _round_decimals(ctx: LoweringContext, node: Node, x: Value, *, decimals: int = 0) -> Value:
    """round(x * 10**d) / 10**d, as PyTorch computes it (dividing first for negative d)."""
    out = ctx.meta()
    scale = ir.const(10.0 ** abs(decimals), out.dtype)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        v = ctx.load(x, i, out.shape, out.dtype)
        if decimals >= 0:
            return ir.call("div", ir.call("round", ir.call("mul", v, scale)), scale)
        return ir.call("mul", ir.call("round", ir.call("div", v, scale)), scale)

    return ctx.pointwise(out.shape, out.dtype, body)
