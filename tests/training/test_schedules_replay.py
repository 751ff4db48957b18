"""Every learning-rate schedule and every hyperparameter change keeps a TrainingStep replaying.

* Each scheduler of ``torch.optim.lr_scheduler`` with its defaults (OneCycleLR and CyclicLR cycle
  momentum / Adam's beta1 every step), and transformers' warmup schedules, trains 30 steps with
  AdamW and with SGD+momentum: one capture, 28 replays, losses and parameters within 1e-5 of eager.
* A loop changing momentum, dampening, weight decay, eps, betas, alpha or lr_decay of torch's
  optimizers every step replays too, and the groups hold the user's floats between calls.
* A setting that is compiled in (nesterov) captures again once, with one warning naming it;
  settings that keep changing end in the step's own recompile-limit error naming them, never
  Dynamo's.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import cross_entropy_loss, small_classifier, small_classifier_batch
from torch import nn
from torch.optim import lr_scheduler

import torch_adreno

pytestmark = pytest.mark.device

STEPS = 30


_model, _batch, _loss = small_classifier, small_classifier_batch, cross_entropy_loss


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "AdamW": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "SGD+momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
}


def _transformers(name: str) -> Callable[[torch.optim.Optimizer], Any]:
    def make(opt: torch.optim.Optimizer) -> Any:
        transformers = pytest.importorskip("transformers")
        return getattr(transformers, name)(opt, num_warmup_steps=5, num_training_steps=STEPS)
    return make


#: Each scheduler with its defaults (arguments it requires are given; sizes fit 30 steps).
SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "OneCycleLR": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS),
    "CyclicLR": lambda opt: lr_scheduler.CyclicLR(opt, base_lr=1e-3, max_lr=0.05, step_size_up=8),
    "CosineAnnealingWarmRestarts": lambda opt: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=10),
    "CosineAnnealingLR": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS),
    "ReduceLROnPlateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt),
    "LambdaLR": lambda opt: lr_scheduler.LambdaLR(opt, lambda step: 0.95 ** step),
    "MultiplicativeLR": lambda opt: lr_scheduler.MultiplicativeLR(opt, lambda step: 0.97),
    "StepLR": lambda opt: lr_scheduler.StepLR(opt, step_size=5),
    "MultiStepLR": lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[10, 20]),
    "ExponentialLR": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.9),
    "LinearLR": lambda opt: lr_scheduler.LinearLR(opt),
    "ConstantLR": lambda opt: lr_scheduler.ConstantLR(opt),
    "PolynomialLR": lambda opt: lr_scheduler.PolynomialLR(opt, total_iters=20),
    "SequentialLR": lambda opt: lr_scheduler.SequentialLR(
        opt, [lr_scheduler.LinearLR(opt, total_iters=5), lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[5]),
    "ChainedScheduler": lambda opt: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(opt, total_iters=4), lr_scheduler.ExponentialLR(opt, gamma=0.9)]),
    "get_cosine_schedule_with_warmup": _transformers("get_cosine_schedule_with_warmup"),
    "get_linear_schedule_with_warmup": _transformers("get_linear_schedule_with_warmup"),
}


def _advance(scheduler: Any) -> None:
    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)  # a metric that never improves: the rate is reduced after each patience
    else:
        scheduler.step()


def _settings(opt: torch.optim.Optimizer) -> tuple[Any, ...]:
    group = opt.param_groups[0]
    return group["lr"], group.get("momentum"), group.get("betas")


def _eager(optimizer: str, scheduler: str) -> tuple[list[float], nn.Module, list[tuple[Any, ...]]]:
    model = _model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    sched = SCHEDULERS[scheduler](opt)
    x, y = _batch()
    losses, settings = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        _advance(sched)
        losses.append(loss.item())
        settings.append(_settings(opt))
    return losses, model, settings


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_every_scheduler_replays_after_one_capture_and_follows_eager(
        scheduler: str, optimizer: str, caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    sched = SCHEDULERS[scheduler](opt)
    x, y = _batch()
    losses, settings = [], []
    with caplog.at_level(logging.WARNING, logger="torch_adreno"), \
            torch_adreno.TrainingStep(model, _loss, opt) as step:
        for _ in range(STEPS):
            losses.append(float(step(x, y)))
            _advance(sched)
            settings.append(_settings(opt))
        assert step.captures == 1, (step.captures, step.unreplayable_reasons)
        assert step.replayed_steps >= STEPS - 2, (step.replayed_steps, step.unreplayable_reasons)
    assert not [r for r in caplog.records if "compiled into the step" in r.getMessage()]
    expected, reference, expected_settings = _eager(optimizer, scheduler)
    # The schedule ran as in eager: the groups held its floats (not tensors) between calls.
    assert settings == expected_settings
    assert len({s[0] for s in settings}) > 1, "the schedule never changed the learning rate"
    assert all(isinstance(s[0], float) for s in settings)
    loss_error = max(abs(a - b) for a, b in zip(losses, expected, strict=True))
    param_error = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    assert loss_error <= 1e-5 and param_error <= 1e-5, (loss_error, param_error)
    assert losses[-1] < losses[0]


def test_cycled_momentum_reaches_the_update() -> None:
    """OneCycleLR's beta1 and CyclicLR's momentum are read by the replayed update: frozen at
    their first value, the parameters would differ from eager's by far more than 1e-5."""
    for make_opt, make_sched, key in (
            (OPTIMIZERS["AdamW"], SCHEDULERS["OneCycleLR"], "betas"),
            (OPTIMIZERS["SGD+momentum"], SCHEDULERS["CyclicLR"], "momentum")):
        model = _model()
        opt = make_opt(model.parameters())
        sched = make_sched(opt)
        x, y = _batch()
        seen = []
        with torch_adreno.TrainingStep(model, _loss, opt) as step:
            for _ in range(12):
                step(x, y)
                sched.step()
                seen.append(opt.param_groups[0][key])
            assert step.replayed_steps == 10
        assert all(a != b for a, b in itertools.pairwise(seen)), f"{key} did not change every step: {seen}"
        frozen = _model()
        frozen_opt = make_opt(frozen.parameters())
        for _ in range(12):
            frozen_opt.zero_grad()
            _loss(frozen, x, y).backward()
            frozen_opt.step()
        reference = _model()
        ref_opt = make_opt(reference.parameters())
        ref_sched = make_sched(ref_opt)
        for _ in range(12):
            ref_opt.zero_grad()
            _loss(reference, x, y).backward()
            ref_opt.step()
            ref_sched.step()
        ours = torch.cat([p.detach().flatten() for p in model.parameters()])
        eager = torch.cat([p.detach().flatten() for p in reference.parameters()])
        unscheduled = torch.cat([p.detach().flatten() for p in frozen.parameters()])
        assert float((ours - eager).abs().max()) <= 1e-5
        assert float((unscheduled - eager).abs().max()) > 1e-3


