"""torch.optim's update rules written over tensor hyperparameters: what a
:class:`~torch_adreno.TrainingStep` compiles instead of ``optimizer.step()`` for the optimizers
of :data:`RULES` (see :mod:`.updates` for why and how it is driven).

Each rule is PyTorch's single-tensor implementation (the one eager PyTorch runs on the CPU), one
parameter at a time, with the same operations in the same order -- ``a.add_(b, alpha=s)`` is
``a + s * b``, ``addcmul_(t1, t2, value=s)`` is ``a + s * t1 * t2``, ``addcdiv_`` is
``a + s * (t1 / t2)`` -- except that every hyperparameter is read from the group as it is during
the step: a 0-dim float32 tensor (an input of the compiled graph), or a Python number where the
value is compiled in (:attr:`UpdateRule.zero_is_structural`: a zero weight decay or momentum
stays ``0.0``, and no decay term or momentum buffer exists, as in PyTorch). Scalar arithmetic
PyTorch does on the host in float64 (bias corrections, ``1 - lr * weight_decay``) is done on
the device in float32: the one difference from eager, within a few float32 roundings of the
scalars.

A rule returns the new value of the parameter (``"param"``) and of each state entry; it writes
nothing (the driver writes, selecting the old values where a GradScaler step is skipped). State
is PyTorch's own -- the same keys, dtypes and layouts, made at a parameter's first step -- so
checkpoints and eager steps after ``close()`` see the optimizer as PyTorch would have left it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Group = dict[str, Any]
State = dict[str, torch.Tensor]


def nonzero(value: Any) -> bool:
    """Whether a zero-is-structural hyperparameter is in use: a tensor (it was not zero when the
    step was compiled), or a number other than zero."""
    return isinstance(value, torch.Tensor) or value != 0


def _scalar_dtype() -> torch.dtype:
    # PyTorch's (torch.optim.optimizer._get_scalar_dtype): float64 under a float64 default dtype.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _step_tensor() -> torch.Tensor:
    """PyTorch's step counter of a non-capturable, non-fused group: a 0-dim tensor on the host."""
    return torch.tensor(0.0, dtype=_scalar_dtype())


