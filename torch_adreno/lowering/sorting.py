"""Sorting and selection along a dimension: ``sort`` (and what decomposes to it: ``argsort``,
``msort``) and ``topk`` (a mixture-of-experts router's choice of experts), by ranks.

Each element's rank is the number of elements of its row that come before it in a strict total
order: by value (largest first where descending; NaN counts as larger than every number, as
eager's kernels order it), then by position. Ranks are therefore a permutation of ``0..n-1``, and
output position ``j`` holds the element of rank ``j``. Two reductions over the row (rank, then the
position of each rank) and one gather: quadratic in the row's length, which a router's handful of
experts keeps small; a 8,000-element row costs 64 million comparisons per pass.

Ties: equal values keep their order of position. This is ``torch.sort(stable=True)`` exactly;
eager's unstable sort and its ``topk`` order equal values as its C++ library's introselect leaves
them, which no specification fixes, so where values tie the indices may differ from eager's while
the values are equal. ``topk(sorted=False)`` returns them sorted (an order eager's may differ from).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.views import tensor_arg

aten = torch.ops.aten


def _before(a: ir.Expr, a_position: ir.Expr, b: ir.Expr, b_position: ir.Expr, descending: bool) -> ir.Expr:
    """Whether ``a`` (at ``a_position``) comes before ``b`` (at ``b_position``): the strict total
    order the ranks count in (see the module docstring)."""
    ahead = ir.call("gt" if descending else "lt", a, b)
    tie = ir.call("eq", a, b)
    if a.dtype.is_float:
        a_nan, b_nan = ir.call("isnan", a), ir.call("isnan", b)
        # NaN is the largest value: first when descending, last when ascending.
        nan_ahead = (ir.call("logical_and", a_nan, ir.call("logical_not", b_nan)) if descending
                     else ir.call("logical_and", ir.call("logical_not", a_nan), b_nan))
        ahead = ir.call("logical_or", nan_ahead, ahead)
        tie = ir.call("logical_or", tie, ir.call("logical_and", a_nan, b_nan))
    return ir.call("logical_or", ahead, ir.call("logical_and", tie, ir.call("lt", a_position, b_position)))


def _replaced(i: tuple[ir.Expr, ...], dim: int, value: ir.Expr) -> list[ir.Expr]:
    pos = list(i)
    pos[dim] = value
    return pos


def _ranks(ctx: LoweringContext, x: ir.View, dim: int, descending: bool) -> ir.View:
    """Per element of ``x``, how many elements of its row along ``dim`` come before it (int64)."""
    one, zero = ir.const(1, ir.DType.I64), ir.const(0, ir.DType.I64)

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        other = x.load(_replaced(i, dim, r[0]))
        return ir.where(_before(other, r[0], x.load(i), i[dim], descending), one, zero)

    return ctx.reduction(x.shape, (x.shape[dim],), "sum", ir.DType.I64, body)


def _select_by_rank(ctx: LoweringContext, x: ir.View, ranks: ir.View, dim: int, count: int,
                    values_dtype: ir.DType, indices_dtype: ir.DType) -> tuple[ir.View, ir.View]:
    """The first ``count`` elements of each row in rank order: (values, their positions)."""
    shape = _replaced_shape(x.shape, dim, count)
    zero = ir.const(0, indices_dtype)

    def position_of_rank(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        ranked = ranks.load(_replaced(i, dim, r[0]))
        # Exactly one element of the row has each rank (ranks are a permutation): a sum picks it.
        return ir.where(ir.call("eq", ranked, ir.cast(i[dim], ir.DType.I64)), ir.cast(r[0], indices_dtype), zero)

    indices = ctx.reduction(shape, (x.shape[dim],), "sum", indices_dtype, position_of_rank)
    values = ctx.pointwise(shape, values_dtype,
                           lambda i: x.load(_replaced(i, dim, ir.cast(indices.load(i), ir.DType.INDEX))))
    return values, indices


def _replaced_shape(shape: tuple[int, ...], dim: int, size: int) -> tuple[int, ...]:
    return (*shape[:dim], size, *shape[dim + 1:])


def _sorted_prefix(ctx: LoweringContext, node: Node, x: Value, dim: int, count: Callable[[int], int],
                   descending: bool) -> Value:
    src = tensor_arg(x, node.name)
    values, indices = ctx.meta(index=0), ctx.meta(index=1)
    if not src.shape:
        # A 0-dim tensor is its own sort (and its only top element), at position 0.
        return (ctx.pointwise((), values.dtype, lambda i: src.load([])),
                ctx.pointwise((), indices.dtype, lambda i: ir.const(0, indices.dtype)))
    dim %= len(src.shape)
    ranks = _ranks(ctx, src, dim, descending)
    return _select_by_rank(ctx, src, ranks, dim, count(src.shape[dim]), values.dtype, indices.dtype)


@register(aten.sort.default)
def _sort(ctx: LoweringContext, node: Node, x: Value, dim: int = -1, descending: bool = False) -> Value:
    """``torch.sort``: always stable (see the module docstring)."""
    return _sorted_prefix(ctx, node, x, dim, lambda n: n, descending)


@register(aten.sort.stable)
def _sort_stable(ctx: LoweringContext, node: Node, x: Value, *, stable: bool | None = None, dim: int = -1,
                 descending: bool = False) -> Value:
    return _sorted_prefix(ctx, node, x, dim, lambda n: n, descending)


@register(aten.topk.default)
def _topk(ctx: LoweringContext, node: Node, x: Value, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> Value:
    """``torch.topk``: the ``k`` largest (smallest) elements, always in sorted order, equal values
    by position (see the module docstring)."""
    return _sorted_prefix(ctx, node, x, dim, lambda n: k, largest)
