"""scaled_dot_product_attention forward and backward on the device: plain, causal, boolean and
additive masks, custom scale, inside a model; the backward recomputes the probabilities from the
saved log-sum-exp instead of keeping the queries x keys matrix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager, capture_graphs

g = torch.Generator().manual_seed(11)


def _qkv(batch=2, heads=3, queries=5, keys=7, dim=8):
    return (torch.randn(batch, heads, queries, dim, generator=g), torch.randn(batch, heads, keys, dim, generator=g),
            torch.randn(batch, heads, keys, dim, generator=g))


@pytest.mark.device
@pytest.mark.parametrize("case", ["plain", "causal", "causal_square", "scale", "bool_mask", "float_mask"])
def test_sdpa_forward_and_gradients_match_eager(case):
    q, k, v = _qkv(keys=5 if case == "causal_square" else 7)
    mask = None
    if case == "bool_mask":
        mask = torch.rand(5, 7, generator=g) > 0.3
        mask[:, 0] = True  # every query sees at least one key
    elif case == "float_mask":
        mask = torch.randn(2, 1, 5, 7, generator=g)
    causal = case.startswith("causal")
    scale = 0.2 if case == "scale" else None

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)

    assert_matches_eager(attention, q, k, v)


@pytest.mark.device
@pytest.mark.parametrize(("heads", "kv_heads", "causal"), [(4, 2, True), (6, 1, False), (4, 4, True)])
def test_grouped_query_attention_matches_eager(heads, kv_heads, causal):
    """``enable_gqa=True`` (Llama 3.2, Qwen2.5, SmolLM): key/value heads shared by groups of query
    heads; their gradients sum the group's shares (issue 28: it raised a broadcast error)."""
    q = torch.randn(2, heads, 6, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, 6, 8, generator=g) for _ in range(2))

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    assert_matches_eager(attention, q, k, v)


def test_backward_does_not_keep_the_attention_matrix():
    q, k, v = (t.requires_grad_() for t in _qkv(queries=16, keys=16))
    forward = capture_graphs(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)[0]
    output_node = next(n for n in forward.graph.nodes if n.op == "output")
    shapes = [tuple(n.meta["val"].shape) for n in output_node.args[0] if hasattr(n, "meta")]
    assert (2, 3, 16, 16) not in shapes, shapes
    assert (2, 3, 16) in shapes  # the log-sum-exp per query


@pytest.mark.device
def test_multihead_attention_module_trains_like_eager():
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    x = torch.randn(3, 6, 16, generator=g)
    assert_matches_eager(layer, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_16_bit_sdpa_computes_in_float32_like_eagers_kernel(dtype, is_causal):
    """Scores of magnitude ~50 (OpInfo's samples): rounded to 16 bits they would move every
    probability by percents; eager's CPU flash kernel computes in float32 and rounds the output,
    and its backward takes a float32 log-sum-exp (a 16-bit one was refused)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.empty(2, 3, n, 8).uniform_(-6, 6, generator=generator) for n in (3, 6, 6))
    grad = torch.randn(2, 3, 3, 8, generator=generator)

    def run(fn, cast):
        leaves = [t.to(cast).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, is_causal=is_causal)
        out.backward(grad.to(cast))
        return [out.detach().double(), *(t.grad.double() for t in leaves)]

    reference = run(F.scaled_dot_product_attention, torch.float64)
    eager = run(F.scaled_dot_product_attention, dtype)
    ours = run(torch.compile(F.scaled_dot_product_attention, backend="adreno"), dtype)
    for what, o, e, r in zip(("output", "grad q", "grad k", "grad v"), ours, eager, reference, strict=True):
        ours_off, eager_off = (o - r).abs().max().item(), (e - r).abs().max().item()
        assert ours_off <= 2 * eager_off + 1e-3, f"{what}: ours {ours_off:.3g} from float64, eager {eager_off:.3g}"
