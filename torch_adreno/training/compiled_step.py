"""A TrainingStep's step through the compiled graphs: Dynamo, AOTAutograd and autograd drive the
device (the replay records this path once per batch geometry and then runs without them).

:class:`CompiledStep` holds the compiled loss (scaled for gradient accumulation where asked) and
optimizer step, gradient clipping and GradScaler handling, and runs one call: forward and
backward, the accumulation's gathering, then -- where the call steps the optimizer -- unscaling,
clipping and the optimizer update (:mod:`.updates`: the step's own trace of the optimizer's rule,
with its hyperparameters as inputs, or the optimizer's own ``step()``), each on the device. With
a GradScaler the update keeps the old values where the unscale found an inf or NaN, decided on
the device (:mod:`.scaler`). Invariant: when :meth:`run`
returns, every parameter the optimizer stepped is deferred to the device in copy mode (a graph
break that ran part of the optimizer step on the host is an error, not host copies quietly out
of date). A loss with a graph break runs in pieces, keeping nothing on the device between them
(:mod:`.pieces`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from torch_adreno.replay.capture import StepRecorder
from torch_adreno.runtime.residency import Residency, StepContext
from torch_adreno.training.accumulation import GradientAccumulation
from torch_adreno.training.gradients import gradient_clipper
from torch_adreno.training.pieces import CompiledFunction, LossInPieces
from torch_adreno.training.scaler import DeviceGradScaling
from torch_adreno.training.state import data_dependent_loss_error, graph_break_advice, recompile_limit_message
from torch_adreno.training.update_rules import UpdateRule
from torch_adreno.training.updates import DeviceUpdate, own_code, rule_for


def _with_scaled(loss: torch.Tensor, accumulation: GradientAccumulation) -> tuple[torch.Tensor, torch.Tensor]:
    return loss, accumulation.scale(loss)


class CompiledStep:
    """The compiled graphs of one TrainingStep and the order it calls them in (module docstring)."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
                 params: list[torch.nn.Parameter], options: Mapping[str, Any], accumulation: GradientAccumulation,
                 max_grad_norm: float | None, norm_type: float, grad_scaler: torch.amp.GradScaler | None) -> None:
        self._params = params
        self._model = model
        self._optimizer = optimizer
        self._loss_gradients: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
        self.accumulation = accumulation
        # Accumulating, the compiled loss also returns the loss scaled for the backward.
        self._loss = CompiledFunction(
            (lambda *batch: loss_fn(model, *batch)) if accumulation.count == 1 else
            (lambda *batch: _with_scaled(loss_fn(model, *batch), accumulation)), options, "the loss",
            restart_in_pieces=True, advice=lambda: graph_break_advice(model))
        self._clip = None if max_grad_norm is None else gradient_clipper(max_grad_norm, norm_type, options)
        self.scaling = (DeviceGradScaling(grad_scaler, loss_fn, model, options)
                        if grad_scaler is not None and grad_scaler.is_enabled() else None)
        rule = rule_for(optimizer)
        #: The update the step traces (None: the optimizer's own step() runs).
        self.update = DeviceUpdate(optimizer, rule, self.scaling is not None) if rule is not None else None
        update = self.update
        if update is not None:
            update.mark_state_static()  # (state made before the step: Adagrad's, a loaded checkpoint's)

        def optimizer_step(found_inf: torch.Tensor | None) -> None:
            if update is not None:
                update(found_inf)
            else:
                optimizer.step()

        # Static: what is compiled in (a boolean setting, a zero weight decay) is a recompile
        # specialised to its value; hyperparameters are tensors during the call (StepHyperparameters).
        self._step = torch.compile(own_code(optimizer_step), backend="adreno", options=dict(options), dynamic=False)

    @property
    def rule(self) -> UpdateRule | None:
        """The update rule the step traces (None: the optimizer's own step() runs)."""
        return None if self.update is None else self.update.rule

    @property
    def selects_on_device(self) -> bool:
        """Whether a GradScaler's skip is decided on the device (else the host reads found_inf)."""
        return self.update is not None

    @property
    def unreplayable_reason(self) -> str | None:
        """Why no call of this step can be replayed (None: calls can be)."""
        if self.scaling is not None and not self.selects_on_device:
            return (f"a GradScaler step of {type(self._optimizer).__name__}, whose update the step does not trace "
                    "itself, decides the skip of an overflowing step on the host")
        return None

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps a GradScaler skipped (0 without one)."""
        return 0 if self.scaling is None else self.scaling.skipped_steps

    def name_of(self, tensor: torch.Tensor) -> str | None:
        """The name of a tensor of the step's own (the GradScaler's), for messages."""
        return None if self.scaling is None else self.scaling.tensors().get(id(tensor))

    def finish(self) -> None:
        """At close, host copies current: state whose first step never ran is removed, as PyTorch
        never made it (SGD's momentum buffer whose every step a GradScaler skipped)."""
        state = self._optimizer.state
        for param, key in self.update.unstarted_state() if self.update is not None else ():
            del state[param][key]
            if not state[param]:
                del state[param]

    @property
    def pieces_reason(self) -> str | None:
        """Why the step runs in pieces, host code between its graphs (None: each part is one graph);
        such a step is never replayed (:mod:`torch_adreno.training.pieces`)."""
        return self._loss.pieces_reason

    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` from a gradient this step owns: autograd would make a new tensor of
        ones each call, a value made on the host that a recorded step would bind as if it were
        persistent state."""
        key = (tuple(loss.shape), loss.dtype)
        if key not in self._loss_gradients:
            self._loss_gradients[key] = torch.ones_like(loss)
        loss.backward(self._loss_gradients[key])

    def run(self, batch: tuple[Any, ...], residency: Residency, step: StepContext, recorder: StepRecorder | None,
            signatures: list[Hashable], changes: list[str]) -> torch.Tensor:
        """One call through the compiled graphs, as part of ``step`` (recorded when ``recorder`` is
        given); returns the loss. ``signatures``: the batch geometries seen, ``changes``: the
        compiled-in optimizer settings that changed, for the message of a recompile limit. A step
        in pieces keeps nothing on the device between its graphs: the host code between them reads
        their outputs and the parameters."""
        if self.pieces_reason is not None:
            return self._run(batch, residency, dataclasses.replace(step, defers=False), recorder, signatures, changes)
        try:
            return self._run(batch, residency, step, recorder, signatures, changes)
        except LossInPieces:
            # Met before anything of the step ran (Dynamo refused the whole graph while tracing it).
            return self._run(batch, residency, dataclasses.replace(step, defers=False), recorder, signatures, changes)

    def _run(self, batch: tuple[Any, ...], residency: Residency, step: StepContext, recorder: StepRecorder | None,
             signatures: list[Hashable], changes: list[str]) -> torch.Tensor:
        # An eager fallback of the optimizer step would read gradients that never reached the host.
        with residency.in_step(step), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), \
                (recorder if recorder is not None else contextlib.nullcontext()):
            stage = "loss"
            try:
                if self.scaling is not None:
                    loss, scaled = self.scaling.forward(batch)
                    self._backward(scaled)
                elif self.accumulation.count > 1:
                    loss, scaled = self._loss(*batch)
                    self._backward(scaled)
                else:
                    loss = self._loss(*batch)
                    self._backward(loss)
                stage = "optimizer step"
                self.accumulation.gather()
                stepped = self.accumulation.steps_optimizer and self._optimizer_step()
            except torch._dynamo.exc.FailOnRecompileLimitHit:
                raise RuntimeError(recompile_limit_message(stage, signatures, changes)) from None
            except torch._dynamo.exc.TorchDynamoException as err:
                clear = data_dependent_loss_error(err, self._model) if stage == "loss" else None
                if clear is None:
                    raise
                raise clear from err
        # (With zero-copy nothing is deferred: gradients are in host memory, any step reads them.)
        updated = [p for p in self._params if p.grad is not None] if step.defers and not residency.zero_copy \
            and stepped else []
        if updated and not all(residency.is_deferred(p) for p in updated):
            raise RuntimeError(
                "the optimizer step did not run on the device (Dynamo ran some of it as host code), so it "
                "read gradients that exist only on the device; the parameters' host copies are not valid. "
                "Use an optimizer whose step compiles (torch.optim's do, fused or not): a "
                "graph break inside the step is what put it on the host")
        return loss.detach()

    def _optimizer_step(self) -> bool:
        """Unscale (GradScaler), clip, and the optimizer update, on the device; False where the host
        decided to skip the update (a GradScaler with an optimizer running its own step())."""
        found_inf = None
        if self.scaling is not None:
            grads = [p.grad for p in self._params if p.grad is not None]
            found_inf = self.scaling.unscale(grads) if grads else None
        self._clip_gradients()
        if found_inf is not None and not self.selects_on_device:
            if self.scaling is not None and self.scaling.found_on_host(found_inf):
                return False
            found_inf = None
        self._step(found_inf)
        if self.update is not None:
            self.update.mark_state_static()
        self._optimizer._opt_called = True  # type: ignore[attr-defined]  # as optimizer.step() sets it (LRScheduler)
        return True

    def _clip_gradients(self) -> None:
        """``clip_grad_norm_`` over the gradients, on the device (when ``max_grad_norm`` is set)."""
        if self._clip is not None:
            grads = [p.grad for p in self._params if p.grad is not None]
            if grads:
                self._clip(grads)
