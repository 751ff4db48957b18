"""View ops (index maps, no IR node, no copy) and data-dependent indexing (gather, scatter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext, LoweringError, Value, register

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

    def index_at(i: Sequence[ir.Expr], j: ir.Expr) -> list[ir.Expr]:
        pos = list(i)
        pos[dim] = j
        return pos

    def in_index_range(i: Sequence[ir.Expr]) -> ir.Expr:
        cond: ir.Expr = ir.const(True, ir.DType.BOOL)
        for d, (e, size) in enumerate(zip(i, index_view.shape, strict=True)):
            if d != dim and size < out.shape[d]:
                cond = ir.call("logical_and", cond, ir.call("lt", e, ir.index(size)))
        return cond

    def src_at(pos: Sequence[ir.Expr]) -> ir.Expr:
        if isinstance(src, ir.View):
            return ir.cast(src.load(pos), out.dtype)
        return ctx.load(src, pos, (), out.dtype)

    if n_targets == 1:
        def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
            pos = index_at(i, ir.index(0))
            hit = ir.call("logical_and", in_index_range(i),
                          ir.call("eq", _as_index(index_view.load(pos), out.shape[dim]), i[dim]))
            return ir.where(hit, src_at(pos), base.load(i))

        return ctx.pointwise(out.shape, out.dtype, body)

    def last_hit(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = index_at(i, r[0])
        hit = ir.call("logical_and", in_index_range(i),
                      ir.call("eq", _as_index(index_view.load(pos), out.shape[dim]), i[dim]))
        return ir.where(hit, ir.cast(r[0], ir.DType.I64), ir.const(-1, ir.DType.I64))

    winner = ctx.reduction(out.shape, (n_targets,), "max", ir.DType.I64, last_hit)

    def body2(i: tuple[ir.Expr, ...]) -> ir.Expr:
        j = winner.load(i)
        found = ir.call("ge", j, ir.const(0, ir.DType.I64))
        return ir.where(found, src_at(index_at(i, ir.cast(j, ir.DType.INDEX))), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body2)

