"""scaled_dot_product_attention forward and backward on the device: plain, causal, boolean and
additive masks, custom scale, inside a model; the backward recomputes the probabilities from the
saved log-sum-exp instead of keeping the queries x keys matrix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import LaunchProfile, assert_matches_eager, capture_graphs, record_programs

from torch_adreno.ir.torch_dtypes import TORCH_TO_IR

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
    heads; their gradients sum the group's shares (no broadcast error)."""
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


# -- the fused kernels (kernels/attention.cl) ---------------------------------------------------------

@pytest.fixture
def compiled_programs(monkeypatch):
    """Every KernelProgram the backend compiles while the test runs (with its graph and memory plan)."""
    return record_programs(monkeypatch)


def assert_fused_without_scores(prof, programs, queries, keys):
    """The three fused passes ran, and no compiled graph holds a buffer of queries x keys elements
    (the scores or probabilities of any head) in its memory plan."""
    passes = {o for k in prof.launched if k.kind == "attention" for o in k.build_options if "ATTENTION_PASS" in o}
    assert passes == {f"-DATTENTION_PASS={p}" for p in (1, 2, 3)}, passes  # forward, dQ, dK/dV
    assert programs, "nothing was compiled"
    for program in programs:
        graph = program.graph
        squares = [n for n in program.plan.allocations if n in graph.buffers and graph.buffers[n].numel > 0
                   and graph.buffers[n].numel % (queries * keys) == 0 and tuple(graph.buffers[n].shape[-2:]) == (queries, keys)]
        assert squares == [], f"{graph.name} keeps {[(n, graph.buffers[n].shape) for n in squares]}"


def _attention_case(heads, kv_heads, queries, keys, dim, dtype, causal, generator):
    q = torch.randn(2, heads, queries, dim, generator=generator)
    k, v = (torch.randn(2, kv_heads, keys, dim, generator=generator) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)], (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=kv_heads != heads))


@pytest.mark.device
@pytest.mark.parametrize(("heads", "kv_heads", "queries", "keys", "dim", "causal"), [
    (4, 2, 37, 37, 32, True),      # grouped-query, causal, two key tiles and a partial one
    pytest.param(2, 2, 20, 45, 64, False, marks=pytest.mark.slow),  # more keys than queries
    (3, 1, 45, 20, 64, True),      # causal with more queries than keys (top-left aligned)
    (2, 1, 19, 19, 6, True),       # a head dim not a multiple of 4 (scalar reads, idle head-dim columns)
], ids=["gqa_causal_d32", "d64_long_keys", "mqa_causal_d64", "causal_d6"])
def test_fused_attention_matches_eager(compiled_programs, heads, kv_heads, queries, keys, dim, causal):
    generator = torch.Generator().manual_seed(3)
    inputs, attention = _attention_case(heads, kv_heads, queries, keys, dim, torch.float32, causal, generator)
    prof = assert_matches_eager(attention, *inputs, options={"compile_cache": False})
    assert_fused_without_scores(prof, compiled_programs, queries, keys)
    if dim == 64:
        assert_micro_tiled(prof, queries, keys)


