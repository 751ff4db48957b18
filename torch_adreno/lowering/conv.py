"""Convolution forward and backward as implicit GEMMs.

Every convolution product is one GEMM node whose operands are index maps: the input operand is
an im2col gather with padding written as a masked load, never a materialised column matrix.
Groups become the GEMM batch. With ``N`` batch, ``G`` groups, ``Cg``/``OCg`` channels per group,
``P`` output positions and ``R`` kernel taps:

* forward:       out[n, g*OCg+m, p]  = sum_{k=(c,r)}     w[g*OCg+m, c, r]   * x[n, g*Cg+c, p*s + r*d - pad]
* grad input:    gx[n, g*Cg+m, q]    = sum_{k=(oc,r)}    w[g*OCg+oc, m, r]  * gy[n, g*OCg+oc, (q + pad - r*d)/s]
* grad weight:   gw[g*OCg+m, c, r]   = sum_{k=(n,p)}     gy[n, g*OCg+m, p]  * x[n, g*Cg+c, p*s + r*d - pad]
* grad bias:     a sum over batch and positions.

A transposed convolution (``transposed=True``, weight ``(C_in, C_out/G, *kernel)``) is the input
gradient of the normal convolution that maps its output space back to its input space: that
convolution has input ``(N, C_out, *out)``, the same weight (``OC = C_in``) and output
``(N, C_in, *in)``. So its forward is ``conv_grad_input`` with its input in the role of ``gy``;
its input gradient is that convolution's forward of ``gy``, and its weight gradient is that
convolution's weight gradient with ``x`` and ``gy`` in swapped roles. ``output_padding`` needs no
term of its own: it only lengthens the output space, which the traced shapes already carry.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError, UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.reduction import reduce_dims

aten = torch.ops.aten


def unravel(linear: ir.Expr, shape: Sequence[int]) -> list[ir.Expr]:
    """Row-major multi-index of ``linear`` over ``shape``."""
    out = []
    for size, stride in zip(shape, ir.contiguous_strides(shape), strict=True):
        out.append(ir.call("mod", ir.call("floordiv", linear, ir.index(stride)), ir.index(size)))
    return out


def _all(conds: Sequence[ir.Expr]) -> ir.Expr:
    out: ir.Expr = ir.const(True, ir.DType.BOOL)
    for c in conds:
        out = c if isinstance(out, ir.Const) else ir.call("logical_and", out, c)
    return out


class ConvGeometry:
    """Shapes of one convolution; lists are per spatial dimension."""

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], groups: int) -> None:
        spatial = len(x_shape) - 2
        self.n, self.c = x_shape[0], x_shape[1]
        self.oc = w_shape[0]
        self.groups = groups
        self.cg, self.ocg = self.c // groups, self.oc // groups
        self.size = list(x_shape[2:])
        self.kernel = list(w_shape[2:])
        self.stride = _per_dim(stride, spatial)
        self.padding = _per_dim(padding, spatial)
        self.dilation = _per_dim(dilation, spatial)
        self.out = [
            (s + 2 * p - d * (k - 1) - 1) // st + 1
            for s, p, d, k, st in zip(self.size, self.padding, self.dilation, self.kernel, self.stride, strict=True)
        ]
        self.taps = math.prod(self.kernel)
        self.positions = math.prod(self.out)

    def input_position(self, out_pos: Sequence[ir.Expr], tap: Sequence[ir.Expr]) -> tuple[list[ir.Expr], ir.Expr]:
        """Input coordinates read by output ``out_pos`` through kernel tap ``tap``, and whether in bounds."""
        coords, conds = [], []
        for o, r, s, d, p, size in zip(out_pos, tap, self.stride, self.dilation, self.padding, self.size, strict=True):
            pos = ir.call("sub", ir.call("add", ir.call("mul", o, ir.index(s)), ir.call("mul", r, ir.index(d))),
                          ir.index(p))
            coords.append(pos)
            lo, hi = ir.bounds(pos) or (-1, size)
            if lo < 0:
                conds.append(ir.call("ge", pos, ir.index(0)))
            if hi >= size:
                conds.append(ir.call("lt", pos, ir.index(size)))
        return coords, _all(conds)

    def output_position(self, in_pos: Sequence[ir.Expr], tap: Sequence[ir.Expr]) -> tuple[list[ir.Expr], ir.Expr]:
        """Output coordinates whose window reads input ``in_pos`` through ``tap``, and whether one exists."""
        coords, conds = [], []
        for q, r, s, d, p, size in zip(in_pos, tap, self.stride, self.dilation, self.padding, self.out, strict=True):
            t = ir.call("sub", ir.call("add", q, ir.index(p)), ir.call("mul", r, ir.index(d)))
            lo, hi = ir.bounds(t) or (-1, size * s)
            if lo < 0:
                conds.append(ir.call("ge", t, ir.index(0)))
            if s > 1:
                conds.append(ir.call("eq", ir.call("mod", t, ir.index(s)), ir.index(0)))
            o = ir.call("floordiv", t, ir.index(s))
            if hi // s >= size:
                conds.append(ir.call("lt", o, ir.index(size)))
            coords.append(o)
        return coords, _all(conds)


def _per_dim(values: Sequence[int] | int, n: int) -> list[int]:
    if isinstance(values, int):
        return [values] * n
    values = list(values)
    return values * n if len(values) == 1 else values


def _group_split(b: ir.Expr, groups: int) -> tuple[ir.Expr, ir.Expr]:
    return ir.call("floordiv", b, ir.index(groups)), ir.call("mod", b, ir.index(groups))


def is_depthwise(geo: ConvGeometry) -> bool:
    """One input channel per group (depthwise, with any channel multiplier): as a GEMM its forward
    has k = taps (9) and its weight gradient m = n = 1 per group, so the GEMM template's tiles hold
    almost nothing and its weight gradient walks batch x positions serially in one work-group per
    channel (a small fraction of a GPU's peak for MobileNetV2's first one). As reductions
    (over the taps, or over batch and positions with one work-group per weight) the three products
    are bandwidth-bound kernels that read each operand once per tap."""
    return geo.groups > 1 and geo.cg == 1


def depthwise_forward(ctx: LoweringContext, x: ir.View, w: ir.View, geo: ConvGeometry, dtype: ir.DType) -> ir.View:
    """``out[n, oc, p] = sum_r w[oc, 0, r] * x[n, oc // OCg, p*s + r*d - pad]``: a sum over the taps."""
    def body(i: tuple[ir.Expr, ...], tap: tuple[ir.Expr, ...]) -> ir.Expr:
        nb, oc, *pos = i
        coords, valid = geo.input_position(pos, tap)
        g = ir.call("floordiv", oc, ir.index(geo.ocg)) if geo.ocg > 1 else oc
        xv = ir.where(valid, x.load([nb, g, *coords]), ir.const(0, dtype))
        return ir.call("mul", ir.cast(w.load([oc, ir.index(0), *tap]), dtype), ir.cast(xv, dtype))

    return ctx.reduction([geo.n, geo.oc, *geo.out], geo.kernel, "sum", dtype, body)


def depthwise_grad_input(ctx: LoweringContext, gy: ir.View, w: ir.View, geo: ConvGeometry,
                         dtype: ir.DType) -> ir.View:
    """``gx[n, c, q] = sum_{j, r} w[c*OCg + j, 0, r] * gy[n, c*OCg + j, (q + pad - r*d) / s]`` over the
    output channels ``j`` of group ``c`` and the taps whose window reads ``q``."""
    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        nb, c, *pos = i
        j, *tap = r
        oc = ir.call("add", ir.call("mul", c, ir.index(geo.ocg)), j) if geo.ocg > 1 else c
        coords, valid = geo.output_position(pos, tap)
        gv = ir.where(valid, gy.load([nb, oc, *coords]), ir.const(0, dtype))
        return ir.call("mul", ir.cast(w.load([oc, ir.index(0), *tap]), dtype), ir.cast(gv, dtype))

    return ctx.reduction([geo.n, geo.c, *geo.size], [geo.ocg, *geo.kernel], "sum", dtype, body)


def depthwise_grad_weight(ctx: LoweringContext, gy: ir.View, x: ir.View, geo: ConvGeometry,
                          dtype: ir.DType) -> ir.View:
    """``gw[oc, 0, r] = sum_{n, p} gy[n, oc, p] * x[n, oc // OCg, p*s + r*d - pad]``: one long sum per
    weight (a work-group each), its consecutive work-items on consecutive positions."""
    def body(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        oc, _, *tap = i
        nb, *pos = r
        coords, valid = geo.input_position(pos, tap)
        g = ir.call("floordiv", oc, ir.index(geo.ocg)) if geo.ocg > 1 else oc
        xv = ir.where(valid, x.load([nb, g, *coords]), ir.const(0, dtype))
        return ir.call("mul", ir.cast(gy.load([nb, oc, *pos]), dtype), ir.cast(xv, dtype))

    return ctx.reduction([geo.oc, 1, *geo.kernel], [geo.n, *geo.out], "sum", dtype, body)


def folds_batch(geo: ConvGeometry) -> bool:
    """Whether the forward and input-gradient GEMMs take the batch into their columns (n = batch x
    positions, one GEMM) instead of one GEMM per image: without groups there is nothing else to
    batch, and per image the late stages' few positions (ResNet-18's last: 7 x 7 = 49) fill
    under 80% of a 64-column tile and leave most compute units idle (16 images x 4 tiles = 64
    work-groups on a desktop GPU of over a hundred compute units)."""
    return geo.groups == 1 and geo.n > 1


def _image_group_position(b: ir.Expr, n: ir.Expr, geo: ConvGeometry, positions: int,
                          fold: bool) -> tuple[ir.Expr, ir.Expr, ir.Expr]:
    """(image, group, position within the image) of GEMM batch ``b``, column ``n``."""
    if fold:
        return ir.call("floordiv", n, ir.index(positions)), ir.index(0), ir.call("mod", n, ir.index(positions))
    nb, g = _group_split(b, geo.groups)
    return nb, g, n


def _channel_and_tap(k: ir.Expr, channels: int, geo: ConvGeometry) -> tuple[ir.Expr, list[ir.Expr]]:
    """The channel and kernel tap of reduction index ``k`` of a forward or input-gradient GEMM,
    ordered tap-major (``k = tap * channels + channel``): a K tile of the template then spans
    consecutive channels of one tap, and with power-of-two channel counts (every ResNet stage) the
    index arithmetic of each operand load is a shift and a mask, not divisions by the tap count."""
    return ir.call("mod", k, ir.index(channels)), unravel(ir.call("floordiv", k, ir.index(channels)), geo.kernel)


def conv_forward(ctx: LoweringContext, x: ir.View, w: ir.View, geo: ConvGeometry, dtype: ir.DType) -> ir.View:
    if is_depthwise(geo):
        return depthwise_forward(ctx, x, w, geo, dtype)
    out_shape = [geo.n, geo.oc, *geo.out]
    fold = folds_batch(geo)

    def lhs(b: ir.Expr, m: ir.Expr, k: ir.Expr) -> ir.Expr:
        g = ir.index(0) if fold else _group_split(b, geo.groups)[1]
        oc = ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), m)
        c, tap = _channel_and_tap(k, geo.cg, geo)
        return w.load([oc, c, *tap])

    def rhs(b: ir.Expr, k: ir.Expr, n: ir.Expr) -> ir.Expr:
        nb, g, pos = _image_group_position(b, n, geo, geo.positions, fold)
        c_local, tap = _channel_and_tap(k, geo.cg, geo)
        c = ir.call("add", ir.call("mul", g, ir.index(geo.cg)), c_local)
        coords, valid = geo.input_position(unravel(pos, geo.out), tap)
        return ir.where(valid, x.load([nb, c, *coords]), ir.const(0, dtype))

    def out_index(b: ir.Expr, m: ir.Expr, n: ir.Expr) -> list[ir.Expr]:
        nb, g, pos = _image_group_position(b, n, geo, geo.positions, fold)
        return [nb, ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), m), *unravel(pos, geo.out)]

    if fold:
        return ctx.gemm(out_shape, dtype, 1, geo.oc, geo.n * geo.positions, geo.c * geo.taps, lhs, rhs, out_index)
    return ctx.gemm(out_shape, dtype, geo.n * geo.groups, geo.ocg, geo.positions, geo.cg * geo.taps,
                    lhs, rhs, out_index)


