"""Max pooling with indices and its backward, as reductions over the pooling window."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.conv import ConvGeometry, unravel

aten = torch.ops.aten


def _per_dim(values: Any, n: int, default: Sequence[int]) -> list[int]:
    if values is None or (isinstance(values, (list, tuple)) and len(values) == 0):
        return list(default)
    if isinstance(values, int):
        return [values] * n
    values = list(values)
    return values * n if len(values) == 1 else values


def _window_geometry(x: ir.View, kernel: Any, stride: Any, padding: Any, dilation: Any,
                     out_spatial: Sequence[int]) -> ConvGeometry:
    spatial = len(x.shape) - 2
    k = _per_dim(kernel, spatial, [1] * spatial)
    geo = ConvGeometry([x.shape[0], x.shape[1], *x.shape[2:]], [x.shape[1], 1, *k],
                       _per_dim(stride, spatial, k), _per_dim(padding, spatial, [0] * spatial),
                       _per_dim(dilation, spatial, [1] * spatial), 1)
    # ceil_mode can add a last window; the traced output shape is authoritative.
    geo.out = list(out_spatial)
    geo.positions = math.prod(geo.out)
    return geo


def _leading(x: ir.View) -> tuple[list[int], int]:
    """Shape of the leading (batch, channel) dims; 3-d inputs are unbatched (C, H, W)."""
    lead = len(x.shape) - 2
    return list(x.shape[:lead]), lead


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(ctx: LoweringContext, node: Node, x: Value, kernel: Any, stride: Any = (),
                             padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Value:
    if not isinstance(x, ir.View) or len(x.shape) not in (3, 4):
        raise UnsupportedOpError(f"{node.name}: max_pool2d needs a 3-d or 4-d input")
    values_meta, indices_meta = ctx.meta(index=0), ctx.meta(index=1)
    _, lead = _leading(x)
    spatial_in = list(x.shape[lead:])
    geo = _window_geometry(x.reshape([1, 1, *spatial_in]) if lead == 0 else x, kernel, stride, padding,
                           dilation, values_meta.shape[lead:])
    lowest = ir.const(float("-inf"), values_meta.dtype)

    def window_value(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.input_position(i[lead:], r)
        return ir.where(valid, ir.cast(x.load([*i[:lead], *coords]), values_meta.dtype), lowest)

    out_shape = values_meta.shape
    values = ctx.reduction(out_shape, geo.kernel, "max", values_meta.dtype, window_value)
    tap = ctx.reduction(out_shape, geo.kernel, "argmax", ir.DType.I64, window_value)

    def flat_input_index(i: tuple[ir.Expr, ...]) -> ir.Expr:
        r = unravel(ir.cast(tap.load(i), ir.DType.INDEX), geo.kernel)
        coords, _ = geo.input_position(i[lead:], r)
        flat: ir.Expr = ir.index(0)
        for c, stride_ in zip(coords, ir.contiguous_strides(spatial_in), strict=True):
            flat = ir.call("add", flat, ir.call("mul", c, ir.index(stride_)))
        return ir.cast(flat, indices_meta.dtype)

    indices = ctx.pointwise(indices_meta.shape, indices_meta.dtype, flat_input_index)
    return (values, indices)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value, kernel: Any, stride: Any,
                         padding: Any, dilation: Any, ceil_mode: bool, indices: Value) -> Value:
    if not isinstance(gy, ir.View) or not isinstance(x, ir.View) or not isinstance(indices, ir.View):
        raise UnsupportedOpError(f"{node.name}: expected tensor arguments")
    out = ctx.meta()
    _, lead = _leading(x)
    spatial_in = list(x.shape[lead:])
    geo = _window_geometry(x.reshape([1, 1, *spatial_in]) if lead == 0 else x, kernel, stride, padding,
                           dilation, gy.shape[lead:])
    # Each input position gathers the gradient of every window that chose it: a sum over the
    # kernel taps through which a window can reach it (at most prod(kernel) windows).

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.output_position(i[lead:], r)
        here: ir.Expr = ir.index(0)
        for c, stride_ in zip(i[lead:], ir.contiguous_strides(spatial_in), strict=True):
            here = ir.call("add", here, ir.call("mul", c, ir.index(stride_)))
        window = [*i[:lead], *coords]
        chosen = ir.call("eq", ir.cast(indices.load(window), ir.DType.INDEX), here)
        take = ir.call("logical_and", valid, chosen) if not isinstance(valid, ir.Const) else chosen
        return ir.where(take, ir.cast(gy.load(window), out.dtype), ir.const(0, out.dtype))

    return ctx.reduction(out.shape, geo.kernel, "sum", out.dtype, body)
