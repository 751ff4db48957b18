"""Fusion under 16-bit types moves the bytes a 16-bit graph should: the casts autocast inserts
decide nothing (a float16 graph stores what its float32 twin stores, in half the bytes), a GEMM
whose result is narrowed to 16 bits stores the 16-bit values rather than its float32
accumulator, and split-K weighs its float32 slice sums against the operands' real bytes.

Stage tests need no device; the device tests compare with eager autocast (forward and gradients).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import capture_graphs

import torch_adreno
from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion import GemmKernel, fuse
from torch_adreno.fusion.inline import op_cost
from torch_adreno.fusion.split_k import choose_split
from torch_adreno.lowering import lower_graph

HALF_DTYPES = [torch.float16, torch.bfloat16]


def _fused(fn, *inputs, index=0):
    graph = lower_graph(capture_graphs(fn, *inputs)[index], Config(), "g", None)
    return fuse(graph, Config())


def _stored(result) -> dict[str, ir.Buffer]:
    """Buffers some kernel writes, by name."""
    return {w: result.graph.buffers[w] for g in result.groups for w in g.writes}


# -- stage tests -------------------------------------------------------------------------------


def test_float_casts_weigh_nothing_in_the_recompute_cost():
    wide = ir.call("div", ir.Load("g", (ir.index(0),), ir.DType.F32), ir.const(64.0, ir.DType.F32))
    narrow = ir.cast(ir.call("div", ir.cast(ir.Load("g", (ir.index(0),), ir.DType.F16), ir.DType.F32),
                             ir.const(64.0, ir.DType.F32)), ir.DType.F16)
    assert op_cost(narrow) == op_cost(wide) == 1
    # A cast to an integer type is an operation like any other.
    assert op_cost(ir.cast(ir.Load("g", (ir.index(0),), ir.DType.F32), ir.DType.I64)) == 1


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_rounded_broadcast_gemm_operand_is_inlined_like_its_float32_twin(dtype):
    # The gradient of x.mean(1) under autocast, before the linear layer it feeds: divided in float32,
    # rounded to 16 bits, broadcast over the sequence, read by a GEMM 16 times per element.
    def fn(g, w):
        h = (g.float() / 64).to(w.dtype)[:, None, :].expand(16, 64, 128).reshape(1024, 128)
        return h @ w

    g, w = torch.randn(16, 128), torch.randn(128, 512)
    twin = _fused(fn, g, w)
    result = _fused(fn, g.to(dtype), w.to(dtype))
    assert len(twin.groups) == len(result.groups) == 1
    (group,) = result.groups
    assert isinstance(group.spec, GemmKernel)
    assert [b.shape for b in _stored(result).values()] == [(1024, 512)]  # the product only
    assert "inlined" in "\n".join(str(d) for d in result.decisions)


def _linear_chunk_attention(x, w, b, autocast_dtype):
    with torch.autocast("cpu", dtype=autocast_dtype):
        q, k, v = F.linear(x, w, b).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(0, 1), dim=-1) @ v


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_narrowed_gemm_result_read_by_several_kernels_is_stored_in_16_bits(dtype):
    # q, k and v of one linear layer: its bias add and rounding to 16 bits read by three kernels.
    x, w, b = torch.randn(64, 32), torch.randn(96, 32), torch.randn(96)
    result = _fused(lambda x, w, b: _linear_chunk_attention(x, w, b, dtype), x, w, b)
    linear = next(g for g in result.groups if isinstance(g.spec, GemmKernel) and g.spec.gemm.k == 32
                  and g.spec.gemm.n == 96)
    stored = _stored(result)
    assert [stored[w].dtype for w in linear.writes] == [ir.DType.F16 if dtype == torch.float16 else ir.DType.BF16]
    assert not [name for name, buf in stored.items() if buf.shape == (64, 96) and buf.dtype is ir.DType.F32]
    assert "narrows the GEMM result" in "\n".join(str(d) for d in result.decisions)


def test_a_float32_gemm_result_keeps_its_decisions():
    # Equal element sizes: inlining the bias add into the consumers never moves more bytes.
    x, w, b = torch.randn(64, 32), torch.randn(96, 32), torch.randn(96)

    def fn(x, w, b):
        q, k, v = F.linear(x, w, b).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(0, 1), dim=-1) @ v

    result = _fused(fn, x, w, b)
    assert "narrows the GEMM result" not in "\n".join(str(d) for d in result.decisions)


def test_split_k_weighs_float32_slice_sums_against_the_operands_bytes():
    def gemm(dtype, m, n, k):
        a = ir.Load("a", (ir.index(0),), dtype)
        return ir.Gemm("g", "out", 1, m, n, k, ir.cast(a, ir.DType.F32), ir.cast(a, ir.DType.F32), (), ())

    # A transformer's 128 x 128 weight gradient over 1024 tokens: the two float32 slice sums move
    # a quarter of float32 operands' bytes, but half of 16-bit operands'.
    assert choose_split(gemm(ir.DType.F32, 128, 128, 1024)) == 2
    assert choose_split(gemm(ir.DType.F16, 128, 128, 1024)) == 1
    assert choose_split(gemm(ir.DType.BF16, 128, 128, 1024)) == 1
    # resnet_mini's first-stage weight gradient splits in 16 bits too.
    assert choose_split(gemm(ir.DType.F16, 16, 144, 32768)) == 32


# -- device tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_narrowed_gemm_result_matches_eager_autocast_and_writes_16_bits(dtype):
    x, w, b = torch.randn(64, 32), torch.randn(96, 32), torch.randn(96)

    def run(fn, tensors):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves, dtype)
        grads = torch.autograd.grad(out.float().sum(), leaves)
        return [out.detach(), *grads]

    compiled = torch.compile(_linear_chunk_attention, backend="adreno", fullgraph=True, dynamic=False)
    with torch_adreno.profile() as prof:
        ours = run(compiled, [x, w, b])
    eager = run(_linear_chunk_attention, [x, w, b])
    reference = [r.double() for r in run(lambda x, w, b, _: _linear_chunk_attention(x, w, b, None),
                                         [x.double(), w.double(), b.double()])]
    assert not prof.host_fallback_ops
    for what, o, e, r in zip(["output", "x grad", "w grad", "b grad"], ours, eager, reference, strict=True):
        assert o.dtype == e.dtype, what
        ours_error, eager_error = (o.double() - r).abs().max(), (e.double() - r).abs().max()
        assert ours_error <= 2 * eager_error, f"{what}: ours {ours_error:.3g}, eager {eager_error:.3g} from float64"
    linear = next(k for k in prof.kernels if k.kind == "gemm" and "aten.addmm.default" in k.aten_ops)
    assert linear.bytes_written == 64 * 96 * 2  # the rounded 16-bit values, not the float32 accumulator
