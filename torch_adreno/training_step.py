"""A whole training step compiled for the device, with training state kept there between steps.

    step = torch_adreno.TrainingStep(model, loss_fn, optimizer)    # loss_fn(model, *batch) -> loss
    for x, y in loader:
        loss = step(x, y)          # forward, backward, optimizer step; gradients cleared after it
    step.synchronize()             # host copies of parameters and optimizer state current again

What it adds over compiling the loss and ``optimizer.step`` separately, on a device with memory of
its own (on unified-memory devices -- phones, PoCL -- nothing is copied either way): per step,
only the batch goes up and the loss comes down. Gradients never leave the device (the optimizer
graph reads them there; the step sets ``.grad`` to None after it), and the new parameters and
optimizer state are not written back to the host after every step.

Host copies of parameters and optimizer state are brought up to date -- the sync points:
``step.synchronize()``; ``model.state_dict()`` and ``optimizer.state_dict()`` (hooks installed
here, so checkpoints are right); and ``step.close()`` (or leaving ``with step:``). Between sync
points those host copies are out of date and carry a NaN in their first element, so using them
by mistake (an eager forward, a norm for logging) shows instead of silently computing with old
values. Changing them on the host between sync points is an error at the next step or sync point,
and the change (made to an out-of-date copy) is discarded for the device's values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from torch_adreno.config import Config
from torch_adreno.runtime import get_residency, get_runtime


class TrainingStep:
    """``step(*batch)`` runs ``loss_fn(model, *batch)``, its backward and ``optimizer.step()`` on the
    device, clears the gradients and returns the loss (detached). See the module docstring for
    when host copies of the training state are current."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer, options: Mapping[str, Any] | None = None) -> None:
        config = Config.from_options(options)
        self.model = model
        self.optimizer = optimizer
        self._loss = torch.compile(lambda *batch: loss_fn(model, *batch), backend="adreno",
                                   options=dict(options or {}), dynamic=False)
        self._step = torch.compile(optimizer.step, backend="adreno", options=dict(options or {}))
        self._residency = get_residency(get_runtime(config.device), config.zero_copy)
        self._hooks = [
            model.register_state_dict_pre_hook(self._synchronize_hook),
            optimizer.register_state_dict_pre_hook(self._synchronize_hook),
        ]
        self._closed = False

    def __call__(self, *batch: Any) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("this TrainingStep was closed; make a new one to train further")
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if any(p.grad is not None for p in params):
            raise ValueError(
                "TrainingStep computes and clears the gradients itself, but some parameters already have a "
                ".grad: call optimizer.zero_grad(set_to_none=True) before the first step, and do not call "
                "backward() on the model outside the step"
            )
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in batch):
            raise ValueError("TrainingStep takes batches that do not require gradients (only parameters get them)")
        self._residency.deferring = True
        try:
            loss = self._loss(*batch)
            loss.backward()
            self._step()
        finally:
            self._residency.deferring = False
            # The gradients' host copies were never filled in: nobody may read them.
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def _synchronize_hook(self, *args: Any, **kwargs: Any) -> None:
        self.synchronize()

    def synchronize(self) -> int:
        """Bring the host copies of parameters and optimizer state up to date; returns the bytes copied."""
        return self._residency.synchronize()

    def close(self) -> None:
        """Synchronize and remove the state_dict hooks; the step cannot be called afterwards."""
        if not self._closed:
            self.synchronize()
            for hook in self._hooks:
                hook.remove()
            self._closed = True

    def __enter__(self) -> TrainingStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