def assert_micro_tiled(prof, queries, keys):
    """Head dim 64: the launches carry the register blocking, 4 x 2 scores per work-item in groups
    of 128 work-items owning 32 rows (queries in the forward and dQ, keys in dK/dV)."""
    fused = {next(o for o in k.build_options if "ATTENTION_PASS" in o): k for k in prof.launched if k.kind == "attention"}
    for attention_pass, (threads, rows, rows_needed) in {1: (128, 32, queries), 2: (128, 32, queries),
                                                        3: (128, 32, keys)}.items():
        kernel = fused[f"-DATTENTION_PASS={attention_pass}"]
        assert "-DMICRO_ROWS=4" in kernel.build_options and "-DMICRO_COLS=2" in kernel.build_options
        assert kernel.local_size[0] == threads, kernel.local_size
        assert kernel.global_size[0] == threads * -(-rows_needed // rows), kernel.global_size


@pytest.mark.device
@pytest.mark.slow
def test_fused_attention_head_dim_128_matches_eager(compiled_programs):
    generator = torch.Generator().manual_seed(4)
    inputs, attention = _attention_case(4, 2, 40, 40, 128, torch.float32, True, generator)
    prof = assert_matches_eager(attention, *inputs, options={"compile_cache": False})
    assert_fused_without_scores(prof, compiled_programs, 40, 40)


@pytest.mark.device
@pytest.mark.parametrize(("dtype", "causal", "kv_heads", "dim"), [
    (torch.float16, True, 2, 64), (torch.bfloat16, False, 1, 32)], ids=["float16_causal_d64", "bfloat16_mqa_d32"])
def test_fused_16_bit_attention_follows_float64_like_eager(compiled_programs, dtype, causal, kv_heads, dim):
    """16-bit storage, float32 arithmetic: the float64 rule of test_graph_accuracy (ours at most
    twice eager's distance from a float64 run, plus a little)."""
    generator = torch.Generator().manual_seed(5)
    inputs, attention = _attention_case(2, kv_heads, 33, 33, dim, torch.float32, causal, generator)
    grad = torch.randn(2, 2, 33, dim, generator=generator)

    def run(fn, cast):
        leaves = [t.to(cast).requires_grad_() for t in inputs]
        out = fn(*leaves)
        out.backward(grad.to(cast))
        return [out.detach().double(), *(t.grad.double() for t in leaves)]

    reference = run(attention, torch.float64)
    eager = run(attention, dtype)
    with LaunchProfile() as prof:
        ours = run(torch.compile(attention, backend="adreno", options={"compile_cache": False}), dtype)
    for what, o, e, r in zip(("output", "grad q", "grad k", "grad v"), ours, eager, reference, strict=True):
        ours_off, eager_off = (o - r).abs().max().item(), (e - r).abs().max().item()
        assert ours_off <= 2 * eager_off + 1e-3, f"{what}: ours {ours_off:.3g} from float64, eager {eager_off:.3g}"
    assert_fused_without_scores(prof, compiled_programs, 33, 33)
    forward = next(k for k in prof.launched if "-DATTENTION_PASS=1" in k.build_options)
    assert [r.dtype for r in forward.arguments].count(TORCH_TO_IR[dtype]) == 4  # q, k, v read and O written in 16 bits


@pytest.mark.device
def test_hand_written_attention_runs_fused(compiled_programs):
    """softmax(q k^T / sqrt(d)) v written out, heads split from a [batch, seq, dim] projection as the
    reference transformer's EncoderLayer does, becomes the fused kernels forward and backward."""
    def attention(x):
        q, k, v = ((x * c).reshape(2, 12, 2, 16).transpose(1, 2) for c in (1.0, 0.5, 2.0))
        return (torch.softmax(q @ k.transpose(-2, -1) / 16**0.5, dim=-1) @ v).transpose(1, 2).reshape(2, 12, 32)

    x = torch.randn(2, 12, 32, generator=g)
    prof = assert_matches_eager(attention, x, options={"compile_cache": False})
    assert_fused_without_scores(prof, compiled_programs, 12, 12)


def test_probabilities_used_elsewhere_stay_decomposed():
    """A chain whose probabilities are also returned is not rewritten (they must exist)."""
    from torch_adreno.frontend.attention_pattern import fuse_attention_patterns

    def attention(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
        return p @ v, p

    def count(gm, example_inputs):
        counts.append(fuse_attention_patterns(gm))
        return gm

    counts = []
    q, k, v = _qkv()
    torch.compile(attention, backend=count)(q, k, v)
    torch.compile(lambda q, k, v: attention(q, k, v)[0], backend=count)(q, k, v)
    assert counts == [0, 1]


@pytest.mark.device
def test_unfused_attention_says_why():
    """An attention the fused kernels do not take (an attn_mask) decomposes with a warning naming
    the reason, kept in UNFUSED_REASONS; no fused kernel runs."""
    from torch_adreno.lowering import attention as fused

    q, k, v = _qkv(queries=6, keys=6)
    mask = torch.randn(6, 6, generator=g)
    fused.UNFUSED_REASONS.clear()
    with pytest.warns(UserWarning, match="attn_mask is not built into the fused kernels"):
        prof = assert_matches_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), q, k, v,
                                    options={"compile_cache": False})
    assert any("attn_mask" in reason for reason in fused.UNFUSED_REASONS)
    assert not [k for k in prof.launched if k.kind == "attention"]


def test_register_blocking_fits_a_gpu_and_an_adreno():
    """Head dim 64, float32: on a 48 KB GPU every pass owns 32 rows and streams 32 in 128
    work-items of 4 x 2 scores; an Adreno's 32 KB takes smaller blocks where it must, still several
    scores per work-item; a blocking whose micro-tile does not divide is refused."""
    from dataclasses import replace

    from torch_adreno.kernels.attention import AttentionBlocks, choose_blocks
    from torch_adreno.lowering.attention import FORWARD, GRAD_KEY_VALUE, GRAD_QUERY
    from torch_adreno.targets import REFERENCE_PROFILE

    gpu = replace(REFERENCE_PROFILE, max_work_group_size=1024, local_mem_bytes=48 * 1024)
    expected = {FORWARD: (32, 32, 4, 2, 128), GRAD_QUERY: (32, 32, 4, 2, 128), GRAD_KEY_VALUE: (32, 32, 4, 2, 128)}
    for template, (rows, cols, micro_rows, micro_cols, threads) in expected.items():
        blocks = choose_blocks(template, 64, 256, gpu)
        assert (blocks.rows, blocks.cols, blocks.micro_rows, blocks.micro_cols) == (rows, cols, micro_rows, micro_cols)
        assert blocks.threads == threads and blocks.local_bytes(template, 64) <= 48 * 1024
        small = choose_blocks(template, 64, 256, REFERENCE_PROFILE)
        assert small.local_bytes(template, 64) <= 32 * 1024 and small.micro_rows * small.micro_cols >= 2
        assert small.threads <= REFERENCE_PROFILE.max_work_group_size
    assert choose_blocks(FORWARD, 8, 256, gpu).col_groups <= 8  # (every work-item owns a head-dim column)
    with pytest.raises(ValueError, match="divide the block sizes"):
        AttentionBlocks(32, 32, 3, 2)



@pytest.mark.device
def test_the_fused_attention_option_decomposes_every_attention():
    """``fused_attention=False``: no fused kernel runs, the results are still eager's, and the
    reason is recorded (what benchmarks/attention.py compares the fused kernels against)."""
    from torch_adreno.lowering import attention as fused

    q, k, v = _qkv(queries=6, keys=6)
    fused.UNFUSED_REASONS.clear()
    prof = assert_matches_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v,
                                options={"compile_cache": False, "fused_attention": False})
    assert not [k for k in prof.launched if k.kind == "attention"]
    assert fused.TURNED_OFF in fused.UNFUSED_REASONS
    prof = assert_matches_eager(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert [k for k in prof.launched if k.kind == "attention"]
