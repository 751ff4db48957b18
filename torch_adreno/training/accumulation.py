"""Gradient accumulation on the device: ``TrainingStep(..., accumulate=N)``.

Each call takes one micro-batch; its loss, scaled by ``1/N`` inside the compiled loss (so the
backward graph starts from the scale, with no host op between graphs), is backpropagated, and the
gradients are summed on the device into sums the step owns. Every ``N``-th call the optimizer
steps on the sums (clipped first where ``max_grad_norm`` is set). The sums are persistent tensors
of the step, so that each kind of call is one fixed list of launches:

- ``first`` (call 1 of N): forward, backward, sums = gradients;
- ``middle`` (calls 2 .. N-1): forward, backward, sums += gradients;
- ``last`` (call N): forward, backward, sums += gradients, optimizer step on the sums.

A replay is captured per kind and batch geometry (:meth:`GradientAccumulation.phase` is part of
the replay's key). With equal micro-batches the update is that of one batch N times as large
under a mean loss; each call returns its own micro-batch's (unscaled) loss.

Invariants: the sums exist only while accumulating (``accumulate > 1``); a call that raises does
not advance the count; after a ``last`` call every parameter's ``.grad`` is a device marker as
after any step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Phases of a call (see the module docstring); WHOLE: no accumulation.
WHOLE, FIRST, MIDDLE, LAST = "whole", "first", "middle", "last"


def _copy_into(sums: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for total, grad in zip(sums, grads, strict=True):
        total.copy_(grad)


def _add_into(sums: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for total, grad in zip(sums, grads, strict=True):
        total.add_(grad)


class GradientAccumulation:
    """The sums and the count of one TrainingStep's accumulation over ``count`` calls."""

    def __init__(self, count: int, params: Sequence[torch.nn.Parameter], options: dict[str, Any]) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"accumulate must be a positive integer (calls per optimizer step), got {count!r}")
        self.count = count
        self._calls = 0
        self._trained = [p for p in params if p.requires_grad]
        self._sums = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self._trained] \
            if count > 1 else []
        compile_options = dict(options)
        self._start: Callable[..., None] = torch.compile(_copy_into, backend="adreno", options=compile_options,
                                                         dynamic=False, fullgraph=True)
        self._add: Callable[..., None] = torch.compile(_add_into, backend="adreno", options=compile_options,
                                                       dynamic=False, fullgraph=True)

    @property
    def phase(self) -> str:
        if self.count == 1:
            return WHOLE
        if self._calls == 0:
            return FIRST
        return LAST if self._calls == self.count - 1 else MIDDLE

    @property
    def steps_optimizer(self) -> bool:
        """Whether the present call ends with the optimizer step."""
        return self.phase in (WHOLE, LAST)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss the backward starts from (traced into the compiled loss)."""
        return loss if self.count == 1 else loss / self.count

    def gather(self) -> None:
        """After the backward: the gradients go into the sums, and at the last call the sums
        become the gradients the optimizer reads."""
        if self.count == 1:
            return
        grads = [p.grad for p in self._trained]
        if any(g is None for g in grads):
            missing = sum(g is None for g in grads)
            raise RuntimeError(f"TrainingStep(accumulate={self.count}): {missing} parameter(s) that require grad got "
                               "no gradient from this micro-batch's loss; accumulation needs every trained "
                               "parameter in every loss (freeze the others with requires_grad_(False))")
        (self._start if self.phase == FIRST else self._add)(self._sums, grads)
        if self.phase == LAST:
            for param, total in zip(self._trained, self._sums, strict=True):
                param.grad = total
        else:
            for param in self._trained:
                param.grad = None

    def advance(self) -> None:
        """The call finished: count it."""
        self._calls = (self._calls + 1) % self.count

    @property
    def sums(self) -> list[torch.Tensor]:
        return list(self._sums)
