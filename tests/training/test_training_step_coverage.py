"""TrainingStep in the configurations training loops use besides one plain optimizer: learning-rate
schedulers (tensor and float learning rates), several parameter groups with their own settings,
and frozen parameters; each step against eager PyTorch, state compared after synchronizing.

Copy mode (zero_copy=False), where the training state really stays on the device between steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_adreno

pytestmark = pytest.mark.device

COPY = {"zero_copy": False}


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 5))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator))
            for _ in range(n)]


def _train_both(make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer], steps: int,
                make_scheduler: Callable[[torch.optim.Optimizer], object] | None = None,
                prepare: Callable[[torch.nn.Module], None] | None = None
                ) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module, torch.optim.Optimizer]:
    """``steps`` steps of TrainingStep and of eager PyTorch from the same start, losses compared at
    every step and the optimizer step counted among the launched graphs; returns both after a
    synchronize."""
    model = _model()
    if prepare is not None:
        prepare(model)
    reference = copy.deepcopy(model)
    opt, ref_opt = make_optimizer(model), make_optimizer(reference)
    schedulers = [make_scheduler(o) for o in (opt, ref_opt)] if make_scheduler else []
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    for i, (x, y) in enumerate(_batches(steps)):
        with torch_adreno.profile() as prof:
            loss = step(x, y)
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = _loss(reference, x, y)
        ref_loss.backward()
        ref_opt.step()
        for scheduler in schedulers:
            scheduler.step()  # type: ignore[attr-defined]
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"step {i}: {m}")
        assert prof.host_fallback_ops == []
        # The loss's forward and backward and the optimizer step's own graph ran on the device.
        assert len({k.graph for k in prof.kernels}) >= 3, sorted({k.graph for k in prof.kernels})
    step.synchronize()
    return model, opt, reference, ref_opt


def _assert_same_state(model, opt, reference, ref_opt) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"parameter {n}: {m}")
    for group, ref_group in zip(opt.param_groups, ref_opt.param_groups, strict=True):
        assert float(group["lr"]) == pytest.approx(float(ref_group["lr"]), rel=1e-6)
        for p, q in zip(group["params"], ref_group["params"], strict=True):
            for key, value in ref_opt.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, k=key: f"optimizer state {k}: {m}")


@pytest.mark.parametrize("scheduler", ["step", "exponential", "cosine", "onecycle"])
def test_schedulers_with_a_tensor_learning_rate(scheduler):
    """A tensor lr is updated in place by the scheduler: one compiled optimizer step serves every
    value (more changes than Dynamo's recompile limit of 8), each step with the scheduled value."""
    def make_optimizer(m):
        return torch.optim.SGD(m.parameters(), lr=torch.tensor(0.1), momentum=0.9)

    def make_scheduler(o):
        return {
            "step": lambda: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
            "exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8),
            "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12),
            "onecycle": lambda: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12,
                                                                    cycle_momentum=False),
        }[scheduler]()

    model, opt, reference, ref_opt = _train_both(make_optimizer, 12, make_scheduler)
    _assert_same_state(model, opt, reference, ref_opt)
    assert float(opt.param_groups[0]["lr"]) != 0.1, "the schedule changed the learning rate"


def test_onecycle_cycling_a_float_momentum():
    """OneCycleLR also cycles SGD's momentum, a Python float: the step reads it as an input, so its
    12 values are no recompile (Dynamo's limit is 8) and the steps match eager."""
    def make_optimizer(m):
        return torch.optim.SGD(m.parameters(), lr=torch.tensor(0.1), momentum=0.9)

    model, opt, reference, ref_opt = _train_both(
        make_optimizer, 12, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.2, total_steps=12))
    _assert_same_state(model, opt, reference, ref_opt)
    assert isinstance(opt.param_groups[0]["momentum"], float) and opt.param_groups[0]["momentum"] != 0.9


def test_adam_with_a_tensor_learning_rate_and_a_scheduler():
    def make_optimizer(m):
        return torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01))

    model, opt, reference, ref_opt = _train_both(
        make_optimizer, 10, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.7))
    _assert_same_state(model, opt, reference, ref_opt)


def test_a_float_learning_rate_changed_by_a_scheduler_trains_or_says_why_not():
    """A float lr is a constant of the compiled optimizer step: each new value recompiles it. Up to
    Dynamo's recompile limit the steps match eager; past it the step must refuse, naming the float
    learning rate and the tensor-lr fix, never run the update as host code."""
    def make_optimizer(m):
        return torch.optim.SGD(m.parameters(), lr=0.1)

    try:
        model, opt, reference, ref_opt = _train_both(
            make_optimizer, 12, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8))
    except RuntimeError as err:  # measured: at the 9th value of the learning rate
        assert "hyperparameter changed as a Python float" in str(err) and "tensor lr" in str(err), err
    else:
        _assert_same_state(model, opt, reference, ref_opt)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_parameter_groups_with_their_own_settings(optimizer):
    def make_optimizer(m):
        first, second, head = m[0], m[2], m[4]
        if optimizer == "sgd":
            return torch.optim.SGD([
                {"params": first.parameters(), "lr": 0.2},
                {"params": second.parameters(), "lr": 0.05, "weight_decay": 1e-2, "nesterov": True},
                {"params": head.parameters(), "momentum": 0.5},
            ], lr=0.1, momentum=0.9)
        cls = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
        return cls([
            {"params": first.parameters(), "lr": 0.02, "betas": (0.8, 0.99)},
            {"params": second.parameters(), "weight_decay": 0.1},
            {"params": head.parameters(), "amsgrad": True},
        ], lr=0.01)

    model, opt, reference, ref_opt = _train_both(make_optimizer, 6)
    _assert_same_state(model, opt, reference, ref_opt)


@pytest.mark.parametrize("in_optimizer", [False, True], ids=["outside-optimizer", "inside-optimizer"])
def test_frozen_parameters_stay_exactly_as_they_were(in_optimizer):
    """Frozen layers (requires_grad=False), left out of the optimizer or inside it (no gradient, so
    no update): bitwise unchanged, the rest trains like eager."""
    def freeze(m):
        for p in m[0].parameters():
            p.requires_grad_(False)

    frozen_before = [p.detach().clone() for p in _model()[0].parameters()]

    def make_optimizer(m):
        params = m.parameters() if in_optimizer else (p for p in m.parameters() if p.requires_grad)
        return torch.optim.Adam(params, lr=0.01, weight_decay=1e-2)

    model, opt, reference, ref_opt = _train_both(make_optimizer, 6, prepare=freeze)
    for p, before in zip(model[0].parameters(), frozen_before, strict=True):
        assert torch.equal(p, before) and p.grad is None
    _assert_same_state(model, opt, reference, ref_opt)
