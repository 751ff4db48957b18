"""Mixture-of-experts models train on the device: tiny transformers Mixtral and Qwen2-MoE (random
weights, nothing downloaded) through ``TrainingStep`` with AdamW, replayed, and through
``torch.compile`` in a plain loop, each within 1e-3 of eager; and the routing ops they need.

transformers' default ``experts_implementation`` is "grouped_mm": under ``torch.compile`` the
router's ``topk``, then ``sort`` of the expert ids, ``histc`` of the tokens per expert, a
``cumsum`` of it as group ends, and ``grouped_mm_fallback`` (transformers' custom op; for float32
weights) or ``aten._grouped_mm`` (bfloat16) for the experts' products. The "eager" implementation
loops over the experts that got tokens (``nonzero``, ``torch.where(mask)``): shapes that are
tensor values, which ``TrainingStep`` refuses with a clear error.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager, assert_ran_on_device

import torch_adreno
from torch_adreno.errors import UnsupportedOpError

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.device

VOCAB, SEQ, BATCH, STEPS = 64, 8, 2, 6
#: What the models' graphs must have run on the device (the routing and the experts' products).
ROUTING_OPS = {"aten.topk.default", "aten.sort.default", "aten.histc.default",
               "transformers.grouped_mm_fallback.default", "transformers.grouped_mm_fallback_backward.default"}


def _mixtral(layers: int = 2) -> torch.nn.Module:
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=VOCAB, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=16)
    return transformers.MixtralForCausalLM(config)


def _qwen2_moe() -> torch.nn.Module:
    # (a shared expert beside the routed ones, gated by a sigmoid)
    config = transformers.Qwen2MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=VOCAB, num_experts=4, num_experts_per_tok=2,
                                         max_position_embeddings=16)
    return transformers.Qwen2MoeForCausalLM(config)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe}


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y).loss


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(x, x) for x in (torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator) for _ in range(STEPS))]


def _eager_training(model: torch.nn.Module) -> tuple[list[float], torch.nn.Module]:
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches():
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _assert_trained_like_eager(losses: list[float], model: torch.nn.Module, eager_losses: list[float],
                               eager: torch.nn.Module, start: dict[str, torch.Tensor]) -> None:
    """Every step's loss and every parameter within 1e-3 of eager's, relative (a parameter: its
    largest difference against its largest magnitude); every parameter changed."""
    for step, (ours, theirs) in enumerate(zip(losses, eager_losses, strict=True)):
        assert abs(ours - theirs) <= 1e-3 * abs(theirs), f"step {step}: loss {ours}, eager {theirs}"
    reference = dict(eager.named_parameters())
    for name, p in model.named_parameters():
        q = reference[name].detach()
        difference = float((p.detach() - q).abs().max())
        assert difference <= 1e-3 * float(q.abs().max()), f"{name}: {difference:.3g} from eager (max |p| {q.abs().max():.3g})"
        assert not torch.equal(p.detach(), start[name]), f"{name} was not updated"


def _launched_ops(prof: torch_adreno.profile) -> set[str]:
    return {op for kernel in prof.kernels for op in kernel.aten_ops}


# CI runs each model through one of the two paths (Mixtral replayed in the TrainingStep, Qwen2-MoE in
# the plain loop): their experts run the same code, and compiling a model costs PoCL tens of
# seconds. The other two are marked slow (TORCH_ADRENO_CI_SLOW=1 runs them).
@pytest.mark.parametrize("name", ["mixtral", pytest.param("qwen2_moe", marks=pytest.mark.slow)])
def test_trains_through_the_training_step_like_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    assert model.config._experts_implementation == "grouped_mm"  # transformers' default
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    eager_losses, eager = _eager_training(model)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.AdamW(model.parameters(), lr=1e-2))
    with torch_adreno.profile() as prof:
        losses = [float(step(x, y)) for x, y in _batches()]
    step.synchronize()
    # Two calls through the compiled graphs (the second captured them), then replays.
    assert step.replayed_steps == prof.replayed_steps == STEPS - 2
    assert_ran_on_device(prof, ["forward", "backward"])
    assert _launched_ops(prof) >= ROUTING_OPS, sorted(ROUTING_OPS - _launched_ops(prof))
    _assert_trained_like_eager(losses, model, eager_losses, eager, start)


@pytest.mark.parametrize("name", [pytest.param("mixtral", marks=pytest.mark.slow), "qwen2_moe"])
def test_trains_through_torch_compile_like_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    eager_losses, eager = _eager_training(model)
    compiled = torch.compile(model, backend="adreno", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with torch_adreno.profile() as prof:
        for x, y in _batches():
            opt.zero_grad(set_to_none=True)
            loss = _loss(compiled, x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert_ran_on_device(prof, ["forward", "backward"])
    assert _launched_ops(prof) >= ROUTING_OPS, sorted(ROUTING_OPS - _launched_ops(prof))
    _assert_trained_like_eager(losses, model, eager_losses, eager, start)


@pytest.mark.slow
def test_bfloat16_weights_train_through_aten_grouped_mm():
    """bfloat16 weights take torch's own grouped product (``aten._grouped_mm``, forward and the
    backward's other forms) instead of transformers' custom op: losses within bfloat16's
    precision of eager bfloat16 training, replayed."""
    torch.manual_seed(0)
    model = _mixtral().to(torch.bfloat16)
    eager = copy.deepcopy(model)
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    eager_losses = []
    for x, y in _batches()[:4]:
        opt.zero_grad(set_to_none=True)
        loss = _loss(eager, x, y)
        loss.backward()
        opt.step()
        eager_losses.append(loss.item())
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.AdamW(model.parameters(), lr=1e-2))
    with torch_adreno.profile() as prof:
        losses = [float(step(x, y)) for x, y in _batches()[:4]]
    assert step.replayed_steps == 2
    assert "aten._grouped_mm.default" in _launched_ops(prof)
    for ours, theirs in zip(losses, eager_losses, strict=True):
        assert abs(ours - theirs) <= 1e-2 * abs(theirs), (losses, eager_losses)


def test_the_eager_experts_loop_trains_in_pieces_and_says_how_to_replay(caplog):
    """transformers' "eager" experts loop has shapes that are tensor values: TrainingStep trains it
    in pieces, as torch.compile does, and its one warning names the line and the implementation
    that is one graph."""
    torch.manual_seed(0)
    # One layer: each layer's experts loop breaks the graph alike, and every piece compiles anew.
    model = _mixtral(layers=1)
    model.set_experts_implementation("eager")
    eager = copy.deepcopy(model)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.AdamW(model.parameters(), lr=1e-2))
    with caplog.at_level(logging.WARNING, logger="torch_adreno"):
        for x, y in _batches()[:2]:
            eager_opt.zero_grad(set_to_none=True)
            expected = _loss(eager, x, y)
            expected.backward()
            eager_opt.step()
            assert abs(float(step(x, y)) - expected.item()) <= 1e-3 * abs(expected.item())
    assert step.replayed_steps == 0
    (message,) = [r.getMessage() for r in caplog.records if "graph break" in r.getMessage()]
    assert "modeling_mixtral.py" in message and "set_experts_implementation('grouped_mm')" in message, message


# -- the routing ops ---------------------------------------------------------------------------------


def test_topk_and_sort_of_router_probabilities():
    probabilities = torch.softmax(torch.randn(16, 8), dim=-1)
    assert_matches_eager(lambda p: torch.topk(p, 2, dim=-1), probabilities)
    assert_matches_eager(lambda p: torch.topk(p, 3, dim=0, largest=False), probabilities)
    assert_matches_eager(lambda p: torch.sort(p, dim=-1, descending=True), probabilities)
    ids = torch.randint(0, 4, (32,))
    # Integer ids sorted stably (many equal values): the indices are eager's too.
    assert_matches_eager(lambda i: torch.sort(i, stable=True), ids, grad=False)


def test_equal_values_are_taken_by_position():
    """Ties. ``sort(stable=True)`` gives eager's indices exactly. ``topk`` and the unstable
    ``sort`` take equal values by position too (stable), where eager's order of equal values is
    whatever its C++ selection leaves (PyTorch specifies none): the values are eager's, the indices
    the stable ones. Gradients are eager's where the tied values are all selected; where a tie
    straddles the k-th place, they are the gradients of the stable choice (eager's for
    ``sort(stable=True)``'s first k)."""
    x = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.4, 0.2, 0.2, 0.2], [0.1, 0.4, 0.1, 0.4]])
    assert_matches_eager(lambda x: torch.sort(x, stable=True), x)
    assert_matches_eager(lambda x: torch.sort(x, descending=True, stable=True), x)
    top = torch.compile(lambda x: torch.topk(x, 2), backend="adreno", fullgraph=True)
    ours = top(x)
    stable = torch.sort(x, descending=True, stable=True)
    assert torch.equal(ours.values, torch.topk(x, 2).values)
    assert torch.equal(ours.indices, stable.indices[:, :2])
    # The ties of rows 1 and 3 all selected: a loss weighing the selected values alike.
    assert_matches_eager(lambda x: torch.topk(x, 3).values.sum(), x[1:2])
    assert_matches_eager(lambda x: torch.topk(x, 2).values.sum(), x[3:4])
    # Rows 0 and 2: the tie straddles the second place.
    weights = torch.tensor([[1.0, 2.0]])
    leaf = x.clone().requires_grad_()
    (top(leaf).values * weights).sum().backward()
    reference = x.clone().requires_grad_()
    (torch.sort(reference, descending=True, stable=True).values[:, :2] * weights).sum().backward()
    assert torch.equal(leaf.grad, reference.grad)


