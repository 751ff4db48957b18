"""Random ops on the device: dropout, rand, randn, bernoulli.

Every random op of a graph reads the graph's seed, an extra input the runtime draws from torch's
default generator on every call (``LoweringContext.random_stream``), and has a stream number of
its own; element ``i`` of its output is a pure function of (seed, stream, i) through the
counter-based Philox generator (``kernels/random.cl``), the stream in the counter's high 32 bits. Runs
repeat under ``torch.manual_seed``; they do not reproduce eager's numbers (another generator),
so tests check distributions and the agreement of forward masks with gradients instead.

Invariant: a random value is never recomputed from a *different* counter, so the fusion stage may
inline a random expression into several kernels and they all see the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register

aten = torch.ops.aten


#: Counters of one stream: its numbers per element times elements must stay below this.
STREAM_LENGTH = 2**32


def _counter(idx: Sequence[ir.Expr], shape: Sequence[int], stream: int, per_element: int) -> ir.Expr:
    """``stream * 2^32 + per_element * (row-major position of idx in shape)`` as an int64."""
    if per_element * math.prod(shape) > STREAM_LENGTH:
        raise UnsupportedOpError(f"a random tensor of {math.prod(shape)} elements is longer than one random "
                                 f"stream ({STREAM_LENGTH // per_element}); split it into smaller tensors")
    linear: ir.Expr = ir.index(0)
    stride = 1
    for i, size in reversed(list(zip(idx, shape, strict=True))):
        linear = ir.call("add", linear, ir.call("mul", i, ir.index(stride)))
        stride *= size
    counter = ir.cast(linear, ir.DType.I64)
    if per_element != 1:
        counter = ir.call("mul", counter, ir.const(per_element, ir.DType.I64))
    return ir.call("add", counter, ir.const(stream * STREAM_LENGTH, ir.DType.I64)) if stream else counter


def _uniform(seed: ir.View, counter: ir.Expr) -> ir.Expr:
    return ir.call("uniform", seed.load([]), counter)


def uniform_field(ctx: LoweringContext, shape: Sequence[int]) -> Any:
    """A function of loop indices giving U[0, 1) numbers, one independent stream per call."""
    seed, stream = ctx.random_stream()
    return lambda idx: _uniform(seed, _counter(idx, shape, stream, 1))


def normal_field(ctx: LoweringContext, shape: Sequence[int]) -> Any:
    """Standard normal numbers by Box-Muller over two uniforms per element (counters 2i, 2i+1)."""
    seed, stream = ctx.random_stream()

    def sample(idx: Sequence[ir.Expr]) -> ir.Expr:
        base = _counter(idx, shape, stream, 2)
        # 1 - u lies in (0, 1]: the logarithm stays finite.
        u1 = ir.call("sub", ir.const(1.0, ir.DType.F32), _uniform(seed, base))
        u2 = _uniform(seed, ir.call("add", base, ir.const(1, ir.DType.I64)))
        radius = ir.call("sqrt", ir.call("mul", ir.const(-2.0, ir.DType.F32), ir.call("log", u1)))
        angle = ir.call("mul", ir.const(2 * math.pi, ir.DType.F32), u2)
        return ir.call("mul", radius, ir.call("cos", angle))

    return sample


@register(aten.native_dropout.default)
def _native_dropout(ctx: LoweringContext, node: Node, x: Value, p: float, train: bool | None) -> Value:
    """``(x * keep / (1 - p), keep)`` with ``keep ~ Bernoulli(1 - p)``; the mask is the output the
    backward multiplies by, so forward and backward agree by construction."""
    assert isinstance(x, ir.View)
    out = ctx.meta(index=0)
    if not train:
        keep_all = ctx.pointwise(out.shape, ir.DType.BOOL, lambda idx: ir.const(True, ir.DType.BOOL))
        return ctx.materialize(x), keep_all
    uniform = uniform_field(ctx, out.shape)
    # keep iff u >= p: P(keep) = 1 - p for u uniform on the 2^-24 grid of [0, 1).
    mask = ctx.pointwise(out.shape, ir.DType.BOOL,
                         lambda idx: ir.call("ge", uniform(idx), ir.const(float(p), ir.DType.F32)))
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)

    def dropped(idx: tuple[ir.Expr, ...]) -> ir.Expr:
        value = ir.call("mul", x.load(idx), ir.const(scale, ir.DType.F32))
        return ir.where(mask.load(idx), value, ir.const(0.0, ir.DType.F32))

    return ctx.pointwise(out.shape, out.dtype, dropped), mask


@register(aten.rand.default, aten.rand_like.default)
def _rand(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    out = ctx.meta()
    uniform = uniform_field(ctx, out.shape)
    return ctx.pointwise(out.shape, out.dtype, uniform)


@register(aten.randn.default, aten.randn_like.default)
def _randn(ctx: LoweringContext, node: Node, *args: Any, **kwargs: Any) -> Value:
    out = ctx.meta()
    return ctx.pointwise(out.shape, out.dtype, normal_field(ctx, out.shape))


@register(aten.bernoulli.p)
def _bernoulli(ctx: LoweringContext, node: Node, x: Value, p: float = 0.5, **kwargs: Any) -> Value:
    out = ctx.meta()
    uniform = uniform_field(ctx, out.shape)
    return ctx.pointwise(out.shape, out.dtype,
                         lambda idx: ir.call("lt", uniform(idx), ir.const(float(p), ir.DType.F32)))
