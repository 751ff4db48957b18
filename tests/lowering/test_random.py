"""Random ops on the device: dropout and rand/randn/bernoulli, checked by distribution, by the
agreement of the forward mask with the gradient, and by repeatability under torch.manual_seed
(the device generator is Philox, not eager's: values differ from eager by design)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_adreno

DROPOUT = "aten.native_dropout.default"


def _compiled(fn):
    return torch.compile(fn, backend="adreno", fullgraph=True)


def _assert_drawn_on_the_device(prof: torch_adreno.profile, *ops: str) -> None:
    """Each random op in ``ops`` was part of a launched kernel and nothing ran on the host: eager's
    generator, which would pass the distribution checks too, was not what produced the numbers."""
    assert prof.host_ops == [] and prof.host_fallback_ops == []
    launched = {o for k in prof.kernels for o in k.aten_ops}
    assert set(ops) <= launched, (sorted(set(ops) - launched), sorted(launched))


@pytest.mark.device
def test_dropout_keeps_one_minus_p_scales_and_backward_uses_the_same_mask():
    p = 0.3
    compiled = _compiled(lambda x: F.dropout(x, p, training=True) * 2)
    x = torch.randn(400, 250, requires_grad=True)
    with torch_adreno.profile() as prof:
        out = compiled(x)
        out.sum().backward()
    _assert_drawn_on_the_device(prof, DROPOUT)
    assert any(k.graph.startswith("backward") for k in prof.kernels)
    keep = out != 0
    n = keep.numel()
    # Within 5 standard deviations of a Binomial(n, 1 - p) fraction.
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(out[keep], x.detach()[keep] * 2 / (1 - p))
    torch.testing.assert_close(x.grad, keep.float() * 2 / (1 - p))


@pytest.mark.device
def test_random_ops_repeat_under_manual_seed_and_differ_between_calls():
    compiled = _compiled(lambda x: F.dropout(x, 0.5, training=True) + torch.rand_like(x))
    x = torch.randn(64, 32)
    with torch_adreno.profile() as prof:
        torch.manual_seed(7)
        first, second = compiled(x), compiled(x)
        torch.manual_seed(7)
        again = compiled(x)
    _assert_drawn_on_the_device(prof, DROPOUT, "aten.rand_like.default")
    assert prof.kernel_launches == 3 * len({k.name for k in prof.kernels})
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


@pytest.mark.device
def test_dropout_masks_are_independent_across_elements_and_ops():
    compiled = _compiled(lambda x: (F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)))
    with torch_adreno.profile() as prof:
        a, b = compiled(torch.ones(200, 200))
    _assert_drawn_on_the_device(prof, DROPOUT)
    keep_a, keep_b = (a != 0).float(), (b != 0).float()
    # Two independent Bernoulli(1/2) masks agree on half of the elements.
    assert abs((keep_a == keep_b).float().mean().item() - 0.5) < 0.02
    # Neighbouring elements are uncorrelated (a weak counter-based generator would show it here).
    neighbours = (keep_a[:, 1:] == keep_a[:, :-1]).float().mean().item()
    assert abs(neighbours - 0.5) < 0.02


@pytest.mark.device
def test_rand_randn_bernoulli_distributions():
    def sample(x):
        return torch.rand(x.shape), torch.randn_like(x), torch.bernoulli(x, 0.25)

    with torch_adreno.profile() as prof:
        u, z, b = _compiled(sample)(torch.empty(300, 300))
    _assert_drawn_on_the_device(prof, "aten.rand.default", "aten.randn_like.default", "aten.bernoulli.p")
    assert u.min().item() >= 0 and u.max().item() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert abs(z.mean().item()) < 0.02 and abs(z.var().item() - 1) < 0.03
    assert abs(((z.abs() < 1).float().mean().item()) - 0.6827) < 0.01
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean().item() - 0.25) < 0.01


@pytest.mark.device
def test_dropout_in_eval_mode_is_identity():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    x = torch.randn(4, 8)
    with torch_adreno.profile() as prof:
        out = _compiled(model)(x)
    torch.testing.assert_close(out, model(x))
    _assert_drawn_on_the_device(prof, "aten.addmm.default")
    assert not any(DROPOUT in k.aten_ops for k in prof.kernels), "eval mode draws no mask"


@pytest.mark.device
def test_a_model_with_dropout_trains_and_its_gradients_match_eager_given_the_mask():
    """Eager on the same mask (recovered from the output) gives the same loss and gradients."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 32)
    head = torch.nn.Linear(32, 4)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def hidden(x):
        return F.dropout(F.relu(lin(x)), 0.25, training=True)

    def step(x, y):
        h = hidden(x)
        return F.cross_entropy(head(h), y), h

    with torch_adreno.profile() as prof:
        loss, h = _compiled(step)(x, y)
        grads = torch.autograd.grad(loss, [lin.weight, head.weight])
    _assert_drawn_on_the_device(prof, DROPOUT, "aten.addmm.default")
    keep = (h != 0).float()
    h_ref = F.relu(lin(x)) * keep / 0.75
    ref_loss = F.cross_entropy(head(h_ref), y)
    ref_grads = torch.autograd.grad(ref_loss, [lin.weight, head.weight])
    torch.testing.assert_close(loss, ref_loss)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_a_graph_draws_one_seed_for_all_its_random_ops():
    """One 8-byte upload per call however many dropouts: ops differ by stream, not by seed."""
    from helpers import capture_graphs

    from torch_adreno.config import Config
    from torch_adreno.lowering import lower_graph

    def three_random_ops(x):
        return F.dropout(x, 0.5, training=True) + F.dropout(x, 0.2, training=True) + torch.rand_like(x)

    forward = capture_graphs(three_random_ops, torch.randn(4, 5))[0]
    graph = lower_graph(forward, Config(), "g")
    assert len(graph.random_seeds) == 1
    assert graph.inputs[-1] == graph.random_seeds[0]