def _zeros(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _entry(state: State, key: str, p: torch.Tensor) -> torch.Tensor:
    """A state entry PyTorch makes only where a setting asked for it when the state was made
    (amsgrad, centered, momentum): where the setting was turned on later it starts from zeros, as
    a fresh entry does (PyTorch raises a KeyError there)."""
    value = state.get(key)
    return _zeros(p) if value is None else value


def _gradient(group: Group, p: torch.Tensor, g: torch.Tensor, coupled_decay: bool = True) -> torch.Tensor:
    """The gradient a rule steps on: negated when maximizing, plus ``weight_decay * p`` (coupled)."""
    g = -g if group.get("maximize", False) else g
    wd = group.get("weight_decay", 0.0)
    if coupled_decay and nonzero(wd):
        g = g + wd * p
    return g


# -- the rules -------------------------------------------------------------------------------


def _sgd(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    g = _gradient(group, p, g)
    new: State = {}
    momentum = group["momentum"]
    if nonzero(momentum):
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = g.clone()
        else:
            stepped = buf * momentum + (1 - group["dampening"]) * g
            # A GradScaler step may skip a buffer's first step: until one ran, the buffer is the
            # gradient itself, as PyTorch makes it (``started``: 0 before, 1 after).
            buf = stepped if started is None else torch.where(started > 0, stepped, g)
        new["momentum_buffer"] = buf
        g = g + momentum * buf if group["nesterov"] else buf
    new["param"] = p + (-group["lr"]) * g
    return new


def _adam_moments(group: Group, p: torch.Tensor, g: torch.Tensor,
                  state: State) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, Any, Any]:
    """Adam's and RAdam's shared first part, as PyTorch orders it: the (coupled or decoupled)
    weight decay, the next step, both moments and both bias corrections."""
    decoupled = bool(group.get("decoupled_weight_decay", False))
    g = _gradient(group, p, g, coupled_decay=not decoupled)
    lr, wd = group["lr"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    step = state["step"] + 1
    if decoupled and nonzero(wd):
        p = p * (1 - lr * wd)
    exp_avg = torch.lerp(state["exp_avg"], g, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + (1 - beta2) * g * g
    return p, step, exp_avg, exp_avg_sq, 1 - beta1 ** step, 1 - beta2 ** step


def _adam(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    p, step, exp_avg, exp_avg_sq, bias_correction1, bias_correction2 = _adam_moments(group, p, g, state)
    lr, eps = group["lr"], group["eps"]
    step_size = lr / bias_correction1
    new: State = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if group["amsgrad"]:
        new["max_exp_avg_sq"] = torch.maximum(_entry(state, "max_exp_avg_sq", p), exp_avg_sq)
        denom = new["max_exp_avg_sq"].sqrt() / bias_correction2.sqrt() + eps
    else:
        denom = exp_avg_sq.sqrt() / bias_correction2.sqrt() + eps
    new["param"] = p + (-step_size) * (exp_avg / denom)
    return new


def _adam_state(group: Group, p: torch.Tensor) -> State:
    state = {"step": _step_tensor(), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}
    if group.get("amsgrad", False):
        state["max_exp_avg_sq"] = _zeros(p)
    return state


def _adamw(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    # (torch 2.13's AdamW is Adam with decoupled_weight_decay=True in its groups; older ones lack the key)
    return _adam({**group, "decoupled_weight_decay": True}, p, g, state, started)


def _rmsprop(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    g = _gradient(group, p, g)
    alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
    new: State = {"step": state["step"] + 1}
    square_avg = new["square_avg"] = state["square_avg"] * alpha + (1 - alpha) * g * g
    if group["centered"]:
        grad_avg = new["grad_avg"] = torch.lerp(_entry(state, "grad_avg", p), g, 1 - alpha)
        avg = (square_avg + (-1) * grad_avg * grad_avg).sqrt()
    else:
        avg = square_avg.sqrt()
    avg = avg + eps
    if nonzero(momentum):
        buf = new["momentum_buffer"] = _entry(state, "momentum_buffer", p) * momentum + g / avg
        new["param"] = p + (-group["lr"]) * buf
    else:
        new["param"] = p + (-group["lr"]) * (g / avg)
    return new


def _rmsprop_state(group: Group, p: torch.Tensor) -> State:
    state = {"step": _step_tensor(), "square_avg": _zeros(p)}
    if nonzero(group["momentum"]):
        state["momentum_buffer"] = _zeros(p)
    if group["centered"]:
        state["grad_avg"] = _zeros(p)
    return state


def _adagrad(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    g = _gradient(group, p, g)
    step = state["step"] + 1
    clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
    state_sum = state["sum"] + g * g
    std = state_sum.sqrt() + group["eps"]
    return {"step": step, "sum": state_sum, "param": p + (-clr) * (g / std)}


def _adagrad_state(group: Group, p: torch.Tensor, defaults: dict[str, Any]) -> State:
    return {"step": _step_tensor(),
            "sum": torch.full_like(p, defaults["initial_accumulator_value"], memory_format=torch.preserve_format)}


def _adamax(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    g = _gradient(group, p, g)
    beta1, beta2 = group["betas"]
    step = state["step"] + 1
    exp_avg = torch.lerp(state["exp_avg"], g, 1 - beta1)
    exp_inf = torch.maximum(state["exp_inf"] * beta2, g.abs() + group["eps"])
    clr = group["lr"] / (1 - beta1 ** step)
    return {"step": step, "exp_avg": exp_avg, "exp_inf": exp_inf, "param": p + (-clr) * (exp_avg / exp_inf)}


def _adamax_state(group: Group, p: torch.Tensor) -> State:
    return {"step": _step_tensor(), "exp_avg": _zeros(p), "exp_inf": _zeros(p)}


def _adadelta(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    g = _gradient(group, p, g)
    rho, eps = group["rho"], group["eps"]
    square_avg = state["square_avg"] * rho + (1 - rho) * g * g
    std = (square_avg + eps).sqrt()
    delta = (state["acc_delta"] + eps).sqrt() / std * g
    acc_delta = state["acc_delta"] * rho + (1 - rho) * delta * delta
    return {"step": state["step"] + 1, "square_avg": square_avg, "acc_delta": acc_delta,
            "param": p + (-group["lr"]) * delta}


def _adadelta_state(group: Group, p: torch.Tensor) -> State:
    return {"step": _step_tensor(), "square_avg": _zeros(p), "acc_delta": _zeros(p)}


def _nadam(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    decoupled = bool(group.get("decoupled_weight_decay", False))
    g = _gradient(group, p, g, coupled_decay=not decoupled)
    lr, wd, eps, momentum_decay = group["lr"], group["weight_decay"], group["eps"], group["momentum_decay"]
    beta1, beta2 = group["betas"]
    step = state["step"] + 1
    bias_correction2 = 1 - beta2 ** step
    if decoupled and nonzero(wd):
        p = p * (1 - lr * wd)
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
    mu_product = state["mu_product"] * mu
    exp_avg = torch.lerp(state["exp_avg"], g, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + (1 - beta2) * g * g
    denom = (exp_avg_sq / bias_correction2).sqrt() + eps
    mu_product_next = mu_product * mu_next
    p = p + (-lr * (1.0 - mu) / (1.0 - mu_product)) * (g / denom)
    p = p + ((-lr * mu_next) / (1.0 - mu_product_next)) * (exp_avg / denom)
    return {"step": step, "mu_product": mu_product, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "param": p}


def _nadam_state(group: Group, p: torch.Tensor) -> State:
    return {"step": _step_tensor(), "mu_product": torch.tensor(1.0, dtype=_scalar_dtype()),
            "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}


def _radam(group: Group, p: torch.Tensor, g: torch.Tensor, state: State, started: torch.Tensor | None) -> State:
    p, step, exp_avg, exp_avg_sq, bias_correction1, bias_correction2 = _adam_moments(group, p, g, state)
    lr, eps = group["lr"], group["eps"]
    beta2 = group["betas"][1]
    bias_corrected_exp_avg = exp_avg / bias_correction1
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
    adaptive_lr = (bias_correction2 ** 0.5) / (exp_avg_sq.sqrt() + eps)
    # PyTorch decides rho_t > 5 on the host (non-capturable) or by a where (capturable): the same
    # values (the rectification, NaN where rho_t <= 4, is not selected there).
    update = torch.where(rho_t > 5.0, adaptive_lr * rect, 1.0)
    return {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
            "param": p + (-1.0) * (bias_corrected_exp_avg * lr * update)}


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateRule:
    """One optimizer class's update over tensor hyperparameters.

    ``inputs``: the group keys read as 0-dim tensor inputs (a tuple key, ``betas``, element by
    element); ``zero_is_structural``: those of them whose zero is compiled in (a zero stays a
    number); ``update(group, param, grad, state, started)``: the new values (module docstring);
    ``new_state(group, param, defaults)``: a parameter's state before its first step (None: the
    rule makes its state in ``update``, as SGD's momentum buffer). ``first_step_differs``: the
    first step of a state entry is not the general one with zero state (SGD's buffer is the
    gradient, not ``(1 - dampening) * gradient``), so a skipped first step must be tracked."""

    inputs: tuple[str, ...]
    update: Callable[[Group, torch.Tensor, torch.Tensor, State, torch.Tensor | None], State]
    new_state: Callable[[Group, torch.Tensor, dict[str, Any]], State] | None = None
    zero_is_structural: frozenset[str] = field(default_factory=frozenset)
    first_step_differs: bool = False


def _ignoring_defaults(make: Callable[[Group, torch.Tensor], State]) -> Callable[[Group, torch.Tensor, dict[str, Any]], State]:
    return lambda group, p, defaults: make(group, p)


_DECAY = frozenset({"weight_decay"})

#: The optimizer classes whose update a TrainingStep traces itself, with their rules.
RULES: dict[type[torch.optim.Optimizer], UpdateRule] = {
    torch.optim.SGD: UpdateRule(("lr", "momentum", "dampening", "weight_decay"), _sgd,
                                zero_is_structural=_DECAY | {"momentum"}, first_step_differs=True),
    torch.optim.Adam: UpdateRule(("lr", "betas", "eps", "weight_decay"), _adam, _ignoring_defaults(_adam_state), _DECAY),
    torch.optim.AdamW: UpdateRule(("lr", "betas", "eps", "weight_decay"), _adamw, _ignoring_defaults(_adam_state),
                                  _DECAY),
    torch.optim.RMSprop: UpdateRule(("lr", "alpha", "eps", "weight_decay", "momentum"), _rmsprop,
                                    _ignoring_defaults(_rmsprop_state), _DECAY | {"momentum"}),
    torch.optim.Adagrad: UpdateRule(("lr", "lr_decay", "weight_decay", "eps"), _adagrad, _adagrad_state, _DECAY),
    torch.optim.Adamax: UpdateRule(("lr", "betas", "eps", "weight_decay"), _adamax, _ignoring_defaults(_adamax_state),
                                   _DECAY),
    torch.optim.Adadelta: UpdateRule(("lr", "rho", "eps", "weight_decay"), _adadelta,
                                     _ignoring_defaults(_adadelta_state), _DECAY),
    torch.optim.NAdam: UpdateRule(("lr", "betas", "eps", "weight_decay", "momentum_decay"), _nadam,
                                  _ignoring_defaults(_nadam_state), _DECAY),
    torch.optim.RAdam: UpdateRule(("lr", "betas", "eps", "weight_decay"), _radam, _ignoring_defaults(_adam_state),
                                  _DECAY),
}
