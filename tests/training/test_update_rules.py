"""The update rules a TrainingStep traces for torch.optim's optimizers follow eager PyTorch.

Each optimizer of ``update_rules.RULES``, with its defaults and with the options that change its
update (weight decay, momentum, dampening, nesterov, amsgrad, centered, decoupled weight decay,
lr decay), trains 8 steps: 6 replayed, the losses, parameters and every state tensor within
1e-5 of eager, and the state has PyTorch's keys. An optimizer whose ``step`` is not the class's
own runs its own ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno
from torch_adreno.training.update_rules import RULES
from torch_adreno.training.updates import rule_for

pytestmark = pytest.mark.device

optim = torch.optim
CASES: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda p: optim.SGD(p, lr=0.05),
    "SGD-momentum-dampening-decay": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "SGD-nesterov-maximize": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, maximize=True),
    "Adam": lambda p: optim.Adam(p, lr=1e-2),
    "Adam-decay-amsgrad": lambda p: optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "AdamW": lambda p: optim.AdamW(p, lr=1e-2),
    "AdamW-amsgrad-fused": lambda p: optim.AdamW(p, lr=1e-2, amsgrad=True, fused=True),
    "RMSprop": lambda p: optim.RMSprop(p, lr=1e-2),
    "RMSprop-momentum-centered-decay": lambda p: optim.RMSprop(p, lr=1e-3, momentum=0.5, centered=True,
                                                           weight_decay=0.01),
    "Adagrad-lr_decay-decay": lambda p: optim.Adagrad(p, lr=5e-2, lr_decay=0.01, weight_decay=0.01),
    "Adamax-decay": lambda p: optim.Adamax(p, lr=1e-2, weight_decay=0.01),
    "Adadelta-decay": lambda p: optim.Adadelta(p, lr=1.0, weight_decay=0.01),
    "NAdam": lambda p: optim.NAdam(p, lr=1e-2),
    "NAdam-decoupled-decay": lambda p: optim.NAdam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "RAdam": lambda p: optim.RAdam(p, lr=1e-2),
    "RAdam-decay": lambda p: optim.RAdam(p, lr=1e-2, weight_decay=0.1),
}
#: Cases that maximize: their loss function returns the negated loss.
MAXIMIZING = {"SGD-nesterov-maximize"}
STEPS = 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _negated_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -F.cross_entropy(model(x), y)


def test_every_rule_is_tested() -> None:
    assert {type(CASES[name](_model().parameters())) for name in CASES} == set(RULES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_traced_update_rules_follow_eager(case: str) -> None:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator)
    model, reference = _model(), _model()
    opt, ref_opt = CASES[case](model.parameters()), CASES[case](reference.parameters())
    assert rule_for(opt) is not None
    loss_fn = _negated_loss if case in MAXIMIZING else _loss
    with torch_adreno.TrainingStep(model, loss_fn, opt) as step:
        losses = [float(step(x, y)) for _ in range(STEPS)]
        assert step.replayed_steps == STEPS - 2
    expected = []
    for _ in range(STEPS):
        ref_opt.zero_grad()
        loss = loss_fn(reference, x, y)
        loss.backward()
        ref_opt.step()
        expected.append(loss.item())
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-5, (losses, expected)
    assert abs(losses[-1]) < abs(losses[0])
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert float((p - q).detach().abs().max()) <= 1e-5
        ours, theirs = opt.state[p], ref_opt.state[q]
        assert sorted(ours) == sorted(theirs)
        for key, value in theirs.items():
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
            # (relative for RMSprop's centered momentum buffer, a quotient of two small numbers)
            assert float((ours[key] - value).abs().max()) <= 1e-5 * max(1.0, float(value.abs().max())), key


class _OwnStepAdam(torch.optim.Adam):
    """A subclass overriding ``step``: its own step runs, not the traced rule."""

    def step(self, closure: Any = None) -> Any:
        return super().step(closure)


def test_an_optimizer_overriding_step_runs_its_own_step() -> None:
    model = _model()
    assert rule_for(_OwnStepAdam(model.parameters(), lr=1e-2)) is None
    assert rule_for(optim.Adam(model.parameters(), lr=1e-2, differentiable=True)) is None
    assert rule_for(optim.LBFGS(model.parameters())) is None
