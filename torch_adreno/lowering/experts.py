"""Grouped matrix products: the experts of a mixture-of-experts layer, each multiplying its own
contiguous group of rows (tokens sorted by expert), the group ends given by a tensor ``offs``.

Two spellings reach the backend. ``aten._grouped_mm`` (``torch.nn.functional.grouped_mm``; what
transformers' default ``experts_implementation="grouped_mm"`` calls under ``torch.compile`` for
bfloat16 weights; its backward is ``_grouped_mm`` again), and transformers' own custom op
``transformers::grouped_mm_fallback`` with its backward ``grouped_mm_fallback_backward`` (what that
path calls for float32 and float16 weights). Both are lowered here; the custom ops by name (see
``context.LOWERINGS_BY_NAME``), so that the backend need not import transformers.

The group sizes are tensor values while kernels are compiled for static shapes, so each product is
one ordinary GEMM whose operand is masked by group: a row's group is the number of group ends at or
before it (rows past the last end belong to none and come out 0, as transformers' op makes them;
torch's CPU kernel leaves them uninitialised), and

* rows by group (``[S, K] x [E, K, N] -> [S, N]``): the reduction runs over ``E * K``, the row's
  input placed in its group's K slice and zeros elsewhere, against the stacked expert matrices read
  in place (columns by group, ``[E, M, K] x [K, N] -> [M, N]``, likewise);
* per group sums (``[M, T] x [T, N] -> [E, M, N]``, the expert weight gradient): one GEMM per
  group, each over all ``T`` rows, the rows of other groups zeroed.

The arithmetic is therefore ``E`` times the grouped product's (every row meets every expert, the
others as zeros), in the template's tiles, with nothing materialised beyond the result: the cost a
few experts afford (a Mixtral's 8), where a many-expert model (64 or 128 experts) wants a grouped
kernel that skips the other groups' tiles, which this backend does not have yet. The zeros change
no rounding: each result is its group's product, summed in the template's order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError, UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register, register_by_name
from torch_adreno.lowering.views import tensor_arg

aten = torch.ops.aten

I64 = ir.DType.I64
Element = Callable[[ir.Expr, ir.Expr, ir.Expr], ir.Expr]


def _groups(ctx: LoweringContext, offs: ir.View, length: int) -> ir.View:
    """Per position ``t`` of the grouped dimension, its group: the number of group ends
    ``offs[e] <= t`` (``len(offs)`` past the last end)."""
    if len(offs.shape) != 1 or offs.dtype not in (ir.DType.I32, I64):
        raise LoweringError(f"grouped matrix product: offs must be a 1-d int32 or int64 tensor, got "
                            f"{offs.dtype.name}{list(offs.shape)}")
    return ctx.reduction((length,), offs.shape, "sum", I64, lambda i, r: ir.cast(
        ir.call("le", ir.cast(offs.load(r), I64), ir.cast(i[0], I64)), I64))


def _in_group(groups: ir.View, position: ir.Expr, group: ir.Expr) -> ir.Expr:
    return ir.call("eq", groups.load([position]), ir.cast(group, I64))


def _masked(cond: ir.Expr, value: ir.Expr) -> ir.Expr:
    return ir.where(cond, value, ir.const(0, value.dtype))


def _rows_by_group(ctx: LoweringContext, rows: ir.View, expert: Element, groups: ir.View, experts: int, n: int,
                   dtype: ir.DType) -> ir.View:
    """``out[s, :] = rows[s, :] @ W[g(s)]`` with ``W[e][k, j] = expert(e, k, j)``: one GEMM over
    ``experts * K``, each row's input in its group's slice."""
    s, k = rows.shape

    def lhs(b: ir.Expr, m: ir.Expr, kk: ir.Expr) -> ir.Expr:
        group, inner = ir.call("floordiv", kk, ir.index(k)), ir.call("mod", kk, ir.index(k))
        return _masked(_in_group(groups, m, group), rows.load([m, inner]))

    def rhs(b: ir.Expr, kk: ir.Expr, j: ir.Expr) -> ir.Expr:
        return expert(ir.call("floordiv", kk, ir.index(k)), ir.call("mod", kk, ir.index(k)), j)

    return ctx.gemm((s, n), dtype, 1, s, n, experts * k, lhs, rhs, lambda b, m, j: (m, j))


def _per_group_sums(ctx: LoweringContext, lhs: ir.View, rhs: ir.View, groups: ir.View, experts: int,
                    dtype: ir.DType) -> ir.View:
    """``out[e] = lhs[:, group e] @ rhs[group e, :]`` for ``lhs [M, T]``, ``rhs [T, N]``, the groups
    along ``T``: a batch of GEMMs over all ``T``, the other groups' terms zeroed."""
    (m, t), (_, n) = lhs.shape, rhs.shape
    return ctx.gemm((experts, m, n), dtype, experts, m, n, t,
                    lambda b, i, kk: _masked(_in_group(groups, kk, b), lhs.load([i, kk])),
                    lambda b, kk, j: rhs.load([kk, j]),
                    lambda b, i, j: (b, i, j))


