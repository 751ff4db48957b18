"""PyTorch's module database in training mode (``torch_adreno.tools.testing.modules``), a fast subset.

Every sample of the subset: forward, input and parameter gradients, one SGD step and a second
forward against eager. The whole database runs as ``python -m torch_adreno modules --jsonl F``
(its counts are on the performance page); here the modules users train most, with a few samples
each, must pass, or fail only where ``aot_eager`` (PyTorch's reference backend) fails alike.
"""

from __future__ import annotations

import copy

import pytest
import torch

from torch_adreno.tools.testing import modules
from torch_adreno.tools.testing.opinfo import PASS, WRONG_RESULT

pytest.importorskip("expecttest")  # PyTorch's test databases need it

#: Module -> samples taken (the first n of module_db's, training mode).
SUBSET = {
    "nn.Linear": 3, "nn.Conv2d": 3, "nn.BatchNorm2d": 3, "nn.LayerNorm": 3, "nn.GroupNorm": 2,
    "nn.Embedding": 2, "nn.MultiheadAttention": 6, "nn.TransformerEncoderLayer": 4,
    "nn.TransformerDecoderLayer": 2, "nn.CrossEntropyLoss": 3, "nn.GELU": 1, "nn.LSTMCell": 2,
    "nn.ConvTranspose2d": 2, "nn.MaxPool2d": 2, "nn.PReLU": 2,
}


@pytest.mark.device
@pytest.mark.parametrize("name", sorted(SUBSET))
def test_module_db_samples_train_like_eager(name: str) -> None:
    (info,) = modules.module_infos([name])
    outcomes = [modules.run_sample(info, index, sample) for index, sample in modules.samples(info, SUBSET[name])]
    assert outcomes
    problems = [f"[{o.index}] {o.desc}: {o.kind}: {o.reason} (aot_eager: {o.control})" for o in outcomes
                if o.kind not in (PASS, modules.SHARED)]
    assert not problems, "\n".join(problems)
    assert any(o.kind == PASS for o in outcomes), "no sample of a claimed module passed"


#: The subset run again with fill_uninitialized_memory (the transformer layers' samples, the slowest,
#: in the whole sweep below).
FILLED_SUBSET = {name: count for name, count in SUBSET.items() if "Transformer" not in name}
FILL = {"fill_uninitialized_memory": True}


@pytest.mark.device
@pytest.mark.parametrize("name", sorted(FILLED_SUBSET))
def test_module_db_samples_train_like_eager_with_memory_filled_before_its_first_write(name: str) -> None:
    """A kernel reading memory nothing wrote in its call would read NaN here and fail against eager."""
    (info,) = modules.module_infos([name])
    outcomes = [modules.run_sample(info, index, sample, FILL) for index, sample in modules.samples(info, SUBSET[name])]
    problems = [f"[{o.index}] {o.desc}: {o.kind}: {o.reason} (aot_eager: {o.control})" for o in outcomes
                if o.kind not in (PASS, modules.SHARED)]
    assert not problems, "\n".join(problems)
    assert any(o.kind == PASS for o in outcomes), "no sample of a claimed module passed"


@pytest.mark.device
@pytest.mark.slow
def test_the_whole_module_db_fails_no_sample_with_memory_filled_that_passes_without() -> None:
    """Every sample of module_db with fill_uninitialized_memory: each passes, or fails as it does
    without fills (a sample that passes only without them reads memory nothing wrote)."""
    new_failures = []
    for info in modules.module_infos():
        for index, sample in modules.samples(info):
            filled = modules.run_sample(info, index, sample, FILL, control=False)
            if filled.kind != PASS and modules.run_sample(info, index, sample, control=False).kind == PASS:
                new_failures.append(f"{info.name}[{index}] {filled.desc}: {filled.kind}: {filled.reason}")
    assert not new_failures, "\n".join(new_failures)


@pytest.mark.device
def test_a_module_with_as_many_tokens_as_heads_trains_like_eager() -> None:
    """nn.TransformerEncoderLayer(8, 8) on 8-token sequences: ten AdamW steps follow eager under
    the float32 rule (losses and parameters at most twice as far from a float64 run as eager's;
    Adam turns the key bias's gradient, zero but for rounding, into full-size steps either way)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 8, dim_feedforward=16, dropout=0.0)
    reference = copy.deepcopy(layer)
    exact = copy.deepcopy(layer).double()
    compiled = torch.compile(layer, backend="adreno", fullgraph=True)
    runs = [(compiled, layer, torch.float32), (reference, reference, torch.float32), (exact, exact, torch.float64)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for _, m, _ in runs]
    x, target = torch.randn(8, 2, 8), torch.randn(8, 2, 8)
    before = [p.detach().clone() for p in layer.parameters()]
    for _ in range(10):
        losses = []
        for (model, _, dtype), optimizer in zip(runs, optimizers, strict=True):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(dtype)), target.to(dtype))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        ours, eager, float64 = losses
        assert abs(ours - float64) <= 2 * abs(eager - float64) + 1e-6, losses
    for p, q, r, b in zip(layer.parameters(), reference.parameters(), exact.parameters(), before, strict=True):
        ours_off, eager_off = float((p.double() - r).abs().max()), float((q.double() - r).abs().max())
        assert ours_off <= 2 * eager_off + 1e-6, (ours_off, eager_off)
        assert not torch.equal(p, b), "a parameter did not change"


def test_the_harness_reports_a_wrong_result_as_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is not hollow: a module whose compiled output is off is counted wrong."""
    (info,) = modules.module_infos(["nn.ReLU"])
    index, sample = next(modules.samples(info, 1))
    real_run = modules._run

    def off_by_one(module, call, forward):
        run = real_run(module, call, forward)
        if call is not module:  # the compiled run
            run.outputs = [o + 1 if isinstance(o, torch.Tensor) else o for o in run.outputs]
        return run

    monkeypatch.setattr(modules, "_run", off_by_one)
    outcome = modules.run_sample(info, index, sample, control=False)
    assert outcome.kind == WRONG_RESULT, outcome
    assert outcome.counted_as == "wrong"


def test_an_unknown_module_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"no float32 module_db entry named nn\.Nope.*nn\.Linear"):
        modules.module_infos(["nn.Nope"])
