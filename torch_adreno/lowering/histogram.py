"""Histograms: ``histc``, which transformers' grouped mixture-of-experts path uses to count the
tokens routed to each expert (its float expert ids into ``num_experts`` bins).

Binned as eager's CPU kernel bins, in the input's type (a 16-bit input's every step rounded to
it, as ``c10::Half`` arithmetic rounds): an element ``v`` within ``[lo, hi]``
falls in bin ``trunc((v - lo) * bins / (hi - lo))``, the last bin including its right edge; NaN
and elements outside the range are not counted. Where ``min == max`` the range is the data's (its
minimum and maximum, widened by 1 each way where they are equal), found on the device; a range
that is then not finite raises eager's RuntimeError at the host's next wait, as eager raises it.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.index_checks import always_zero, value_check
from torch_adreno.lowering.views import tensor_arg

aten = torch.ops.aten

I64 = ir.DType.I64


def _data_range(ctx: LoweringContext, flat: ir.View) -> tuple[ir.Expr, ir.Expr, ir.Expr]:
    """``(lo, hi, check)``: the data's range as eager widens it, and the check that it is finite."""
    smallest = ctx.reduction((), flat.shape, "min", flat.dtype, lambda i, r: flat.load(r))
    largest = ctx.reduction((), flat.shape, "max", flat.dtype, lambda i, r: flat.load(r))
    lo, hi = smallest.load([]), largest.load([])
    one, zero = ir.const(1.0, flat.dtype), ir.const(0.0, flat.dtype)
    same = ir.call("eq", lo, hi)
    # (x - x is 0 for a finite x, NaN for an infinity or a NaN; the min and max reductions keep NaN)
    finite = ir.call("logical_and", ir.call("eq", ir.call("sub", lo, lo), zero),
                     ir.call("eq", ir.call("sub", hi, hi), zero))
    check = value_check(ctx, ir.call("logical_not", finite), "RuntimeError",
                        "torch.histc: range of [min, max] is not finite (min == max takes the range from the data, "
                        "which holds an infinity or NaN)")
    return ir.where(same, ir.call("sub", lo, one), lo), ir.where(same, ir.call("add", hi, one), hi), check


@register(aten.histc.default)
def _histc(ctx: LoweringContext, node: Node, x: Value, bins: int = 100, min: float = 0, max: float = 0) -> Value:
    src = tensor_arg(x, node.name)
    out = ctx.meta()
    if not src.numel:
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.const(0, out.dtype))
    flat = src.reshape([src.numel]) if src.shape else src.reshape([1])
    dtype = flat.dtype
    check: ir.Expr | None = None
    if min == max:
        lo, hi, check = _data_range(ctx, flat)
    else:
        # (rounded to the input's type, as the first and last of eager's linspace edges are)
        lo, hi = ir.const(float(min), dtype), ir.const(float(max), dtype)

    def bin_of_element(i: tuple[ir.Expr, ...]) -> ir.Expr:
        v = flat.load(i)
        inside = ir.call("logical_and", ir.call("ge", v, lo), ir.call("le", v, hi))
        scaled = ir.call("div", ir.call("mul", ir.call("sub", v, lo), ir.const(float(bins), dtype)),
                         ir.call("sub", hi, lo))
        # (trunc of a value in [0, bins]; the last bin includes its right edge)
        which = ir.where(inside, ir.call("minimum", ir.cast(scaled, I64), ir.const(bins - 1, I64)),
                         ir.const(-1, I64))
        return which if check is None else ir.call("add", which, always_zero(check, I64))

    positions = ctx.pointwise(flat.shape, I64, bin_of_element)
    counted = out.dtype.compute
    return ctx.reduction(out.shape, flat.shape, "sum", out.dtype, lambda i, r: ir.where(
        ir.call("eq", positions.load(r), ir.cast(i[0], I64)), ir.const(1.0, counted), ir.const(0.0, counted)))
