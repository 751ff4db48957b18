"""Reductions over dimensions: sum, mean, prod, amax/amin, argmax/argmin, max/min with indices."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext, LoweringError, Value, register

aten = torch.ops.aten


def normalize_dims(dims: Any, rank: int) -> list[int]:
    """Reduction dims as sorted non-negative ints; None or [] means all dims."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(rank, 1) for d in dims}) if rank else []


def reduce_dims(
    ctx: LoweringContext,
    x: ir.View,
    dims: Sequence[int],
    reduce_op: str,
    dtype: ir.DType,
    out_shape: Sequence[int],
    value: Callable[[ir.Expr], ir.Expr] = lambda e: e,
) -> ir.View:
    """Reduce ``x`` over ``dims`` with ``reduce_op``; the result is viewed as ``out_shape``.

    ``value`` maps each loaded element before it is reduced (e.g. a cast).
    """
    kept = [d for d in range(len(x.shape)) if d not in dims]
    moved = x.permute(kept + list(dims)) if x.shape else x
    kept_shape = [x.shape[d] for d in kept]
    red_shape = [x.shape[d] for d in dims]

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        return value(moved.load(tuple(i) + tuple(r)))

    result = ctx.reduction(kept_shape, red_shape, reduce_op, dtype, body)
    return result.reshape(out_shape) if tuple(out_shape) != tuple(kept_shape) else result


def _tensor(x: Value, node: Node) -> ir.View:
    if not isinstance(x, ir.View):
        raise LoweringError(f"{node.name}: expected a tensor argument")
    return x


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: LoweringContext, node: Node, x: Value, dims: Any = None, keepdim: bool = False, *,
         dtype: Any = None) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    return reduce_dims(ctx, v, normalize_dims(dims, len(v.shape)), "sum", out.dtype, out.shape,
                       lambda e: ir.cast(e, out.dtype))


@register(aten.prod.default, aten.prod.dim_int)
def _prod(ctx: LoweringContext, node: Node, x: Value, dim: Any = None, keepdim: bool = False, *,
          dtype: Any = None) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    return reduce_dims(ctx, v, normalize_dims(dim, len(v.shape)), "prod", out.dtype, out.shape,
                       lambda e: ir.cast(e, out.dtype))


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: LoweringContext, node: Node, x: Value, dims: Any = None, keepdim: bool = False, *,
          dtype: Any = None) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    red = normalize_dims(dims, len(v.shape))
    count = math.prod(v.shape[d] for d in red)
    # A 16-bit mean is rounded once: the sum stays float32 (in registers when the division fuses).
    compute = out.dtype.compute
    total = reduce_dims(ctx, v, red, "sum", compute, out.shape, lambda e: ir.cast(e, compute))
    return ctx.pointwise(out.shape, out.dtype,
                         lambda i: ir.call("div", total.load(i), ir.const(count, compute)))