def test_sort_and_topk_order_nan_as_largest():
    x = torch.tensor([[1.0, float("nan"), -2.0, 3.0, float("nan"), -0.0, 0.0]])
    for fn in (lambda x: torch.sort(x, stable=True), lambda x: torch.sort(x, descending=True, stable=True),
               lambda x: torch.topk(x, 3), lambda x: torch.topk(x, 3, largest=False)):
        torch._dynamo.reset()
        (values, indices), (eager_values, eager_indices) = torch.compile(fn, backend="adreno")(x), fn(x)
        torch.testing.assert_close(values, eager_values, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(indices, eager_indices), (indices, eager_indices)
        assert torch.equal(torch.signbit(values), torch.signbit(eager_values))  # (-0.0 before 0.0, by position)


def test_histc_counts_tokens_per_expert_like_eager():
    ids = torch.randint(0, 6, (40,)).float()
    prof = assert_matches_eager(lambda i: torch.histc(i, bins=6, min=0, max=5), ids, grad=False)
    assert "aten.histc.default" in _launched_ops(prof)
    # The range from the data (min == max), and values on the bin edges.
    assert_matches_eager(lambda x: torch.histc(x, bins=10), torch.linspace(-1, 1, 101) * 3, grad=False)
    assert_matches_eager(lambda x: torch.histc(x, bins=4, min=0, max=2), torch.tensor([0.0, 0.5, 1.0, 2.0, 2.5, -1.0]),
                         grad=False)


def test_histc_of_data_that_is_not_finite_raises_like_eager():
    x = torch.tensor([1.0, float("inf"), 2.0])
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(x, bins=3)
    with pytest.raises(RuntimeError, match="not finite"):
        torch.compile(lambda x: torch.histc(x, bins=3), backend="adreno", fullgraph=True)(x)


def test_one_hot_and_its_class_checks():
    """``one_hot`` (a router's expert mask, the load-balancing loss) checks its classes on the
    device: a class out of range raises eager's message."""
    ids = torch.tensor([[0, 3], [2, 1], [3, 3]])
    one_hot = torch.compile(lambda i: F.one_hot(i, 5), backend="adreno", fullgraph=True)
    with torch_adreno.profile() as prof:
        assert torch.equal(one_hot(ids), F.one_hot(ids, 5))
    assert_ran_on_device(prof)
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        one_hot(torch.tensor([[0, 5], [1, 1], [2, 2]]))
    with pytest.raises(RuntimeError, match="Class values must be non-negative"):
        one_hot(torch.tensor([[0, -1], [1, 1], [2, 2]]))


def test_transformers_grouped_mm_and_its_backward():
    """Against transformers' own eager loop of per-expert products: an empty group, and rows past
    the last group end (which come out 0, as transformers' op leaves them)."""
    import transformers.integrations.moe  # noqa: F401  (registers transformers' custom ops)

    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    x, w = torch.randn(10, 6), torch.randn(3, 6, 5)
    prof = assert_matches_eager(lambda x, w: torch.ops.transformers.grouped_mm_fallback(x, w, offs), x, w)
    launched = _launched_ops(prof)
    assert {"transformers.grouped_mm_fallback.default", "transformers.grouped_mm_fallback_backward.default"} <= launched


@pytest.mark.parametrize("form", ["2d-3d", "2d-2d", "3d-2d", "3d-3d"])
def test_aten_grouped_mm_in_bfloat16(form):
    """``torch._grouped_mm`` (transformers' grouped path with bfloat16 weights; its backward is
    the op again, in the other forms)."""
    offs = torch.tensor([2, 5, 8], dtype=torch.int32)
    operands = {"2d-3d": ((8, 8), (3, 8, 16)), "2d-2d": ((16, 8), (8, 16)), "3d-2d": ((3, 16, 8), (8, 8)),
                "3d-3d": ((3, 8, 8), (3, 8, 16))}[form]
    a, b = (torch.randn(*shape).bfloat16() for shape in operands)
    grouped = offs if form != "3d-3d" else None
    prof = assert_matches_eager(lambda a, b: torch._grouped_mm(a, b, offs=grouped), a, b, grad=False, rtol=1.6e-2,
                                atol=1e-5)
    assert "aten._grouped_mm.default" in _launched_ops(prof)


def test_a_loss_with_shapes_of_tensor_values_is_refused_clearly():
    """Any loss whose shapes are tensor values (a boolean mask's selection) stops with a clear
    error naming the line."""
    model = torch.nn.Linear(4, 4)

    def positive_mean(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        return out[out > 0].mean()

    step = torch_adreno.TrainingStep(model, positive_mean, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(UnsupportedOpError, match="depends on tensor values") as caught:
        step(torch.randn(3, 4))
    assert "test_moe.py" in str(caught.value) and "out[out > 0]" in str(caught.value), str(caught.value)


def test_aten_grouped_mm_gradients():
    """The backward of ``torch._grouped_mm`` (rows by group) is ``_grouped_mm`` in its other forms:
    gradients against per-group products in float32, within bfloat16's precision (eager's CPU
    kernel has no backward for these operands)."""
    ends = [2, 5, 8]
    offs = torch.tensor(ends, dtype=torch.int32)
    a, b = torch.randn(8, 8).bfloat16(), torch.randn(3, 8, 16).bfloat16()
    weights = torch.linspace(0.5, 1.5, 8 * 16).reshape(8, 16)
    ours_a, ours_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    with torch_adreno.profile() as prof:
        out = torch.compile(lambda a, b: torch._grouped_mm(a, b, offs=offs), backend="adreno", fullgraph=True)(
            ours_a, ours_b)
        (out.float() * weights).sum().backward()
    assert_ran_on_device(prof, ["forward", "backward"])
    exact_a, exact_b = a.float().requires_grad_(), b.float().requires_grad_()
    rows = [exact_a[start:end] @ exact_b[e] for e, (start, end) in enumerate(zip([0, *ends], ends, strict=False))]
    (torch.cat(rows) * weights).sum().backward()
    torch.testing.assert_close(ours_a.grad.float(), exact_a.grad, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(ours_b.grad.float(), exact_b.grad, rtol=1.6e-2, atol=1e-2)
