"""A GradScaler step is decided on the device and replayed like any other step.

float16 autocast with ``torch.amp.GradScaler("cpu")``: the inf/NaN check, the skip of the
optimizer update and the scale's backoff and growth run inside the replayed step. With a huge
initial scale the first steps overflow, and a 16-fold growth every 3 clean steps makes later ones overflow
too: the pattern of skipped steps, the scale after every step, the growth tracker and the
parameters are eager's, while all but the first two calls replay. The scaler's state reads
current from the device (``get_scale()``, ``state_dict()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno

pytestmark = pytest.mark.device

STEPS = 30
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD+momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    # A dampened buffer's first step differs from the others: skipped first steps must not count.
    "SGD+dampening": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, dampening=0.5),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(8, 20, generator=generator) * 10, torch.randint(0, 4, (8,), generator=generator)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.float16):
        return F.cross_entropy(model(x), y)


def _scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_factor=16.0, growth_interval=3)


def _eager(optimizer: str, steps: int = STEPS) -> tuple[list[float], list[float], nn.Module, Any, Any]:
    model = _model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    scaler = _scaler()
    x, y = _batch()
    losses, scales = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales, model, opt, scaler


def _skipped(scales: list[float], initial: float) -> list[bool]:
    """Which steps were skipped: those after which the scale backed off."""
    return [after < before for before, after in zip([initial, *scales], scales, strict=False)]


@pytest.mark.parametrize(("optimizer", "zero_copy", "read_every_step"), [
    ("SGD+momentum", None, True), ("SGD+dampening", False, True), ("AdamW", None, False), ("AdamW", False, True)],
    ids=["SGD+momentum-zero_copy=auto-read", "SGD+dampening-zero_copy=False-read", "AdamW-zero_copy=auto",
         "AdamW-zero_copy=False-read"])
def test_grad_scaler_steps_replay_and_skip_as_eager(optimizer: str, zero_copy: bool | None,
                                                    read_every_step: bool) -> None:
    expected_losses, expected_scales, reference, ref_opt, ref_scaler = _eager(optimizer)
    model = _model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    scaler = _scaler()
    x, y = _batch()
    options = {} if zero_copy is None else {"zero_copy": zero_copy}
    losses, scales = [], []
    with torch_adreno.TrainingStep(model, _loss, opt, options=options, grad_scaler=scaler) as step:
        for _ in range(STEPS):
            losses.append(float(step(x, y)))
            if read_every_step:
                scales.append(scaler.get_scale())  # current from the device at every read
        assert step.replayed_steps == STEPS - 2 and step.captures == 1, (step.replayed_steps, step.unreplayable_reasons)
        assert scaler.state_dict() == ref_scaler.state_dict()
        skipped = _skipped(expected_scales, 2.0**24)
        assert step.skipped_steps == sum(skipped)
    if read_every_step:
        assert scales == expected_scales
    # Overflows at the start and after growth later on: skips a replay decided.
    assert skipped[0] and any(skipped[5:]) and not all(skipped), skipped
    loss_error = max(abs(a - b) for a, b in zip(losses, expected_losses, strict=True))
    param_error = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), reference.parameters(),
                                                                         strict=True))
    assert loss_error <= 1e-4 and param_error <= 1e-4, (loss_error, param_error)
    assert losses[-1] < losses[0]
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        ours, theirs = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert sorted(ours) == sorted(theirs)


def test_state_whose_first_step_was_always_skipped_is_left_as_eager_leaves_it() -> None:
    """Every step overflowed: PyTorch made no momentum buffer, so after close() there is none."""
    _, _, _, ref_opt, ref_scaler = _eager("SGD+dampening", steps=3)
    model = _model()
    opt = OPTIMIZERS["SGD+dampening"](model.parameters())
    scaler = _scaler()
    x, y = _batch()
    before = [p.detach().clone() for p in model.parameters()]
    with torch_adreno.TrainingStep(model, _loss, opt, grad_scaler=scaler) as step:
        for _ in range(3):
            step(x, y)
        assert step.replayed_steps == 1
    assert len(ref_opt.state) == 0 and len(opt.state) == 0, dict(opt.state)
    assert scaler.state_dict() == ref_scaler.state_dict()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


class _PlainSGD(torch.optim.Optimizer):
    """An optimizer of the user's own (its update is not one the step traces itself)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.01)


def test_another_optimizer_skips_on_the_host_and_says_why_it_is_not_replayed() -> None:
    model, reference = _model(), _model()
    opt, ref_opt = _PlainSGD(model.parameters(), lr=0.01), _PlainSGD(reference.parameters(), lr=0.01)
    scaler, ref_scaler = _scaler(), _scaler()
    x, y = _batch()
    with torch_adreno.TrainingStep(model, _loss, opt, grad_scaler=scaler) as step:
        for _ in range(16):
            step(x, y)
            ref_opt.zero_grad()
            ref_scaler.scale(_loss(reference, x, y)).backward()
            ref_scaler.step(ref_opt)
            ref_scaler.update()
            assert scaler.get_scale() == ref_scaler.get_scale()
        assert step.replayed_steps == 0
        assert any("_PlainSGD" in reason and "on the host" in reason for reason in step.unreplayable_reasons)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert float((p - q).detach().abs().max()) <= 1e-4
