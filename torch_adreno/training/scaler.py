"""``torch.amp.GradScaler`` inside a :class:`~torch_adreno.TrainingStep`: loss scaling for float16
autocast, decided on the device.

What ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` does, the step does,
with no value read by the host, so that the step is captured and replayed like any other:

- the loss is multiplied by the scaler's scale inside the compiled loss graph;
- after the backward one compiled graph (:func:`_unscale_and_update`) multiplies every gradient
  by the inverse scale, in place, writes ``found_inf`` (a 0-dim bool of the step's state, on the
  device: whether any gradient had an inf or NaN, as ``_amp_foreach_non_finite_check_and_unscale_``;
  state rather than an output, so that the optimizer graph reads it where the unscale wrote it,
  in a replay too), and updates the scale and
  growth tracker with the scaler's own rule (``torch._amp_update_scale_``: back off after an
  overflow, grow after ``growth_interval`` clean steps unless the grown scale is inf), counting
  skipped steps;
- the optimizer update takes ``found_inf`` and keeps every old value where it is true (see
  :mod:`.updates`): the skipped-step pattern is eager's.

The scale and growth tracker are the scaler's own tensors, updated on the device like optimizer
state: ``scaler.get_scale()`` and ``scaler.state_dict()`` read them through ``.item()``, which
brings them up to date from the device first (:mod:`.host_sync`; ``step.synchronize()`` too).
The user calls none of the scaler's methods.

An optimizer whose update the step does not trace itself (:func:`.updates.rule_for` is None)
cannot select on the device: there the host reads ``found_inf`` and skips the optimizer step
(:meth:`DeviceGradScaling.found_on_host`), and the step is not replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def _unscale_and_update(grads: list[torch.Tensor], scale: torch.Tensor, growth_tracker: torch.Tensor,
                        found_inf: torch.Tensor, skipped: torch.Tensor, growth_factor: float, backoff_factor: float,
                        growth_interval: int) -> None:
    found = torch.zeros((), dtype=torch.bool)
    inverse = torch.reciprocal(scale)  # (eager takes it in float64, then float32: a power of two either way)
    for g in grads:
        # g * 0 is NaN exactly where g is inf or NaN
        found = found | torch.isnan(g * 0.0).any()
        g.mul_(inverse)
    successful = growth_tracker + 1
    grows = (successful == growth_interval) & ~found
    grown = scale * growth_factor
    grown_finite = ~torch.isnan(grown * 0.0)  # (the scale is finite: the grown one is inf or finite)
    new_scale = torch.where(found, scale * backoff_factor, torch.where(grows & grown_finite, grown, scale))
    new_tracker = torch.where(found | grows, torch.zeros_like(successful), successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    found_inf.copy_(found)
    skipped.add_(found.to(skipped.dtype))


def _scaled(loss_fn: Callable[..., torch.Tensor], model: torch.nn.Module) -> Callable[..., Any]:
    def scaled_loss(scale: torch.Tensor, *batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        loss = loss_fn(model, *batch)
        # As GradScaler.scale: a 16-bit loss times the float32 scale stays 16-bit (and the scale is
        # never cast: a cast of a static input would be made once, as a frozen weight's).
        return loss, loss * scale

    return scaled_loss


class DeviceGradScaling:
    """The device side of a ``GradScaler`` given to a TrainingStep (see the module docstring).
    ``synchronize``: brings host copies of the step's state up to date (for :attr:`skipped_steps`)."""

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
        self._unscale = torch.compile(_unscale_and_update, backend="adreno", options=dict(options), dynamic=False)
        #: Steps skipped because a gradient overflowed, counted on the device.
        self.skipped = torch.zeros((), dtype=torch.int32)
        #: Whether the last step's gradients had an inf or NaN (its update was skipped), on the device.
        self.found_inf = torch.zeros((), dtype=torch.bool)
        for tensor in (scaler._scale, scaler._growth_tracker, self.skipped, self.found_inf):
            # Step state like a parameter: resident on the device (never evicted as a one-off input).
            torch._dynamo.mark_static_address(tensor, guard=False)

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because a gradient overflowed (its read makes the host copy current)."""
        return int(self.skipped.item())

    def tensors(self) -> dict[int, str]:
        """Names of the scaler's tensors the step updates, by ``id`` (for messages)."""
        assert self.scaler._scale is not None and self.scaler._growth_tracker is not None
        return {id(self.scaler._scale): "the GradScaler's scale",
                id(self.scaler._growth_tracker): "the GradScaler's growth tracker",
                id(self.skipped): "the count of skipped GradScaler steps",
                id(self.found_inf): "the GradScaler's found_inf"}

    def forward(self, batch: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the scaled loss to call ``backward()`` on."""
        assert self.scaler._scale is not None
        return self.loss(self.scaler._scale, *batch)

    def unscale(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Multiply the gradients by the inverse scale on the device and update the scale there;
        returns :attr:`found_inf`, written on the device."""
        s = self.scaler
        assert s._scale is not None and s._growth_tracker is not None
        self._unscale(grads, s._scale, s._growth_tracker, self.found_inf, self.skipped, s._growth_factor,
                      s._backoff_factor, s._growth_interval)
        return self.found_inf

    @staticmethod
    def found_on_host(found_inf: torch.Tensor) -> bool:
        """``found_inf`` read by the host (an optimizer whose update cannot select on the device)."""
        return bool(found_inf.item())