def _columns_by_group(ctx: LoweringContext, lhs: ir.View, rhs: ir.View, groups: ir.View, dtype: ir.DType) -> ir.View:
    """``out[:, n] = lhs[g(n)] @ rhs[:, n]`` for ``lhs [E, M, K]``, ``rhs [K, N]``, the groups along
    ``N``: one GEMM over ``E * K``, each column's input in its group's slice."""
    experts, m, k = lhs.shape
    n = rhs.shape[1]

    def left(b: ir.Expr, i: ir.Expr, kk: ir.Expr) -> ir.Expr:
        return lhs.load([ir.call("floordiv", kk, ir.index(k)), i, ir.call("mod", kk, ir.index(k))])

    def right(b: ir.Expr, kk: ir.Expr, j: ir.Expr) -> ir.Expr:
        group, inner = ir.call("floordiv", kk, ir.index(k)), ir.call("mod", kk, ir.index(k))
        return _masked(_in_group(groups, j, group), rhs.load([inner, j]))

    return ctx.gemm((m, n), dtype, 1, m, n, experts * k, left, right, lambda b, i, j: (i, j))


def _weights(w: ir.View) -> Element:
    return lambda e, k, j: w.load([e, k, j])


@register(aten._grouped_mm.default)
def _grouped_mm(ctx: LoweringContext, node: Node, a: Value, b: Value, offs: Value = None, bias: Value = None,
                out_dtype: Any = None) -> Value:
    """``torch._grouped_mm`` in its four forms: 2-d x 3-d (rows by group), 2-d x 2-d (per group
    sums along the shared dimension), 3-d x 2-d (columns by group), 3-d x 3-d (a batched product)."""
    left, right = tensor_arg(a, node.name), tensor_arg(b, node.name)
    out = ctx.meta()
    if bias is not None:
        raise UnsupportedOpError("a bias is not supported (eager's CPU kernel refuses it too); add it after the product")
    if len(left.shape) == 3 and len(right.shape) == 3:
        batch, m, k = left.shape
        n = right.shape[2]
        return ctx.gemm(out.shape, out.dtype, batch, m, n, k, lambda e, i, kk: left.load([e, i, kk]),
                        lambda e, kk, j: right.load([e, kk, j]), lambda e, i, j: (e, i, j))
    if not isinstance(offs, ir.View):
        raise LoweringError(f"{node.name}: a grouped product of a 2-d operand needs offs")
    if len(left.shape) == 2 and len(right.shape) == 3:
        groups = _groups(ctx, offs, left.shape[0])
        return _rows_by_group(ctx, left, _weights(right), groups, right.shape[0], right.shape[2], out.dtype)
    if len(left.shape) == 2:
        groups = _groups(ctx, offs, left.shape[1])
        return _per_group_sums(ctx, left, right, groups, offs.shape[0], out.dtype)
    return _columns_by_group(ctx, left, right, _groups(ctx, offs, right.shape[1]), out.dtype)


@register_by_name("transformers.grouped_mm_fallback.default")
def _transformers_grouped_mm(ctx: LoweringContext, node: Node, x: Value, weight: Value, offs: Value) -> Value:
    """transformers' ``grouped_mm_fallback(input [S, K], weight [E, K, N], offs)``: rows by group."""
    rows, w, ends = (tensor_arg(v, node.name) for v in (x, weight, offs))
    groups = _groups(ctx, ends, rows.shape[0])
    return _rows_by_group(ctx, rows, _weights(w), groups, w.shape[0], w.shape[2], ctx.meta().dtype)


@register_by_name("transformers.grouped_mm_fallback_backward.default")
def _transformers_grouped_mm_backward(ctx: LoweringContext, node: Node, x: Value, weight: Value, offs: Value,
                                      grad_output: Value) -> Value:
    """Its backward: ``(grad_input [S, K], grad_weight [E, K, N])``, rows by group against the
    transposed experts and per group sums of ``input^T grad_output``."""
    rows, w, ends, grad = (tensor_arg(v, node.name) for v in (x, weight, offs, grad_output))
    groups = _groups(ctx, ends, rows.shape[0])
    experts, k, _ = w.shape
    grad_input = _rows_by_group(ctx, grad, lambda e, j, i: w.load([e, i, j]), groups, experts, k,
                                ctx.meta(index=0).dtype)
    grad_weight = _per_group_sums(ctx, rows.permute([1, 0]), grad, groups, experts, ctx.meta(index=1).dtype)
    return grad_input, grad_weight
