"""The optimizer step a :class:`~torch_adreno.TrainingStep` compiles, with every hyperparameter a
scalar input of the compiled graph.

PyTorch's optimizers take most hyperparameters as Python numbers only: SGD's momentum and
dampening and every weight decay reach ``alpha=``/``value=`` arguments or ``!= 0`` tests, which
Dynamo specialises to the value, so a schedule cycling momentum (``OneCycleLR``, ``CyclicLR``) or
a loop changing weight decay would compile and capture the step again at every step. For the
classes of :data:`~torch_adreno.training.update_rules.RULES` (SGD, Adam, AdamW, RMSprop, Adagrad,
Adamax, Adadelta, NAdam, RAdam) the step compiles :class:`DeviceUpdate` instead of
``optimizer.step()``: the same update (:mod:`.update_rules`), reading each hyperparameter the
group holds as a 0-dim tensor during the step (:mod:`.hyperparameters`), and with PyTorch's own
state. Another optimizer (a class of your own, or a subclass that overrides ``step``) runs its own
``step()``, with tensor learning rates (and Adam-style betas) where PyTorch accepts them.

With a GradScaler the update takes ``found_inf``, a 0-dim bool the unscale computed on the
device: every parameter and state tensor gets ``where(found_inf, old, new)``, so a skipped step
changes nothing and the host never waits to decide (:mod:`.scaler`). State a skipped first step
makes is zero, which is a parameter's state before any step for every rule but SGD's momentum
buffer (the gradient at its first step): there a per-parameter flag, on the device, says whether
the buffer's first step ran; a buffer whose first step never ran is removed at ``close()``.

The compiled function gets a code object of its own per step (:func:`own_code`): Dynamo keeps
its compiled variants, and counts them against its recompile limit, per code object, so only
this step's own changes count.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any

import torch

from torch_adreno.training.update_rules import RULES, UpdateRule

# (Imported here: an import inside the traced update would be a graph break.)
_OPTIMIZER_MODULE = importlib.import_module("torch.optim.optimizer")


def own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a plain function or closure) with a code object of its own (module docstring)."""
    assert isinstance(function, types.FunctionType)
    code = function.__code__.replace()
    return types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)


def rule_for(optimizer: torch.optim.Optimizer) -> UpdateRule | None:
    """The rule the step traces for ``optimizer`` (None: it runs the optimizer's own ``step()``):
    a class of :data:`RULES` or a subclass that keeps its ``step`` and ``_init_group``, with real
    floating-point parameters, no ``differentiable`` group."""
    cls = next((c for c in type(optimizer).__mro__ if c in RULES), None)
    if cls is None or type(optimizer).step is not cls.step \
            or getattr(type(optimizer), "_init_group", None) is not getattr(cls, "_init_group", None):
        return None
    for group in optimizer.param_groups:
        if group.get("differentiable") or any(p.is_complex() or not p.is_floating_point() for p in group["params"]):
            return None
    return RULES[cls]


def _step_hooks(optimizer: torch.optim.Optimizer) -> tuple[list[Any], list[Any]]:
    """The step pre- and post-hooks ``Optimizer.step`` runs, in its order (global ones first before
    the step, last after it)."""
    pre = [*_OPTIMIZER_MODULE._global_optimizer_pre_hooks.values(), *optimizer._optimizer_step_pre_hooks.values()]
    post = [*optimizer._optimizer_step_post_hooks.values(), *_OPTIMIZER_MODULE._global_optimizer_post_hooks.values()]
    return pre, post


class DeviceUpdate:
    """``optimizer.step()`` through ``rule`` (module docstring); called with ``found_inf`` (None
    without a GradScaler) inside the compiled function. ``scaled``: a GradScaler may skip steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, rule: UpdateRule, scaled: bool) -> None:
        self.optimizer = optimizer
        self.rule = rule
        #: Per parameter, whether its state's first step ran (1.0) or not yet (0.0): only where a
        #: GradScaler may skip a first step that differs from the rest (SGD's momentum buffer).
        self.started: dict[torch.Tensor, torch.Tensor] = {
            p: torch.zeros(()) for group in optimizer.param_groups for p in group["params"]
        } if scaled and rule.first_step_differs else {}
        for flag in self.started.values():
            torch._dynamo.mark_static_address(flag, guard=False)  # state: resident on the device

    def __call__(self, found_inf: torch.Tensor | None) -> None:
        optimizer = self.optimizer
        pre_hooks, post_hooks = _step_hooks(optimizer)
        for hook in pre_hooks:
            result = hook(optimizer, (), {})
            if result is not None and not (isinstance(result, tuple) and len(result) == 2):
                raise RuntimeError(f"an optimizer step pre-hook must return None or (args, kwargs), not {result!r}")
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._step_parameter(group, p, found_inf)
        for hook in post_hooks:
            hook(optimizer, (), {})

    def _step_parameter(self, group: dict[str, Any], p: torch.Tensor, found_inf: torch.Tensor | None) -> None:
        state = self.optimizer.state[p]
        if not state and self.rule.new_state is not None:
            state.update(self.rule.new_state(group, p, self.optimizer.defaults))
        started = self.started.get(p)
        grad = p.grad
        assert grad is not None
        new = self.rule.update(group, p, grad, state, started if "momentum_buffer" in state else None)
        for key, value in new.items():
            target = p if key == "param" else state.get(key)
            if target is None:  # state made at its first step (SGD's momentum buffer)
                state[key] = value if found_inf is None else torch.where(found_inf, torch.zeros_like(value), value)
            else:
                target.copy_(value if found_inf is None else torch.where(found_inf, target, value))
        if started is not None and "momentum_buffer" in new and found_inf is not None:
            started.copy_(torch.where(found_inf, started, torch.ones_like(started)))

    def mark_state_static(self) -> None:
        """Mark every state tensor (made by a compiled update, or before the step) a static input,
        as Dynamo marks those of an ``optimizer.step()`` it traces: the residency keeps their device
        copies like parameters' (a one-off input's may be evicted). Called on the host, before
        the next compilation reads them."""
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and not hasattr(value, "_dynamo_static_input_type"):
                    torch._dynamo.mark_static_address(value, guard=False)

    def unstarted_state(self) -> list[tuple[torch.Tensor, str]]:
        """(parameter, key) of each state entry whose first step never ran (host values current)."""
        return [(p, "momentum_buffer") for p, flag in self.started.items()
                if "momentum_buffer" in self.optimizer.state.get(p, {}) and float(flag) == 0.0]