@register(aten.amax.default, aten.amin.default)
def _amax(ctx: LoweringContext, node: Node, x: Value, dims: Any = (), keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    op = "max" if node.target is aten.amax.default else "min"
    return reduce_dims(ctx, v, normalize_dims(dims, len(v.shape)), op, out.dtype, out.shape)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any_all(ctx: LoweringContext, node: Node, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    op = "any" if node.target in (aten.any.default, aten.any.dim, aten.any.dims) else "all"
    return reduce_dims(ctx, v, normalize_dims(dims, len(v.shape)), op, out.dtype, out.shape,
                       lambda e: ir.cast(e, ir.DType.BOOL))


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx: LoweringContext, node: Node, x: Value, dim: int | None = None, keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    op = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None:
        flat = v.reshape([v.numel])
        return reduce_dims(ctx, flat, [0], op, out.dtype, out.shape)
    return reduce_dims(ctx, v, normalize_dims(dim, len(v.shape)), op, out.dtype, out.shape)


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx: LoweringContext, node: Node, x: Value, dim: int, keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    values, indices = ctx.meta(index=0), ctx.meta(index=1)
    dims = normalize_dims(dim, len(v.shape))
    best = "max" if node.target is aten.max.dim else "min"
    return (
        reduce_dims(ctx, v, dims, best, values.dtype, values.shape),
        reduce_dims(ctx, v, dims, "arg" + best, indices.dtype, indices.shape),
    )


def _variance(ctx: LoweringContext, x: ir.View, dims: list[int], correction: float, out_shape: Sequence[int],
              dtype: ir.DType) -> tuple[ir.View, ir.View]:
    """Variance and mean over ``dims``, two-pass (mean first, then squared deviations): exact to
    float rounding where the one-pass E[x^2] - E[x]^2 cancels catastrophically."""
    count = math.prod(x.shape[d] for d in dims) if x.shape else 1
    # 16-bit results: every intermediate is float32, the variance and mean rounded once each.
    result_dtype, dtype = dtype, dtype.compute
    total = reduce_dims(ctx, x, dims, "sum", dtype, out_shape, lambda e: ir.cast(e, dtype))
    mean = ctx.pointwise(out_shape, dtype, lambda i: ir.call("div", total.load(i), ir.const(count, dtype)))
    kept = [d for d in range(len(x.shape)) if d not in dims]
    moved = x.permute(kept + list(dims)) if x.shape else x
    mean_rows = mean.reshape([x.shape[d] for d in kept])

    def squared_deviation(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        d = ir.call("sub", ir.cast(moved.load(tuple(i) + tuple(r)), dtype), mean_rows.load(i))
        return ir.call("mul", d, d)

    squares = ctx.reduction([x.shape[d] for d in kept], [x.shape[d] for d in dims], "sum", dtype, squared_deviation)
    squares = squares.reshape(out_shape)
    denominator = max(count - correction, 0)
    var = ctx.pointwise(out_shape, result_dtype,
                        lambda i: ir.call("div", squares.load(i), ir.const(denominator, dtype)))
    if result_dtype is not dtype:
        mean = ctx.pointwise(out_shape, result_dtype, lambda i: mean.load(i))
    return var, mean


def _correction(kwargs_correction: Any, unbiased: Any = None) -> float:
    if kwargs_correction is not None:
        return float(kwargs_correction)
    return 1.0 if unbiased is None or unbiased else 0.0


@register(aten.var.correction, aten.std.correction)
def _var(ctx: LoweringContext, node: Node, x: Value, dims: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    if node.target is aten.std.correction:
        # (a 16-bit standard deviation: the square root of the float32 variance, rounded once)
        var, _ = _variance(ctx, v, normalize_dims(dims, len(v.shape)), _correction(correction), out.shape,
                           out.dtype.compute)
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.call("sqrt", var.load(i)))
    var, _ = _variance(ctx, v, normalize_dims(dims, len(v.shape)), _correction(correction), out.shape, out.dtype)
    return var


@register(aten.var_mean.correction)
def _var_mean(ctx: LoweringContext, node: Node, x: Value, dims: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> Value:
    v = _tensor(x, node)
    out = ctx.meta(index=0)
    return _variance(ctx, v, normalize_dims(dims, len(v.shape)), _correction(correction), out.shape, out.dtype)


@register(aten.max.default, aten.min.default)
def _max_all(ctx: LoweringContext, node: Node, x: Value) -> Value:
    v = _tensor(x, node)
    out = ctx.meta()
    op = "max" if node.target is aten.max.default else "min"
    return reduce_dims(ctx, v, list(range(len(v.shape))), op, out.dtype, out.shape)


@register(aten.cumsum.default, aten.cumprod.default)
def _scan(ctx: LoweringContext, node: Node, x: Value, dim: int, *, dtype: Any = None) -> Value:
    """Inclusive prefix sum or product along ``dim``: a reduction over the elements up to each
    position (quadratic in the scanned length, exact in order like PyTorch's sequential scan is
    not: sums reassociate)."""
    v = _tensor(x, node)
    out = ctx.meta()
    if not v.shape:
        return ctx.pointwise((), out.dtype, lambda i: ir.cast(v.load([]), out.dtype))
    dim %= len(v.shape)
    op = "sum" if node.target is aten.cumsum.default else "prod"
    identity = ir.const(0 if op == "sum" else 1, out.dtype)

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = list(i)
        pos[dim] = r[0]
        return ir.where(ir.call("le", r[0], i[dim]), ir.cast(v.load(pos), out.dtype), identity)

    return ctx.reduction(out.shape, (v.shape[dim],), op, out.dtype, body)
