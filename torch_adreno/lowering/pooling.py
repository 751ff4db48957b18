"""2-d pooling forward and backward: max, average and adaptive (average and max) pooling.

Every pooling op is a reduction over a window of the input; every backward is a reduction, per
input element, over the windows that can reach it (a gather, never a scatter), so each output
element is written once. Inputs are ``(N, C, H, W)`` or unbatched ``(C, H, W)``: the leading dims
pass through, the windows live on the last two.

* max / average pooling: fixed windows ``o*s + r*d - pad`` (:class:`ConvGeometry`, with one
  channel and no groups); the traced output shape is authoritative (``ceil_mode`` adds windows).
* adaptive pooling: output ``o`` of ``O`` over an input dim of ``I`` covers
  ``[floor(o*I/O), ceil((o+1)*I/O))``; windows may differ in length by one, so the reduction runs
  over the longest one and masks the rest. Input ``h`` is covered by the outputs
  ``[floor(h*O/I), ceil((h+1)*O/I))``, the same formula with ``I`` and ``O`` swapped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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


def _window_geometry(spatial_in: Sequence[int], kernel: Any, stride: Any, padding: Any, dilation: Any,
                     out_spatial: Sequence[int]) -> ConvGeometry:
    """The windows of a pooling op over the spatial dims only (one image, one channel)."""
    spatial = len(spatial_in)
    k = _per_dim(kernel, spatial, [1] * spatial)
    geo = ConvGeometry([1, 1, *spatial_in], [1, 1, *k], _per_dim(stride, spatial, k),
                       _per_dim(padding, spatial, [0] * spatial), _per_dim(dilation, spatial, [1] * spatial), 1)
    # ceil_mode can add a last window; the traced output shape is authoritative.
    geo.out = list(out_spatial)
    geo.positions = math.prod(geo.out)
    return geo


def _pool_input(node: Node, x: Value, what: str) -> tuple[ir.View, int]:
    """The pooled tensor and the number of leading (batch, channel) dims it has."""
    if not isinstance(x, ir.View) or len(x.shape) not in (3, 4):
        raise UnsupportedOpError(f"{node.name}: {what} needs a 3-d (C, H, W) or 4-d (N, C, H, W) input")
    return x, len(x.shape) - 2


def _tensors(node: Node, *values: Value) -> list[ir.View]:
    if not all(isinstance(v, ir.View) for v in values):
        raise UnsupportedOpError(f"{node.name}: expected tensor arguments")
    return [v for v in values if isinstance(v, ir.View)]


def _float_result(ctx: LoweringContext, node: Node, what: str, index: int | None = None) -> ir.DType:
    dtype = ctx.meta(index=index).dtype
    if not dtype.is_float:
        raise UnsupportedOpError(f"{node.name}: {what} is lowered for float32 tensors, not {dtype.value}")
    return dtype


def _flat(coords: Sequence[ir.Expr], shape: Sequence[int]) -> ir.Expr:
    """Row-major linear index of ``coords`` in ``shape`` (PyTorch's pooling indices over H*W)."""
    flat: ir.Expr = ir.index(0)
    for c, stride in zip(coords, ir.contiguous_strides(shape), strict=True):
        flat = ir.call("add", flat, ir.call("mul", c, ir.index(stride)))
    return flat


def _and(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(a, ir.Const):
        return b if a.value else a
    if isinstance(b, ir.Const):
        return a if b.value else b
    return ir.call("logical_and", a, b)


def _imin(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """``min(a, b)`` of index expressions, resolved at compile time where their ranges decide it."""
    ba, bb = ir.bounds(a), ir.bounds(b)
    if ba is not None and bb is not None:
        if ba[1] <= bb[0]:
            return a
        if bb[1] <= ba[0]:
            return b
    return ir.call("minimum", a, b)


def _imax(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    ba, bb = ir.bounds(a), ir.bounds(b)
    if ba is not None and bb is not None:
        if ba[0] >= bb[1]:
            return a
        if bb[0] >= ba[1]:
            return b
    return ir.call("maximum", a, b)


def _check_index_dtype(node: Node, dtype: ir.DType) -> None:
    if dtype is not ir.DType.I64:
        raise UnsupportedOpError(f"{node.name}: pooling indices are int64 in PyTorch, got {dtype.value}")


# -- max pooling ---------------------------------------------------------------------------------


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(ctx: LoweringContext, node: Node, x: Value, kernel: Any, stride: Any = (),
                             padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Value:
    xv, lead = _pool_input(node, x, "max_pool2d")
    dtype = _float_result(ctx, node, "max_pool2d", 0)
    indices_meta = ctx.meta(index=1)
    _check_index_dtype(node, indices_meta.dtype)
    spatial_in = list(xv.shape[lead:])
    out_shape = indices_meta.shape
    geo = _window_geometry(spatial_in, kernel, stride, padding, dilation, out_shape[lead:])
    lowest = ir.const(float("-inf"), dtype)

    def window_value(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.input_position(i[lead:], r)
        return ir.where(valid, ir.cast(xv.load([*i[:lead], *coords]), dtype), lowest)

    values = ctx.reduction(out_shape, geo.kernel, "max", dtype, window_value)
    tap = ctx.reduction(out_shape, geo.kernel, "argmax", ir.DType.I64, window_value)

    def flat_input_index(i: tuple[ir.Expr, ...]) -> ir.Expr:
        r = unravel(ir.cast(tap.load(i), ir.DType.INDEX), geo.kernel)
        coords, _ = geo.input_position(i[lead:], r)
        return ir.cast(_flat(coords, spatial_in), ir.DType.I64)

    indices = ctx.pointwise(out_shape, ir.DType.I64, flat_input_index)
    return (values, indices)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value, kernel: Any, stride: Any,
                         padding: Any, dilation: Any, ceil_mode: bool, indices: Value) -> Value:
    gyv, xv, idx = _tensors(node, gy, x, indices)
    _, lead = _pool_input(node, xv, "max_pool2d_backward")
    dtype = _float_result(ctx, node, "max_pool2d_backward")
    spatial_in = list(xv.shape[lead:])
    geo = _window_geometry(spatial_in, kernel, stride, padding, dilation, gyv.shape[lead:])

    # Each input position gathers the gradient of every window that chose it: a sum over the
    # kernel taps through which a window can reach it (at most prod(kernel) windows).
    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.output_position(i[lead:], r)
        window = [*i[:lead], *coords]
        chosen = ir.call("eq", ir.cast(idx.load(window), ir.DType.INDEX), _flat(i[lead:], spatial_in))
        return ir.where(_and(valid, chosen), ir.cast(gyv.load(window), dtype), ir.const(0, dtype))

    return ctx.reduction(xv.shape, geo.kernel, "sum", dtype, body)


# -- average pooling -----------------------------------------------------------------------------


def _avg_divisor(geo: ConvGeometry, out_pos: Sequence[ir.Expr], count_include_pad: bool,
                 divisor_override: int | None) -> ir.Expr:
    """What PyTorch divides window ``out_pos``'s sum by, as an index expression.

    Per dim, in coordinates shifted by the padding (so every term is non-negative): the window
    starts at ``o*s`` and ends at ``o*s + k``, clipped to the padded input ``I + 2p``; with
    ``count_include_pad`` its length counts, else only its overlap with the input ``[p, p + I)``.
    """
    if divisor_override is not None:
        return ir.index(divisor_override)
    count: ir.Expr = ir.index(1)
    for o, s, k, p, size in zip(out_pos, geo.stride, geo.kernel, geo.padding, geo.size, strict=True):
        start = ir.call("mul", o, ir.index(s))
        end = ir.call("add", start, ir.index(k))
        if count_include_pad:
            length = ir.call("sub", _imin(end, ir.index(size + 2 * p)), start)
        else:
            length = ir.call("sub", _imin(end, ir.index(size + p)), _imax(start, ir.index(p)))
        count = ir.call("mul", count, length)
    return count


@register(aten.avg_pool2d.default)
def _avg_pool2d(ctx: LoweringContext, node: Node, x: Value, kernel: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Value:
    """The window sum (padding reads as 0), then one division per output element."""
    xv, lead = _pool_input(node, x, "avg_pool2d")
    dtype = _float_result(ctx, node, "avg_pool2d")
    out_shape = ctx.meta().shape
    geo = _window_geometry(xv.shape[lead:], kernel, stride, padding, 1, out_shape[lead:])

    def window_value(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.input_position(i[lead:], r)
        return ir.where(valid, ir.cast(xv.load([*i[:lead], *coords]), dtype), ir.const(0, dtype))

    total = ctx.reduction(out_shape, geo.kernel, "sum", dtype, window_value)
    return ctx.pointwise(out_shape, dtype, lambda i: ir.call(
        "div", total.load(i), ir.cast(_avg_divisor(geo, i[lead:], count_include_pad, divisor_override), dtype)))


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value, kernel: Any, stride: Any,
                         padding: Any, ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> Value:
    """Each window's gradient divided by its divisor (one node over the windows), then gathered by
    every input position from the windows that reach it through some kernel tap."""
    gyv, xv = _tensors(node, gy, x)
    _, lead = _pool_input(node, xv, "avg_pool2d_backward")
    dtype = _float_result(ctx, node, "avg_pool2d_backward")
    geo = _window_geometry(xv.shape[lead:], kernel, stride, padding, 1, gyv.shape[lead:])
    share = ctx.pointwise(gyv.shape, dtype, lambda i: ir.call(
        "div", ir.cast(gyv.load(i), dtype),
        ir.cast(_avg_divisor(geo, i[lead:], count_include_pad, divisor_override), dtype)))

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = geo.output_position(i[lead:], r)
        return ir.where(valid, share.load([*i[:lead], *coords]), ir.const(0, dtype))

    return ctx.reduction(xv.shape, geo.kernel, "sum", dtype, body)


# -- adaptive pooling ----------------------------------------------------------------------------


class AdaptiveDim:
    """The windows of adaptive pooling along one dim: ``I`` inputs pooled to ``O`` outputs.

    Window ``o`` is ``[floor(o*I/O), ceil((o+1)*I/O))``; ``longest`` is the longest window and
    ``uniform`` says whether all windows have that length (then no tap needs a mask). ``covering``
    is the same description with the roles swapped: the outputs whose windows hold input ``h``.
    """

    def __init__(self, in_size: int, out_size: int) -> None:
        self.in_size, self.out_size = in_size, out_size
        lengths = {self._end(o, in_size, out_size) - (o * in_size) // out_size for o in range(out_size)}
        self.longest = max(lengths)
        self.uniform = len(lengths) == 1

    @staticmethod
    def _end(o: int, num: int, den: int) -> int:
        return ((o + 1) * num + den - 1) // den

    def window(self, o: ir.Expr) -> tuple[ir.Expr, ir.Expr]:
        """Start and end (exclusive) of output ``o``'s window."""
        start = ir.call("floordiv", ir.call("mul", o, ir.index(self.in_size)), ir.index(self.out_size))
        end = ir.call("floordiv", ir.call("add", ir.call("mul", o, ir.index(self.in_size)),
                                          ir.index(self.in_size + self.out_size - 1)), ir.index(self.out_size))
        return start, end

    def tap(self, o: ir.Expr, r: ir.Expr) -> tuple[ir.Expr, ir.Expr]:
        """Input position of tap ``r`` of window ``o``, and whether the window reaches that far."""
        start, end = self.window(o)
        pos = ir.call("add", start, r)
        return pos, (ir.const(True, ir.DType.BOOL) if self.uniform else ir.call("lt", pos, end))

    def covering(self) -> AdaptiveDim:
        return AdaptiveDim(self.out_size, self.in_size)


def _adaptive_dims(node: Node, spatial_in: Sequence[int], spatial_out: Sequence[int]) -> list[AdaptiveDim]:
    if any(s == 0 for s in [*spatial_in, *spatial_out]):
        raise UnsupportedOpError(f"{node.name}: adaptive pooling of an empty spatial dim "
                                 f"({list(spatial_in)} -> {list(spatial_out)}) is not lowered")
    return [AdaptiveDim(i, o) for i, o in zip(spatial_in, spatial_out, strict=True)]


def _adaptive_taps(dims: Sequence[AdaptiveDim], out_pos: Sequence[ir.Expr],
                   r: Sequence[ir.Expr]) -> tuple[list[ir.Expr], ir.Expr]:
    coords: list[ir.Expr] = []
    valid: ir.Expr = ir.const(True, ir.DType.BOOL)
    for dim, o, t in zip(dims, out_pos, r, strict=True):
        pos, inside = dim.tap(o, t)
        coords.append(pos)
        valid = _and(valid, inside)
    return coords, valid


def _adaptive_counts(dims: Sequence[AdaptiveDim], out_pos: Sequence[ir.Expr]) -> ir.Expr:
    count: ir.Expr = ir.index(1)
    for dim, o in zip(dims, out_pos, strict=True):
        start, end = dim.window(o)
        count = ir.call("mul", count, ir.call("sub", end, start))
    return count


def _covering_sum(ctx: LoweringContext, out_shape: Sequence[int], lead: int, dims: Sequence[AdaptiveDim],
                  dtype: ir.DType, value: Callable[[list[ir.Expr], tuple[ir.Expr, ...]], ir.Expr]) -> ir.View:
    """``out[i] = sum over the windows o holding input i of value(o, i)`` (adaptive backward)."""
    cover = [d.covering() for d in dims]

    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        outputs, valid = _adaptive_taps(cover, i[lead:], r)
        return ir.where(valid, value([*i[:lead], *outputs], i), ir.const(0, dtype))

    return ctx.reduction(out_shape, [d.longest for d in cover], "sum", dtype, body)


@register(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx: LoweringContext, node: Node, x: Value, output_size: Sequence[int]) -> Value:
    xv, lead = _pool_input(node, x, "adaptive_avg_pool2d")
    dtype = _float_result(ctx, node, "adaptive_avg_pool2d")
    out_shape = ctx.meta().shape
    dims = _adaptive_dims(node, xv.shape[lead:], out_shape[lead:])

    def window_value(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = _adaptive_taps(dims, i[lead:], r)
        return ir.where(valid, ir.cast(xv.load([*i[:lead], *coords]), dtype), ir.const(0, dtype))

    total = ctx.reduction(out_shape, [d.longest for d in dims], "sum", dtype, window_value)
    return ctx.pointwise(out_shape, dtype, lambda i: ir.call(
        "div", total.load(i), ir.cast(_adaptive_counts(dims, i[lead:]), dtype)))


@register(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value) -> Value:
    gyv, xv = _tensors(node, gy, x)
    _, lead = _pool_input(node, xv, "adaptive_avg_pool2d_backward")
    dtype = _float_result(ctx, node, "adaptive_avg_pool2d_backward")
    dims = _adaptive_dims(node, xv.shape[lead:], gyv.shape[lead:])
    share = ctx.pointwise(gyv.shape, dtype, lambda i: ir.call(
        "div", ir.cast(gyv.load(i), dtype), ir.cast(_adaptive_counts(dims, i[lead:]), dtype)))
    return _covering_sum(ctx, xv.shape, lead, dims, dtype, lambda window, i: share.load(window))


@register(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(ctx: LoweringContext, node: Node, x: Value, output_size: Sequence[int]) -> Value:
    """Window max and the row-major H*W index of the first maximum (a NaN counts as the maximum)."""
    xv, lead = _pool_input(node, x, "adaptive_max_pool2d")
    dtype = _float_result(ctx, node, "adaptive_max_pool2d", 0)
    indices_meta = ctx.meta(index=1)
    _check_index_dtype(node, indices_meta.dtype)
    out_shape = indices_meta.shape
    spatial_in = list(xv.shape[lead:])
    dims = _adaptive_dims(node, spatial_in, out_shape[lead:])
    lowest = ir.const(float("-inf"), dtype)

    def window_value(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        coords, valid = _adaptive_taps(dims, i[lead:], r)
        return ir.where(valid, ir.cast(xv.load([*i[:lead], *coords]), dtype), lowest)

    longest = [d.longest for d in dims]
    values = ctx.reduction(out_shape, longest, "max", dtype, window_value)
    tap = ctx.reduction(out_shape, longest, "argmax", ir.DType.I64, window_value)

    def flat_input_index(i: tuple[ir.Expr, ...]) -> ir.Expr:
        # Tap 0 of every window is inside the input, so even an all -inf window (masked taps tie
        # with it and lose, being later) yields an in-window index, like PyTorch's.
        r = unravel(ir.cast(tap.load(i), ir.DType.INDEX), longest)
        coords, _ = _adaptive_taps(dims, i[lead:], r)
        return ir.cast(_flat(coords, spatial_in), ir.DType.I64)

    return (values, ctx.pointwise(out_shape, ir.DType.I64, flat_input_index))


@register(aten.adaptive_max_pool2d_backward.default)
def _adaptive_max_pool2d_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value, indices: Value) -> Value:
    gyv, xv, idx = _tensors(node, gy, x, indices)
    _, lead = _pool_input(node, xv, "adaptive_max_pool2d_backward")
    dtype = _float_result(ctx, node, "adaptive_max_pool2d_backward")
    spatial_in = list(xv.shape[lead:])
    dims = _adaptive_dims(node, spatial_in, gyv.shape[lead:])

    def chosen_gradient(window: list[ir.Expr], i: tuple[ir.Expr, ...]) -> ir.Expr:
        chosen = ir.call("eq", ir.cast(idx.load(window), ir.DType.INDEX), _flat(i[lead:], spatial_in))
        return ir.where(chosen, ir.cast(gyv.load(window), dtype), ir.const(0, dtype))

    return _covering_sum(ctx, xv.shape, lead, dims, dtype, chosen_gradient)
