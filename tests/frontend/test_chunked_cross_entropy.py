"""A language-model head fused with its cross-entropy, chunked: the loss and the
gradients as eager computes them, held to float64 as tests/frontend/test_graph_accuracy.py holds outputs
(RMSE from float64 at most twice eager float32's, plus a few ulps), while no kernel writes the
``tokens x vocab`` logits and the planned peak drops by about their size.

A tiny language model (a token table, a projection, a LayerNorm and a head; vocabulary 1,024,
256 tokens) with chunk budgets small enough that the logits come in several chunks. Host tests
check the pass's choices and the decompositions on real tensors against ``F.cross_entropy``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import LaunchProfile
from torch import nn

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.errors import OptionError
from torch_adreno.frontend import fused_cross_entropy as fused
from torch_adreno.runtime.frozen import FROZEN_COPIES

VOCAB, D, BATCH, SEQ, IGNORE = 1024, 16, 2, 128, 7
TOKENS = BATCH * SEQ
LOGITS_BYTES = TOKENS * VOCAB * 4
#: Chunks of all 256 tokens by 512 words: two chunks of the vocabulary.
TWO_WORD_CHUNKS = TOKENS * 512 * 4
#: Chunks of 128 tokens by 256 words (the budget holds too few words for all 256 tokens).
EIGHT_CHUNKS = 128 * 256 * 4
FLOOR = 4 * 2.0**-24


class TinyLM(nn.Module):
    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, D)
        self.proj = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        if tied:
            self.head.weight = self.table.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.tanh(self.proj(self.table(tokens)))))


def _model(tied: bool = True) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(tied)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    tokens, targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    targets[0, :40] = IGNORE  # the ignored tokens: no loss, no gradient
    return tokens, targets


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE, reduction=reduction)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(((a.double() - b.double()) ** 2).mean().item())


def _assert_as_close_as_eager(ours: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    rms = math.sqrt((exact.double() ** 2).mean().item())
    error, eager_error = _rmse(ours, exact), _rmse(eager, exact)
    assert error <= 2 * eager_error + FLOOR * rms, (what, error, eager_error)


def _eager_gradients(model: nn.Module, dtype: torch.dtype, reduction: str = "mean"
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = model.to(dtype)
    loss = _loss(model, *_batch(), reduction=reduction)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _largest_write(prof: LaunchProfile) -> int:
    """The most bytes one kernel of the loss's graphs wrote (not the optimizer's)."""
    return max(k.bytes_written for k in prof.kernels if k.graph.startswith(("forward", "backward")))


# -- on the device ------------------------------------------------------------------------------------


def _compiled_run(option: Any, reduction: str = "mean") -> tuple[float, dict[str, torch.Tensor], LaunchProfile]:
    torch._dynamo.reset()
    model = _model()
    compiled = torch.compile(lambda t, y: _loss(model, t, y, reduction), backend="adreno", fullgraph=True,
                             options={"chunked_cross_entropy": option})
    with LaunchProfile() as prof:
        loss = compiled(*_batch())
        loss.backward()
    return float(loss), {n: p.grad for n, p in model.named_parameters()}, prof


@pytest.mark.device
def test_tied_head_loss_and_gradients_match_float64_without_the_logits_in_memory():
    """The head tied to the trainable token table: grad_W (the table's share from the head) too."""
    loss, grads, prof = _compiled_run(TWO_WORD_CHUNKS)
    eager_loss, eager_grads = _eager_gradients(_model(), torch.float32)
    exact_loss, exact_grads = _eager_gradients(_model(), torch.float64)
    _assert_as_close_as_eager(torch.tensor(loss), eager_loss, exact_loss, "loss")
    for name, exact in exact_grads.items():
        _assert_as_close_as_eager(grads[name], eager_grads[name], exact, name)
    assert prof.host_fallback_ops == []
    # No kernel writes the logits: the largest write is a chunk's (256 tokens x 512 words), and
    # the step's planned peak is below the logits' bytes, which the unfused graphs keep (the
    # slow test below compares the two).
    assert _largest_write(prof) <= TWO_WORD_CHUNKS < LOGITS_BYTES, _largest_write(prof)
    assert prof.step_peak_device_bytes() < LOGITS_BYTES - TWO_WORD_CHUNKS // 2, prof.step_peak_device_bytes()


@pytest.mark.device
@pytest.mark.slow
def test_the_fused_peak_is_below_the_unfused_one_by_about_the_logits():
    _, fused_grads, fused_run = _compiled_run(TWO_WORD_CHUNKS)
    _, unfused_grads, unfused_run = _compiled_run(False)
    assert _largest_write(unfused_run) >= LOGITS_BYTES  # the head's GEMM writes every logit
    saved = unfused_run.step_peak_device_bytes() - fused_run.step_peak_device_bytes()
    assert saved >= LOGITS_BYTES - TWO_WORD_CHUNKS, (saved, LOGITS_BYTES)
    torch.testing.assert_close(fused_grads["proj.weight"], unfused_grads["proj.weight"], rtol=1e-4, atol=1e-6)


@pytest.mark.device
@pytest.mark.slow
def test_untied_trainable_head_trains_in_a_replayed_step_with_grad_w():
    """TrainingStep over an untied, trainable head, chunks of 128 tokens by 256 words (the head's
    gradient summed over the tokens' chunks), reduction='sum': one SGD step's update is ``-lr``
    times the gradient; the third step is replayed."""
    torch._dynamo.reset()
    lr = 0.01
    model = _model(tied=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    step = torch_adreno.TrainingStep(model, lambda m, t, y: _loss(m, t, y, "sum"), torch.optim.SGD(model.parameters(), lr=lr),
                                     {"chunked_cross_entropy": EIGHT_CHUNKS})
    with LaunchProfile() as first:
        step(*_batch())
    step.synchronize()
    grads = {n: (before[n] - p.detach()) / lr for n, p in model.named_parameters()}
    _, eager_grads = _eager_gradients(_model(tied=False), torch.float32, "sum")
    exact_loss, exact_grads = _eager_gradients(_model(tied=False), torch.float64, "sum")
    # (the update's own rounding, p - lr * g in float32, is part of both sides' error here)
    for name in ("head.weight", "proj.weight", "table.weight"):
        eager_update = (before[name] - (before[name] - lr * eager_grads[name])) / lr
        _assert_as_close_as_eager(grads[name], eager_update, exact_grads[name], name)
    assert _largest_write(first) <= EIGHT_CHUNKS
    with LaunchProfile() as later:
        for _ in range(2):
            losses = step(*_batch())
    assert later.replayed_steps == 1 and float(losses) < float(exact_loss)
    assert _largest_write(later) <= EIGHT_CHUNKS


@pytest.mark.device
def test_autocast_bf16_head_reads_the_frozen_copy_and_follows_eager_autocast():
    """The head in bfloat16 under autocast, the loss in float32: a frozen tied head's cast is the
    frozen copy ``frozen_casts`` keeps (made once), and the loss is eager autocast's."""
    torch._dynamo.reset()
    bf16 = torch.bfloat16

    def loss_fn(m: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=bf16):
            logits = m(tokens).reshape(-1, VOCAB)
        return F.cross_entropy(logits.float(), targets.reshape(-1), ignore_index=IGNORE)

    model = _model()
    model.table.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    made = FROZEN_COPIES.copies_made
    step = torch_adreno.TrainingStep(model, loss_fn, torch.optim.SGD(trainable, lr=0.1),
                                     {"chunked_cross_entropy": TWO_WORD_CHUNKS})
    with LaunchProfile() as prof:
        ours = float(step(*_batch()))
    assert FROZEN_COPIES.copies_made - made == 1  # the table as the head reads it (the embedding reads float32)
    eager = float(loss_fn(_model(), *_batch()))
    assert abs(ours - eager) <= 2e-2 * abs(eager), (ours, eager)
    # The chunk's GEMM writes bfloat16 logits (2 bytes a word); nothing writes all of them.
    assert _largest_write(prof) <= TWO_WORD_CHUNKS // 2
    assert any(k.kind == "gemm" and k.bytes_written == TOKENS * 512 * 2 for k in prof.kernels)
    # Replayed from the third step, reading the same copy: none made again.
    with LaunchProfile() as later:
        for _ in range(2):
            step(*_batch())
    assert later.replayed_steps == 1 and FROZEN_COPIES.copies_made - made == 1
    assert _largest_write(later) <= TWO_WORD_CHUNKS // 2


# -- on the host: the pass's choices and the decompositions -------------------------------------------


def _dynamo_graph(fn: Any, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    graphs = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=keep, fullgraph=True)(*inputs)
    return graphs[0]


def _fused_ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops.adreno.linear_cross_entropy.default]


def test_auto_fuses_only_above_the_threshold_and_false_never():
    model = _model()
    small = _dynamo_graph(lambda t, y: _loss(model, t, y), *_batch())
    assert fused.fuse_head_and_loss(small, Config.from_options()) == 0  # 1 MB of logits: below 32 MB
    assert fused.fuse_head_and_loss(small, Config.from_options({"chunked_cross_entropy": False})) == 0
    assert fused.fuse_head_and_loss(small, Config.from_options({"chunked_cross_entropy": True})) == 1
    (op,) = _fused_ops(small)
    assert op.args[3:] == (IGNORE, "mean", TOKENS, VOCAB, torch.float32)
    assert not any(n.target is F.cross_entropy for n in small.graph.nodes)
    big = torch.randint(0, VOCAB, (BATCH, 4096))
    large = _dynamo_graph(lambda t, y: _loss(model, t, y), big, big)  # 8,192 tokens: 32 MB of logits
    assert fused.fuse_head_and_loss(large, Config.from_options()) == 1
    assert _fused_ops(large)[0].args[5:7] == (1024, VOCAB)  # 1,024 tokens x the whole vocabulary: 4 MB
    # On a device of 141 GB (a data-center GPU) the threshold is 1/256 of it: 32 MB of logits stay unfused;
    # on a phone's 5.4 GB, 32 MB is the threshold.
    desktop, phone = 141 << 30, int(5.4 * 2**30)
    large = _dynamo_graph(lambda t, y: _loss(model, t, y), big, big)
    assert fused.fuse_head_and_loss(large, Config.from_options(), global_mem_bytes=desktop) == 0
    assert fused.fuse_head_and_loss(large, Config.from_options(), global_mem_bytes=phone) == 1


@pytest.mark.parametrize("form", ["linear", "matmul"])
def test_the_rewritten_graph_computes_the_loss_and_gradients_on_the_host(form):
    """The pass's graph run eagerly (the op's own kernel is its chunked decomposition): ``hidden @
    table.T`` as well as the linear head."""
    model = _model()

    def loss(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = model.norm(model.table(t))
        logits = model.head(hidden) if form == "linear" else hidden @ model.table.weight.T
        return F.cross_entropy(logits.view(-1, VOCAB).float(), y.view(-1), ignore_index=IGNORE, reduction="sum")

    def fusing(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        assert fused.fuse_head_and_loss(gm, Config.from_options({"chunked_cross_entropy": EIGHT_CHUNKS})) == 1
        return gm.forward

    torch._dynamo.reset()
    ours = torch.compile(loss, backend=fusing, fullgraph=True)(*_batch())
    (grad,) = torch.autograd.grad(ours, model.table.weight)
    expected = loss(*_batch())
    (expected_grad,) = torch.autograd.grad(expected, model.table.weight)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("case", "reason"), [
    ("label_smoothing", "label_smoothing=0.1 is not fused"),
    ("none", "reduction='none' is not fused"),
    ("bias", "the head has a bias"),
    ("logits_read", "the logits are also read outside the loss"),
])
def test_unfusable_chains_stay_with_a_reason_or_are_refused_when_forced(case, reason, caplog):
    model = _model()
    biased = nn.Linear(D, VOCAB)

    def loss(t: torch.Tensor, y: torch.Tensor) -> Any:
        hidden = model.norm(model.table(t))
        logits = (biased(hidden) if case == "bias" else model.head(hidden)).reshape(-1, VOCAB)
        value = F.cross_entropy(logits, y.reshape(-1), label_smoothing=0.1 if case == "label_smoothing" else 0.0,
                                reduction="none" if case == "none" else "mean")
        return (value, logits.amax()) if case == "logits_read" else value

    big = torch.randint(0, VOCAB, (BATCH, 4096))  # 32 MB of logits: "auto" would fuse them
    with caplog.at_level(logging.INFO, logger="torch_adreno"):
        assert fused.fuse_head_and_loss(_dynamo_graph(loss, big, big), Config.from_options()) == 0
    assert reason in caplog.text
    gm = _dynamo_graph(loss, *_batch())
    with pytest.raises(OptionError, match=reason):
        fused.fuse_head_and_loss(gm, Config.from_options({"chunked_cross_entropy": True}))


def test_option_values_and_unknown_options():
    assert Config.from_options().chunked_cross_entropy == "auto"
    assert Config.from_options({"chunked_cross_entropy": 4096}).chunked_cross_entropy == 4096
    assert Config.from_options({}, {"TORCH_ADRENO_CHUNKED_CROSS_ENTROPY": "off"}).chunked_cross_entropy is False
    with pytest.raises(ValueError, match="positive number"):
        Config.from_options({"chunked_cross_entropy": -1})
    with pytest.raises(ValueError, match="chunked_cross_entropy"):  # the valid options are named
        Config.from_options({"chunked_cross_entropies": True})


def test_chunk_shape_keeps_the_budget():
    gpt2 = fused.chunk_shape(1024, 50257)
    assert gpt2.tokens == 1024 and gpt2.tokens * gpt2.words * 4 <= fused.CHUNK_LOGITS_BYTES
    assert math.ceil(50257 / gpt2.words) == 7  # W read once per pass, in 7 slices
    small = fused.chunk_shape(TOKENS, VOCAB, EIGHT_CHUNKS)
    assert (small.tokens, small.words) == (128, 256)
    assert fused.chunk_shape(10, 100) == fused.ChunkShape(10, 100)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_decompositions_compute_cross_entropy_and_its_gradients(reduction):
    """The chunked forward and backward on real float64 tensors (3 x 3 chunks, the last ones
    partial) against F.cross_entropy's autograd."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 37, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (74,), generator=g)
    targets[::5] = IGNORE
    loss, lse = fused.chunked_forward(hidden, weight, targets, IGNORE, reduction, 30, 20, torch.float64)
    expected = F.cross_entropy(hidden.reshape(-1, 8) @ weight.t(), targets, ignore_index=IGNORE, reduction=reduction)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(lse, torch.logsumexp(hidden.reshape(-1, 8) @ weight.t(), 1))
    expected.backward()
    grad = torch.tensor(1.5, dtype=torch.float64)
    grad_hidden, grad_weight = fused.chunked_backward(grad, hidden.detach(), weight.detach(), targets, lse, IGNORE,
                                                      reduction, 30, 20, True, True)
    torch.testing.assert_close(grad_hidden, 1.5 * hidden.grad)
    torch.testing.assert_close(grad_weight, 1.5 * weight.grad)
