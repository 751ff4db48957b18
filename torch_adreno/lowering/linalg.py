"""Matrix products: mm, bmm, addmm, as GEMM template nodes over (possibly transposed) views."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext, LoweringError, Value, register

aten = torch.ops.aten


def _matrix(x: Value, node: Node, rank: int) -> ir.View:
    if not isinstance(x, ir.View) or len(x.shape) != rank:
        raise LoweringError(f"{node.name}: expected a {rank}-d tensor")
    return x


def matmul(ctx: LoweringContext, a: ir.View, b: ir.View, dtype: ir.DType) -> ir.View:
    """``a @ b`` for 2-d or batched 3-d views (batch dims must match)."""
    if len(a.shape) == 2:
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise LoweringError(f"mm: shapes {a.shape} and {b.shape} do not match")
        return ctx.gemm((m, n), dtype, 1, m, n, k,
                        lambda bi, mi, ki: a.load((mi, ki)),
                        lambda bi, ki, ni: b.load((ki, ni)),
                        lambda bi, mi, ni: (mi, ni))
    (batch, m, k), (batch2, k2, n) = a.shape, b.shape
    if k != k2 or batch != batch2:
        raise LoweringError(f"bmm: shapes {a.shape} and {b.shape} do not match")
    return ctx.gemm((batch, m, n), dtype, batch, m, n, k,
                    lambda bi, mi, ki: a.load((bi, mi, ki)),
                    lambda bi, ki, ni: b.load((bi, ki, ni)),
                    lambda bi, mi, ni: (bi, mi, ni))


@register(aten.mm.default)
def _mm(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
    return matmul(ctx, _matrix(a, node, 2), _matrix(b, node, 2), ctx.meta().dtype)


@register(aten.bmm.default)
def _bmm(ctx: LoweringContext, node: Node, a: Value, b: Value) -> Value:
    return matmul(ctx, _matrix(a, node, 3), _matrix(b, node, 3), ctx.meta().dtype)


@register(aten.addmm.default)
def _addmm(ctx: LoweringContext, node: Node, bias: Value, a: Value, b: Value, *, beta: Any = 1,
           alpha: Any = 1) -> Value:
    out = ctx.meta()
    # A 16-bit result is rounded once, after the bias is added to the float32 product (as eager's
    # kernels do): the product stays float32, in registers once the add is fused into the GEMM.
    compute = out.dtype.compute
    product = matmul(ctx, _matrix(a, node, 2), _matrix(b, node, 2), compute)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        acc: ir.Expr = product.load(i)
        if alpha != 1:
            acc = ir.call("mul", acc, ir.const(alpha, compute))
        if beta == 0:
            return acc
        c = ctx.load(bias, i, out.shape, out.dtype)
        if beta != 1:
            c = ir.call("mul", c, ir.const(beta, compute))
        return ir.call("add", c, acc)

    return ctx.pointwise(out.shape, out.dtype, body)