#: Per optimizer, a loop's change of every float hyperparameter at step ``i`` (none is zero).
HYPERPARAMETER_LOOPS: dict[str, tuple[Callable[[Any], torch.optim.Optimizer], Callable[[dict[str, Any], int], None]]] = {
    "SGD": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
            lambda g, i: g.update(momentum=0.9 - 0.02 * i, dampening=0.1 + 0.01 * i, weight_decay=1e-3 * (1 + i))),
    "Adam": (lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-2),
             lambda g, i: g.update(betas=(0.9 - 0.01 * i, 0.999 - 1e-4 * i), eps=1e-8 * (1 + i),
                                   weight_decay=1e-2 * (1 + i))),
    "AdamW": (lambda p: torch.optim.AdamW(p, lr=1e-2),
              lambda g, i: g.update(weight_decay=0.01 * (1 + i), eps=1e-6 / (1 + i))),
    "RMSprop": (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, weight_decay=1e-3),
                lambda g, i: g.update(alpha=0.99 - 0.01 * i, momentum=0.5 + 0.02 * i, eps=1e-8 * (1 + i))),
    "Adagrad": (lambda p: torch.optim.Adagrad(p, lr=5e-2, lr_decay=1e-2),
                lambda g, i: g.update(lr_decay=1e-2 * (1 + i), weight_decay=1e-3 * i + 1e-4, eps=1e-10 * (1 + i))),
}


