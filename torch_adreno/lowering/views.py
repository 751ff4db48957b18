"""View ops (index maps, no IR node, no copy) and data-dependent indexing (gather, scatter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError, UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register

aten = torch.ops.aten


def _view(x: Value, what: str) -> ir.View:
    if not isinstance(x, ir.View):
        raise LoweringError(f"{what}: expected a tensor argument, got {type(x).__name__}")
    return x


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _reshape(ctx: LoweringContext, node: Node, x: Value, shape: Sequence[int]) -> Value:
    return _view(x, node.name).reshape(ctx.meta().shape)


@register(aten.permute.default)
def _permute(ctx: LoweringContext, node: Node, x: Value, dims: Sequence[int]) -> Value:
    return _view(x, node.name).permute(dims)


@register(aten.t.default)
def _t(ctx: LoweringContext, node: Node, x: Value) -> Value:
    v = _view(x, node.name)
    return v if len(v.shape) < 2 else v.permute([1, 0])


@register(aten.transpose.int)
def _transpose(ctx: LoweringContext, node: Node, x: Value, d0: int, d1: int) -> Value:
    v = _view(x, node.name)
    rank = len(v.shape)
    if rank == 0:
        return v
    dims = list(range(rank))
    dims[d0 % rank], dims[d1 % rank] = dims[d1 % rank], dims[d0 % rank]
    return v.permute(dims)


@register(aten.expand.default)
def _expand(ctx: LoweringContext, node: Node, x: Value, shape: Sequence[int], *, implicit: bool = False) -> Value:
    return _view(x, node.name).expand(ctx.meta().shape)


@register(aten.unsqueeze.default)
def _unsqueeze(ctx: LoweringContext, node: Node, x: Value, dim: int) -> Value:
    return _view(x, node.name).unsqueeze(dim)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(ctx: LoweringContext, node: Node, x: Value, dims: Any = None) -> Value:
    v = _view(x, node.name)
    if not v.shape:
        return v
    if isinstance(dims, int):
        dims = [dims]
    return v.squeeze(dims)


@register(aten.slice.Tensor)
def _slice(ctx: LoweringContext, node: Node, x: Value, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> Value:
    v = _view(x, node.name)
    size = v.shape[dim]
    return v.slice(dim, 0 if start is None else start, size if end is None else min(end, size), step)


@register(aten.select.int)
def _select(ctx: LoweringContext, node: Node, x: Value, dim: int, i: int) -> Value:
    return _view(x, node.name).select(dim, i)


@register(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _alias(ctx: LoweringContext, node: Node, x: Value) -> Value:
    return _view(x, node.name)


@register(aten.as_strided.default)
def _as_strided(ctx: LoweringContext, node: Node, x: Value, size: Sequence[int], stride: Sequence[int],
                offset: int | None = None) -> Value:
    # as_strided addresses the storage of its input; our buffers are contiguous, so it is only an
    # index map when the input is the whole, unviewed buffer.
    v = _view(x, node.name)
    if not v.is_identity():
        raise LoweringError(f"{node.name}: as_strided of a view is not supported; materialise the tensor first")
    flat_view = v.reshape([v.numel])
    shape = ctx.meta().shape
    placeholders = ir.placeholder_vars(shape)
    flat: ir.Expr = ir.index(offset or 0)
    for var, st in zip(placeholders, stride, strict=True):
        flat = ir.call("add", flat, ir.call("mul", var, ir.index(st)))
    return ir.View(flat_view.buffer, flat_view.buffer_shape, flat_view.dtype, tuple(shape), flat_view.at([flat]))


def _as_index(value: ir.Expr, size: int) -> ir.Expr:
    """A loaded index as a loop index; negative indices wrap like in PyTorch."""
    i = ir.cast(value, ir.DType.INDEX)
    return ir.where(ir.call("lt", i, ir.index(0)), ir.call("add", i, ir.index(size)), i)


@register(aten.gather.default)
def _gather(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, *, sparse_grad: bool = False) -> Value:
    src, index_view = _view(x, node.name), _view(idx, node.name)
    out = ctx.meta()
    dim %= max(len(src.shape), 1)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = list(i)
        if src.shape:
            pos[dim] = _as_index(index_view.load(i), src.shape[dim])
        return src.load(pos)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.index_select.default)
def _index_select(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value) -> Value:
    src, index_view = _view(x, node.name), _view(idx, node.name)
    out = ctx.meta()
    dim %= max(len(src.shape), 1)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = list(i)
        if src.shape:
            sel = index_view.load([i[dim]] if index_view.shape else [])
            pos[dim] = _as_index(sel, src.shape[dim])
        return src.load(pos)

    return ctx.pointwise(out.shape, out.dtype, body)


def _index_dim_hits(index_view: ir.View, out_shape: tuple[int, ...], dim: int, i: tuple[ir.Expr, ...],
                    j: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
    """Whether index element ``i`` with ``dim`` replaced by ``j`` targets output element ``i``."""
    pos = list(i)
    pos[dim] = j
    cond: ir.Expr = ir.call("eq", _as_index(index_view.load(pos), out_shape[dim]), i[dim])
    for d, (e, size) in enumerate(zip(i, index_view.shape, strict=True)):
        if d != dim and size < out_shape[d]:
            cond = ir.call("logical_and", ir.call("lt", e, ir.index(size)), cond)
    return cond, pos


@register(aten.scatter_add.default)
def _scatter_add(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, src: Value) -> Value:
    """``out = x``, then ``out[..., idx[..., j, ...], ...] += src[..., j, ...]``: a sum over ``j``."""
    base, index_view, values = _view(x, node.name), _view(idx, node.name), _view(src, node.name)
    out = ctx.meta()
    if not out.shape:
        raise UnsupportedOpError(f"{node.name}: scatter_add into a 0-dim tensor is not supported")
    dim %= len(out.shape)

    def contributions(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        hit, pos = _index_dim_hits(index_view, out.shape, dim, i, r[0])
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
    base, index_view = _view(x, node.name), _view(idx, node.name)
    out = ctx.meta()
    if not out.shape:
        raise LoweringError(f"{node.name}: scatter into a 0-dim tensor is not supported")
    dim %= len(out.shape)
    n_targets = index_view.shape[dim]

    def src_at(pos: Sequence[ir.Expr]) -> ir.Expr:
        if isinstance(src, ir.View):
            return ir.cast(src.load(pos), out.dtype)
        return ctx.load(src, pos, (), out.dtype)

    if n_targets == 1:
        def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
            hit, pos = _index_dim_hits(index_view, out.shape, dim, i, ir.index(0))
            return ir.where(hit, src_at(pos), base.load(i))

        return ctx.pointwise(out.shape, out.dtype, body)

    def last_hit(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        hit, _ = _index_dim_hits(index_view, out.shape, dim, i, r[0])
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
    base, values = _view(x, node.name), _view(src, node.name)
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
    base, values = _view(x, node.name), _view(src, node.name)
    out = ctx.meta()
    dim %= len(out.shape)
    if index_ < 0:
        index_ += out.shape[dim]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = list(i[:dim]) + list(i[dim + 1:])
        hit = ir.call("eq", i[dim], ir.index(index_))
        return ir.where(hit, ir.cast(values.load(pos), out.dtype), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body)