def conv_grad_input(ctx: LoweringContext, gy: ir.View, w: ir.View, geo: ConvGeometry, dtype: ir.DType) -> ir.View:
    if is_depthwise(geo):
        return depthwise_grad_input(ctx, gy, w, geo, dtype)
    if geo.groups == 1 and any(s > 1 for s in geo.stride):
        return strided_grad_input(ctx, gy, w, geo, dtype)
    fold = folds_batch(geo)
    positions = math.prod(geo.size)

    def lhs(b: ir.Expr, m: ir.Expr, k: ir.Expr) -> ir.Expr:
        g = ir.index(0) if fold else _group_split(b, geo.groups)[1]
        oc_local, tap = _channel_and_tap(k, geo.ocg, geo)
        oc = ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), oc_local)
        return w.load([oc, m, *tap])

    def rhs(b: ir.Expr, k: ir.Expr, n: ir.Expr) -> ir.Expr:
        nb, g, pos = _image_group_position(b, n, geo, positions, fold)
        oc_local, tap = _channel_and_tap(k, geo.ocg, geo)
        oc = ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), oc_local)
        coords, valid = geo.output_position(unravel(pos, geo.size), tap)
        return ir.where(valid, gy.load([nb, oc, *coords]), ir.const(0, dtype))

    def out_index(b: ir.Expr, m: ir.Expr, n: ir.Expr) -> list[ir.Expr]:
        nb, g, pos = _image_group_position(b, n, geo, positions, fold)
        return [nb, ir.call("add", ir.call("mul", g, ir.index(geo.cg)), m), *unravel(pos, geo.size)]

    if fold:
        return ctx.gemm([geo.n, geo.c, *geo.size], dtype, 1, geo.c, geo.n * positions, geo.oc * geo.taps,
                        lhs, rhs, out_index)
    return ctx.gemm([geo.n, geo.c, *geo.size], dtype, geo.n * geo.groups, geo.cg, positions,
                    geo.ocg * geo.taps, lhs, rhs, out_index)


