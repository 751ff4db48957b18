"""Scatters: a copy of the input with some elements replaced or added to (the backward of
gathers, slices, selects and strided views), each lowered from the output's side as a pointwise
node, with a reduction first where several sources can aim at one element."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.index_checks import as_index
from torch_adreno.lowering.views import tensor_arg

aten = torch.ops.aten


# An empty index scatters nothing, whatever its rank (eager accepts an empty index of another rank
# than the input's, e.g. the backward of gathering a 1-d input with a [2, 0] index): the result is
# the input, and the index, having no element along some dimension, must not be read.


def _index_dim_hits(ctx: LoweringContext, index_view: ir.View, out_shape: tuple[int, ...], dim: int,
                    i: tuple[ir.Expr, ...], j: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
    """Whether index element ``i`` with ``dim`` replaced by ``j`` targets output element ``i``."""
    pos = list(i)
    pos[dim] = j
    target = as_index(ctx, index_view.load(pos), out_shape[dim], dim, wraps=False, error="RuntimeError")
    cond: ir.Expr = ir.call("eq", target, i[dim])
    for d, (e, size) in enumerate(zip(i, index_view.shape, strict=True)):
        if d != dim and size < out_shape[d]:
            cond = ir.call("logical_and", ir.call("lt", e, ir.index(size)), cond)
    return cond, pos


@register(aten.scatter_add.default)
def _scatter_add(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, src: Value) -> Value:
    """``out = x``, then ``out[..., idx[..., j, ...], ...] += src[..., j, ...]``: a sum over ``j``."""
    base, index_view, values = tensor_arg(x, node.name), tensor_arg(idx, node.name), tensor_arg(src, node.name)
    out = ctx.meta()
    if not math.prod(index_view.shape):
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.cast(base.load(i), out.dtype))
    if not out.shape:
        # Into a 0-dim tensor: every index element is 0 (or -1); each adds its source element.
        def scalar_contributions(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
            pos = list(r) if index_view.shape else []
            target = as_index(ctx, index_view.load(pos), 1, 0, wraps=False, error="RuntimeError")
            hit = ir.call("eq", target, ir.index(0))
            value = values.load(pos if values.shape else [])
            return ir.where(hit, ir.cast(value, out.dtype), ir.const(0, out.dtype))

        total = ctx.reduction((), index_view.shape or (1,), "sum", out.dtype, scalar_contributions)
        return ctx.pointwise((), out.dtype, lambda i: ir.call("add", base.load([]), total.load([])))
    dim %= len(out.shape)

    def contributions(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        hit, pos = _index_dim_hits(ctx, index_view, out.shape, dim, i, r[0])
        return ir.where(hit, ir.cast(values.load(pos), out.dtype), ir.const(0, out.dtype))

    added = ctx.reduction(out.shape, (index_view.shape[dim],), "sum", out.dtype, contributions)
    return ctx.pointwise(out.shape, out.dtype, lambda i: ir.call("add", base.load(i), added.load(i)))


@register(aten.scatter.value, aten.scatter.src)
def _scatter(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, src: Value) -> Value:
    """``out = x`` with ``out[..., idx[..., j, ...], ...] = src[..., j, ...]`` along ``dim``.

    Lowered as a gather from the output's side: where the scatter dimension of ``idx`` has size 1
    this is one pointwise node; otherwise a reduction first finds, per output element, the last
    ``j`` that targets it (PyTorch leaves the winner of duplicates unspecified).
    """
    base, index_view = tensor_arg(x, node.name), tensor_arg(idx, node.name)
    out = ctx.meta()
    if not math.prod(index_view.shape):
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.cast(base.load(i), out.dtype))
    if not out.shape:
        # A 0-dim scatter writes the single element when its 0-dim index says 0 (or -1).
        def scalar(i: tuple[ir.Expr, ...]) -> ir.Expr:
            if isinstance(src, ir.View):
                value = ir.cast(src.load([]), out.dtype)
            else:
                assert isinstance(src, (int, float, bool)), "scatter's value is a tensor or a number"
                value = ir.const(src, out.dtype)
            target = as_index(ctx, index_view.load([]), 1, 0, wraps=False, error="RuntimeError")
            return ir.where(ir.call("eq", target, ir.index(0)), value, base.load([]))

        return ctx.pointwise((), out.dtype, scalar)
    dim %= len(out.shape)
    n_targets = index_view.shape[dim]

    def src_at(pos: Sequence[ir.Expr]) -> ir.Expr:
        if isinstance(src, ir.View):
            return ir.cast(src.load(pos), out.dtype)
        return ctx.load(src, pos, (), out.dtype)

    if n_targets == 1:
        def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
            hit, pos = _index_dim_hits(ctx, index_view, out.shape, dim, i, ir.index(0))
            return ir.where(hit, src_at(pos), base.load(i))

        return ctx.pointwise(out.shape, out.dtype, body)

    def last_hit(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        hit, _ = _index_dim_hits(ctx, index_view, out.shape, dim, i, r[0])
        return ir.where(hit, ir.cast(r[0], ir.DType.I64), ir.const(-1, ir.DType.I64))

    winner = ctx.reduction(out.shape, (n_targets,), "max", ir.DType.I64, last_hit)

    def body2(i: tuple[ir.Expr, ...]) -> ir.Expr:
        j = winner.load(i)
        pos = list(i)
        pos[dim] = ir.cast(j, ir.DType.INDEX)
        return ir.where(ir.call("ge", j, ir.const(0, ir.DType.I64)), src_at(pos), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body2)


@register(aten.slice_scatter.default)
def _slice_scatter(ctx: LoweringContext, node: Node, x: Value, src: Value, dim: int = 0, start: int | None = None,
                   end: int | None = None, step: int = 1) -> Value:
    """``x`` with ``x[..., start:end:step, ...] = src`` (the backward of slicing)."""
    base, values = tensor_arg(x, node.name), tensor_arg(src, node.name)
    out = ctx.meta()
    dim %= len(out.shape)
    size = out.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    lo = max(0, min(size, lo))
    count = values.shape[dim]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        offset = ir.call("sub", i[dim], ir.index(lo))
        conds = [ir.call("ge", offset, ir.index(0)), ir.call("lt", offset, ir.index(count * step))]
        if step > 1:
            conds.append(ir.call("eq", ir.call("mod", offset, ir.index(step)), ir.index(0)))
        inside: ir.Expr = conds[0]
        for c in conds[1:]:
            inside = ir.call("logical_and", inside, c)
        pos = list(i)
        pos[dim] = ir.call("floordiv", offset, ir.index(step))
        return ir.where(inside, ir.cast(values.load(pos), out.dtype), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.select_scatter.default)
def _select_scatter(ctx: LoweringContext, node: Node, x: Value, src: Value, dim: int, index_: int) -> Value:
    """``x`` with ``x.select(dim, index) = src`` (the backward of select)."""
    base, values = tensor_arg(x, node.name), tensor_arg(src, node.name)
    out = ctx.meta()
    dim %= len(out.shape)
    if index_ < 0:
        index_ += out.shape[dim]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = list(i[:dim]) + list(i[dim + 1:])
        hit = ir.call("eq", i[dim], ir.index(index_))
        return ir.where(hit, ir.cast(values.load(pos), out.dtype), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx: LoweringContext, node: Node, x: Value, src: Value, size: Sequence[int],
                        stride: Sequence[int], storage_offset: int | None = None) -> Value:
    """``x`` with ``x.as_strided(size, stride, offset) = src`` (the backward of ``as_strided``).

    ``x`` is laid out row-major (the graph's tensor is checked to be), so an output element's
    storage position is its row-major offset ``p``; it is written when ``p - offset`` decomposes as
    ``sum(i_d * stride_d)`` with ``0 <= i_d < size_d``. The view must not overlap itself: then,
    taking the dimensions by decreasing stride, each ``i_d`` is the quotient of what is left (every
    stride exceeds the reach of the smaller ones) and the decomposition is unique.
    """
    base, values = tensor_arg(x, node.name), tensor_arg(src, node.name)
    out = ctx.meta()
    source = node.args[0]
    traced = source.meta.get("val") if isinstance(source, Node) else None
    if not isinstance(traced, torch.Tensor) or not traced.is_contiguous():
        raise LoweringError(f"{node.name}: as_strided_scatter into a tensor that is not laid out row-major is "
                            "not supported; make the input contiguous first")
    offset = int(storage_offset or 0)
    dims = sorted((d for d, s in enumerate(size) if s > 1), key=lambda d: -stride[d])
    reach = 0
    for d in reversed(dims):
        if stride[d] <= reach:
            raise LoweringError(f"{node.name}: as_strided_scatter through a view that overlaps itself (size "
                                f"{list(size)}, stride {list(stride)}) has no single value per element; "
                                "write the elements with index_put or scatter instead")
        reach += stride[d] * (size[d] - 1)
    out_strides = ir.contiguous_strides(out.shape)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        flat: ir.Expr = ir.index(0)
        for e, st in zip(i, out_strides, strict=True):
            flat = ir.call("add", flat, ir.call("mul", e, ir.index(st)))
        rest = ir.call("sub", flat, ir.index(offset))
        inside: ir.Expr = ir.call("ge", rest, ir.index(0))
        pos: list[ir.Expr] = [ir.index(0)] * len(size)
        for d in dims:
            q = ir.call("floordiv", rest, ir.index(stride[d]))
            inside = ir.call("logical_and", inside, ir.call("lt", q, ir.index(size[d])))
            pos[d] = q
            rest = ir.call("mod", rest, ir.index(stride[d]))
        inside = ir.call("logical_and", inside, ir.call("eq", rest, ir.index(0)))
        if not values.numel:
            return base.load(i)
        return ir.where(inside, ir.cast(values.load(pos), out.dtype), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body)


#: scatter_reduce's reductions: the IR reduction over the sources aimed at an element...
_SCATTER_REDUCTIONS = {"sum": "sum", "mean": "sum", "prod": "prod", "amax": "max", "amin": "min"}
#: ...and the IR op folding the element's own value into it (include_self).
_COMBINE_WITH_SELF = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def _neutral(reduce_op: str, dtype: ir.DType) -> ir.Expr:
    """The value a source that misses an element contributes to its reduction."""
    if reduce_op == "sum":
        return ir.const(0, dtype)
    if reduce_op == "prod":
        return ir.const(1, dtype)
    low = reduce_op == "max"
    if dtype.is_float:
        return ir.const(float("-inf") if low else float("inf"), dtype)
    if dtype is ir.DType.BOOL:
        return ir.const(not low, dtype)
    bits = 8 * dtype.itemsize
    if dtype is ir.DType.U8:
        return ir.const(0 if low else 255, dtype)
    return ir.const(-(2 ** (bits - 1)) if low else 2 ** (bits - 1) - 1, dtype)


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, src: Value, reduce: str, *,
                    include_self: bool = True) -> Value:
    """``out = x`` with each element aimed at by ``idx`` along ``dim`` replaced by the reduction
    ("sum", "prod", "mean", "amax", "amin") of the sources aimed at it, and of its own value where
    ``include_self``. A mean divides by the number of values reduced (integers: rounding down)."""
    if reduce not in _SCATTER_REDUCTIONS:
        raise LoweringError(f"{node.name}: scatter_reduce with reduce={reduce!r} (expected one of "
                            f"{', '.join(_SCATTER_REDUCTIONS)})")
    base, index_view, values = tensor_arg(x, node.name), tensor_arg(idx, node.name), tensor_arg(src, node.name)
    out = ctx.meta()
    if not math.prod(index_view.shape):
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.cast(base.load(i), out.dtype))
    reduce_op = _SCATTER_REDUCTIONS[reduce]
    compute = out.dtype.compute
    shape = out.shape or (1,)
    # (A 0-dim scatter is one of a single element: every index must be 0.)
    base_1d = base if out.shape else base.reshape([1])
    index_1d = index_view if index_view.shape else index_view.reshape([1])
    values_1d = values if values.shape else values.reshape([1])
    dim = dim % len(shape)
    n_sources = index_1d.shape[dim]

    def hit(i: tuple[ir.Expr, ...], j: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
        return _index_dim_hits(ctx, index_1d, shape, dim, i, j)

    def contribution(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        cond, pos = hit(i, r[0])
        return ir.where(cond, ir.cast(values_1d.load(pos), compute), _neutral(reduce_op, compute))

    def counted(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        cond, _ = hit(i, r[0])
        return ir.cast(cond, ir.DType.I64)

    reduced = ctx.reduction(shape, (n_sources,), reduce_op, compute, contribution)
    count = ctx.reduction(shape, (n_sources,), "sum", ir.DType.I64, counted)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        own = ir.cast(base_1d.load(i), compute)
        value: ir.Expr = reduced.load(i)
        if include_self:
            value = ir.call(_COMBINE_WITH_SELF[reduce_op], own, value)
        n = count.load(i)
        if reduce == "mean":
            total = ir.cast(ir.call("add", n, ir.const(int(include_self), ir.DType.I64)), compute)
            value = ir.call("floordiv" if not compute.is_float else "div", value, total)
        return ir.where(ir.call("gt", n, ir.const(0, ir.DType.I64)), value, own)

    result = ctx.pointwise(shape, out.dtype, body)
    return result if out.shape else result.reshape([])
