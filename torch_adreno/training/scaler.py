"""``torch.amp.GradScaler`` inside a :class:`~torch_adreno.TrainingStep`: loss scaling for float16
autocast with the gradients kept on the device.

What ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` does, the step does:
the loss is multiplied by the scaler's scale inside the compiled loss graph; after the backward
one compiled graph divides every gradient by the scale, in place, and tells whether any of them
is inf or NaN (one boolean read by the host, as ``GradScaler.step`` reads its flag); the optimizer
step is skipped when one is; and the scale is updated with the scaler's own growth and backoff
rule (``torch._amp_update_scale_``), so ``scaler.get_scale()`` and ``scaler.state_dict()`` stay
right. The user calls none of the scaler's methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def _unscale(grads: list[torch.Tensor], inverse_scale: torch.Tensor) -> torch.Tensor:
    found = torch.zeros((), dtype=torch.bool)
    for g in grads:
        # g * 0 is NaN exactly where g is inf or NaN
        found = found | torch.isnan(g * 0.0).any()
        g.mul_(inverse_scale.to(g.dtype))
    return found


def _scaled(loss_fn: Callable[..., torch.Tensor], model: torch.nn.Module) -> Callable[..., Any]:
    def scaled_loss(scale: torch.Tensor, *batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        loss = loss_fn(model, *batch)
        return loss, loss * scale.to(loss.dtype)

    return scaled_loss


class DeviceGradScaling:
    """The device side of a ``GradScaler`` given to a TrainingStep (see the module docstring)."""

    def __init__(self, scaler: torch.amp.GradScaler, loss_fn: Callable[..., torch.Tensor], model: torch.nn.Module,
                 options: Mapping[str, Any]) -> None:
        if getattr(scaler, "_device", "cpu") != "cpu":
            raise ValueError(f"TrainingStep(grad_scaler=...) takes a GradScaler for the host's tensors: "
                             f"torch.amp.GradScaler('cpu'), not one for {scaler._device!r}")
        self.scaler = scaler
        if scaler._scale is None:
            scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
        self.loss = torch.compile(_scaled(loss_fn, model), backend="adreno", options=dict(options),
                                  dynamic=False, fullgraph=True)
        self._unscale = torch.compile(_unscale, backend="adreno", options=dict(options), dynamic=False)
        #: Steps skipped because a gradient overflowed.
        self.skipped_steps = 0

    def forward(self, batch: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the scaled loss to call ``backward()`` on."""
        assert self.scaler._scale is not None
        return self.loss(self.scaler._scale, *batch)

    def unscale(self, grads: list[torch.Tensor]) -> bool:
        """Divide the gradients by the scale on the device; whether any is inf or NaN."""
        assert self.scaler._scale is not None
        inverse = self.scaler._scale.double().reciprocal().float()
        found = bool(self._unscale(grads, inverse)) if grads else False
        self.skipped_steps += found
        return found

    def update(self, found_inf: bool) -> None:
        """``scaler.update()``: back off after an overflow, grow after ``growth_interval`` clean steps."""
        s = self.scaler
        assert s._scale is not None and s._growth_tracker is not None
        torch._amp_update_scale_(s._scale, s._growth_tracker, torch.full((), float(found_inf)),
                                 s._growth_factor, s._backoff_factor, s._growth_interval)