class InputPhase:
    """The input positions ``q = s*t + phase`` of one residue per dimension, and the kernel taps that
    reach them: tap ``r = first + j*step`` (``j < count``) reads output ``t + shift - j*advance``.

    Invariant: ``(phase + pad - r*dilation) % stride == 0`` exactly for the listed taps, so
    ``shift - j*advance == (phase + pad - r*dilation) / stride`` with no remainder."""

    def __init__(self, phase: int, stride: int, pad: int, dilation: int, kernel: int, size: int) -> None:
        taps = [r for r in range(kernel) if (phase + pad - r * dilation) % stride == 0]
        self.positions = max(0, -(-(size - phase) // stride))
        self.count = len(taps)
        self.first = taps[0] if taps else 0
        self.step = stride // math.gcd(stride, dilation)
        self.shift = (phase + pad - self.first * dilation) // stride
        self.advance = dilation // math.gcd(stride, dilation)


def strided_grad_input(ctx: LoweringContext, gy: ir.View, w: ir.View, geo: ConvGeometry,
                       dtype: ir.DType) -> ir.View:
    """The input gradient of a strided convolution as one GEMM per input phase (position modulo the
    stride) over only the taps that reach it, and one pointwise node interleaving the phases.

    As one GEMM over every input position and every tap, ``stride**dims - 1`` of every
    ``stride**dims`` products would be masked zeros: a 3x3 stride-2 convolution's input gradient
    would do 36 taps' work for 9 (ResNet-18's stride-2 input gradients: 7.4 GFLOP each in place of
    1.85). The interleave rereads the gradient once, a few MB.
    """
    per_dim = [[InputPhase(ph, s, p, d, k, size) for ph in range(s)]
               for s, p, d, k, size in zip(geo.stride, geo.padding, geo.dilation, geo.kernel, geo.size, strict=True)]
    phases: dict[tuple[int, ...], ir.View | None] = {}
    for phase in itertools.product(*(range(s) for s in geo.stride)):
        dims = [per_dim[d][ph] for d, ph in enumerate(phase)]
        if any(dim.count == 0 or dim.positions == 0 for dim in dims):
            phases[phase] = None  # no tap reaches these positions: their gradient is zero
            continue
        phases[phase] = _phase_grad_input(ctx, gy, w, geo, dims, dtype)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        nb, c, *pos = i
        value: ir.Expr = ir.const(0, dtype)
        for phase, part in phases.items():
            if part is None:
                continue
            selected = _all([ir.call("eq", ir.call("mod", q, ir.index(s)), ir.index(ph))
                             for q, s, ph in zip(pos, geo.stride, phase, strict=True) if s > 1])
            coords = [ir.call("floordiv", q, ir.index(s)) if s > 1 else q for q, s in zip(pos, geo.stride, strict=True)]
            value = ir.where(selected, part.load([nb, c, *coords]), value)
        return value

    return ctx.pointwise([geo.n, geo.c, *geo.size], dtype, body)


def _phase_grad_input(ctx: LoweringContext, gy: ir.View, w: ir.View, geo: ConvGeometry,
                      dims: Sequence[InputPhase], dtype: ir.DType) -> ir.View:
    """``gx_phase[n, c, t] = sum_{oc, j} w[oc, c, first + j*step] * gy[n, oc, t + shift - j*advance]``,
    the batch folded into the columns and ``k`` ordered tap-major as the other GEMMs are."""
    sizes = [dim.positions for dim in dims]
    positions = math.prod(sizes)
    counts = [dim.count for dim in dims]

    def split_k(k: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
        return ir.call("mod", k, ir.index(geo.oc)), unravel(ir.call("floordiv", k, ir.index(geo.oc)), counts)

    def lhs(b: ir.Expr, m: ir.Expr, k: ir.Expr) -> ir.Expr:
        oc, js = split_k(k)
        taps = [ir.call("add", ir.index(dim.first), ir.call("mul", j, ir.index(dim.step))) for dim, j in zip(dims, js, strict=True)]
        return w.load([oc, m, *taps])

    def rhs(b: ir.Expr, k: ir.Expr, n: ir.Expr) -> ir.Expr:
        oc, js = split_k(k)
        nb = ir.call("floordiv", n, ir.index(positions))
        conds, coords = [], []
        for t, j, dim, out in zip(unravel(ir.call("mod", n, ir.index(positions)), sizes), js, dims, geo.out, strict=True):
            o = ir.call("sub", ir.call("add", t, ir.index(dim.shift)), ir.call("mul", j, ir.index(dim.advance)))
            lo, hi = ir.bounds(o) or (-1, out)
            if lo < 0:
                conds.append(ir.call("ge", o, ir.index(0)))
            if hi >= out:
                conds.append(ir.call("lt", o, ir.index(out)))
            coords.append(o)
        return ir.where(_all(conds), gy.load([nb, oc, *coords]), ir.const(0, dtype))

    def out_index(b: ir.Expr, m: ir.Expr, n: ir.Expr) -> list[ir.Expr]:
        return [ir.call("floordiv", n, ir.index(positions)), m, *unravel(ir.call("mod", n, ir.index(positions)), sizes)]

    return ctx.gemm([geo.n, geo.c, *sizes], dtype, 1, geo.c, geo.n * positions, geo.oc * math.prod(counts),
                    lhs, rhs, out_index)


def conv_grad_weight(ctx: LoweringContext, gy: ir.View, x: ir.View, geo: ConvGeometry, dtype: ir.DType) -> ir.View:
    if is_depthwise(geo):
        return depthwise_grad_weight(ctx, gy, x, geo, dtype)
    per_image = math.prod(geo.out)

    def position(k: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
        """Image and output position of reduction index ``k``."""
        pos = unravel(ir.call("mod", k, ir.index(per_image)), list(geo.out))
        return ir.call("floordiv", k, ir.index(per_image)), pos

    def channel_and_tap(n: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
        return ir.call("floordiv", n, ir.index(geo.taps)), unravel(ir.call("mod", n, ir.index(geo.taps)), geo.kernel)

    def lhs(g: ir.Expr, m: ir.Expr, k: ir.Expr) -> ir.Expr:
        nb, pos = position(k)
        return gy.load([nb, ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), m), *pos])

    def rhs(g: ir.Expr, k: ir.Expr, n: ir.Expr) -> ir.Expr:
        nb, pos = position(k)
        c_local, tap = channel_and_tap(n)
        c = ir.call("add", ir.call("mul", g, ir.index(geo.cg)), c_local)
        coords, valid = geo.input_position(pos, tap)
        return ir.where(_all([valid]), x.load([nb, c, *coords]), ir.const(0, dtype))

    def out_index(g: ir.Expr, m: ir.Expr, n: ir.Expr) -> list[ir.Expr]:
        c_local, tap = channel_and_tap(n)
        return [ir.call("add", ir.call("mul", g, ir.index(geo.ocg)), m), c_local, *tap]

    return ctx.gemm([geo.oc, geo.cg, *geo.kernel], dtype, geo.groups, geo.ocg, geo.cg * geo.taps,
                    geo.n * per_image, lhs, rhs, out_index)


def _check(node: Node, x: Value, w: Value) -> tuple[ir.View, ir.View]:
    if not isinstance(x, ir.View) or not isinstance(w, ir.View) or len(x.shape) < 3:
        raise UnsupportedOpError(f"{node.name}: convolution needs batched (N, C, ...) input and a weight tensor")
    if len(w.shape) != len(x.shape):
        raise UnsupportedOpError(f"{node.name}: weight of rank {len(w.shape)} for an input of rank {len(x.shape)}")
    return x, w


def transposed_geometry(node: Node, x: ir.View, w: ir.View, out_shape: Sequence[int], stride: Sequence[int],
                        padding: Sequence[int], dilation: Sequence[int], groups: int) -> ConvGeometry:
    """The normal convolution whose input gradient the transposed convolution ``x -> out`` is.

    Its input space is ``out`` (``(N, C_out, *out)``), its output space is ``x``'s. The output
    size is taken from ``x``, not recomputed from ``out``: PyTorch allows an ``output_padding``
    below ``stride`` *or* ``dilation``, and one of at least ``stride`` adds rows past the last
    window that no tap of ``x`` reaches (they receive only the bias), which the formula would
    count as more windows.
    """
    geo = ConvGeometry([x.shape[0], out_shape[1], *out_shape[2:]], w.shape, stride, padding, dilation, groups)
    if geo.oc != x.shape[1] or geo.cg * groups != out_shape[1]:
        raise LoweringError(f"{node.name}: transposed convolution of input {list(x.shape)} with weight "
                            f"{list(w.shape)} and groups={groups} cannot give {list(out_shape)}")
    geo.out = list(x.shape[2:])
    geo.positions = math.prod(geo.out)
    return geo


@register(aten.convolution.default)
def _convolution(ctx: LoweringContext, node: Node, x: Value, w: Value, bias: Value, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Value:
    xv, wv = _check(node, x, w)
    out = ctx.meta()
    # With a bias, a 16-bit result is rounded once, after the bias is added (as eager does).
    dtype = out.dtype if bias is None else out.dtype.compute
    if transposed:
        geo = transposed_geometry(node, xv, wv, out.shape, stride, padding, dilation, groups)
        y = conv_grad_input(ctx, xv, wv, geo, dtype)
    else:
        geo = ConvGeometry(xv.shape, wv.shape, stride, padding, dilation, groups)
        y = conv_forward(ctx, xv, wv, geo, dtype)
    if bias is None:
        return y
    channels = out.shape[1]
    return ctx.pointwise(out.shape, out.dtype,
                         lambda i: ir.call("add", y.load(i), ctx.load(bias, [i[1]], [channels], out.dtype)))


@register(aten.convolution_backward.default)
def _convolution_backward(ctx: LoweringContext, node: Node, gy: Value, x: Value, w: Value, bias_sizes: Any,
                          stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                          transposed: bool, output_padding: Sequence[int], groups: int,
                          output_mask: Sequence[bool]) -> Value:
    xv, wv = _check(node, x, w)
    if not isinstance(gy, ir.View):
        raise UnsupportedOpError(f"{node.name}: expected a gradient tensor")
    if not any(output_mask):
        return (None, None, None)
    dtype = ctx.meta(index=0 if output_mask[0] else 1 if output_mask[1] else 2).dtype
    grad_input = grad_weight = grad_bias = None
    if transposed:
        geo = transposed_geometry(node, xv, wv, gy.shape, stride, padding, dilation, groups)
        if output_mask[0]:
            grad_input = conv_forward(ctx, gy, wv, geo, dtype)
        if output_mask[1]:
            grad_weight = conv_grad_weight(ctx, xv, gy, geo, dtype)
    else:
        geo = ConvGeometry(xv.shape, wv.shape, stride, padding, dilation, groups)
        if output_mask[0]:
            grad_input = conv_grad_input(ctx, gy, wv, geo, dtype)
        if output_mask[1]:
            grad_weight = conv_grad_weight(ctx, gy, xv, geo, dtype)
    if output_mask[2]:
        dims = [0, *range(2, len(gy.shape))]
        grad_bias = reduce_dims(ctx, gy, dims, "sum", dtype, [gy.shape[1]])
    return (grad_input, grad_weight, grad_bias)