@pytest.mark.parametrize("optimizer", sorted(HYPERPARAMETER_LOOPS))
def test_a_loop_changing_every_hyperparameter_each_step_keeps_replaying(optimizer: str) -> None:
    make, change = HYPERPARAMETER_LOOPS[optimizer]
    steps = 10
    model, reference = _model(), _model()
    opt, ref_opt = make(model.parameters()), make(reference.parameters())
    x, y = _batch()
    given = None
    with torch_adreno.TrainingStep(model, _loss, opt) as step:
        for i in range(steps):
            change(opt.param_groups[0], i)
            change(ref_opt.param_groups[0], i)
            ours = float(step(x, y))
            ref_opt.zero_grad()
            loss = _loss(reference, x, y)
            loss.backward()
            ref_opt.step()
            assert abs(ours - loss.item()) <= 1e-5, (i, ours, loss.item())
            given = {k: v for k, v in ref_opt.param_groups[0].items() if k != "params"}
            assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == given  # floats, as set
        assert step.replayed_steps == steps - 2 and step.captures == 1, (step.replayed_steps, step.captures)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert float((p - q).detach().abs().max()) <= 1e-5


def test_a_compiled_in_setting_captures_again_once_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """``nesterov`` is compiled in: switching it compiles and captures once more, and says so in
    one line naming it; the step keeps following eager."""
    model, reference = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    x, y = _batch()
    with caplog.at_level(logging.WARNING, logger="torch_adreno"), \
            torch_adreno.TrainingStep(model, _loss, opt) as step:
        for i in range(12):
            nesterov = i >= 6
            opt.param_groups[0]["nesterov"] = ref_opt.param_groups[0]["nesterov"] = nesterov
            step(x, y)
            ref_opt.zero_grad()
            _loss(reference, x, y).backward()
            ref_opt.step()
        assert step.captures == 2 and step.replayed_steps == 12 - 3, (step.captures, step.replayed_steps)
    warnings = [r.getMessage() for r in caplog.records if "compiled into the step" in r.getMessage()]
    assert len(warnings) == 1 and "'nesterov' of parameter group 0: False -> True" in warnings[0], warnings
    assert "\n" not in warnings[0]
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert float((p - q).detach().abs().max()) <= 1e-5


class _ScaledSGD(torch.optim.Optimizer):
    """An optimizer of the user's own: its step reads ``scale`` as a Python number."""

    def __init__(self, params: Any, lr: float, scale: float) -> None:
        super().__init__(params, {"lr": lr, "scale": scale})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad * group["scale"], alpha=-0.05)


def test_recompile_limits_end_in_the_steps_own_error_naming_the_setting() -> None:
    """A number an optimizer of another class reads is compiled in; changed every step it reaches
    Dynamo's limit, which the step reports in its own words (not Dynamo's error)."""
    model = _model()
    opt = _ScaledSGD(model.parameters(), lr=0.05, scale=1.0)
    x, y = _batch()
    with torch._dynamo.config.patch(recompile_limit=3), torch_adreno.TrainingStep(model, _loss, opt) as step, \
            pytest.raises(RuntimeError) as info:
        for i in range(10):
            opt.param_groups[0]["scale"] = 1.0 + 0.1 * i
            step(x, y)
    message = str(info.value)
    assert message.startswith("TrainingStep: Dynamo reached its recompile limit for the optimizer step")
    assert "'scale' of parameter group 0" in message
    assert info.value.__cause__ is None and "recompile_limit" not in message


def test_each_step_counts_its_own_recompiles() -> None:
    """The compiled update has a code object per TrainingStep: steps made one after another in
    one process do not share Dynamo's recompile limit."""
    x, y = _batch()
    with torch._dynamo.config.patch(recompile_limit=2):
        for _ in range(4):  # each compiles its update twice (before and after its state exists)
            model = _model()
            with torch_adreno.TrainingStep(model, _loss, torch.optim.Adam(model.parameters(), lr=1e-2)) as step:
                for _ in range(3):
                    step(x, y)
                assert step.replayed_steps == 1
