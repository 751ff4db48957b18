"""The optimizer settings a :class:`~torch_adreno.TrainingStep` runs with, and its learning rates
as step inputs.

A step compiles the optimizer's own ``step()``. Dynamo specialises a Python float hyperparameter
to its value: a learning rate changed every step (a warmup or cosine schedule) would be a new
compilation every step, and a new capture of the replay. So while a TrainingStep is open each
parameter group's learning rate (and an Adam-family group's ``betas``) is a 0-dim float32 tensor,
which the compiled step reads as an input: a schedule's new value is written into that tensor
(``LRScheduler`` fills tensor learning rates in place; a float a loop assigns to
``group["lr"]`` is written into it by :meth:`StepHyperparameters.sync` before the next step), and
a replay uploads the changed scalar instead of capturing again (:mod:`.replay.step`).

Also, for the device: a ``fused=True`` group runs PyTorch's own update on the device (the fused
kernels are host code; the update is the same); ``foreach=True`` where the group left it unset
and is not ``differentiable``: unset, PyTorch picks the per-tensor implementation for the host
tensors a step's parameters are, and Dynamo traces its loop once per parameter (a 12-block
GPT-2's 48 LoRA tensors take about 1 s more to trace than through the multi-tensor one, which
PyTorch itself takes for tensors on a GPU); both compile to the same kernels, and for SGD, Adam,
AdamW, RMSprop and Adagrad they are bitwise the same update. ``capturable=True`` where the
multi-tensor Adam family needs it for tensor hyperparameters. :meth:`StepHyperparameters.remove`
(at ``close()``) puts every setting back, the learning rates as floats of their current values
(the value given where the tensor still holds it), and ``optimizer.state_dict()`` saves the
settings as given.

Other hyperparameters (weight decay, momentum, eps) stay as given: PyTorch's optimizers take them
as numbers only, so changing one is a new compilation and capture (Dynamo's recompile limit, 8,
then stops the step with an error saying so).
"""

from __future__ import annotations

from typing import Any

import torch

#: Group keys whose float values become tensors: the learning rate everywhere; ``betas`` where the
#: optimizer takes tensor betas (groups with a ``capturable`` setting, the Adam family).
LEARNING_RATE = "lr"
BETAS = "betas"


def _as_tensor(value: float) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


class StepHyperparameters:
    """The settings above applied to ``optimizer``'s groups (see the module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._groups: list[dict[str, Any]] = []
        #: (group, key, previous value) of every setting changed here, to put back.
        self._changed: list[tuple[dict[str, Any], str, Any]] = []
        #: (group, key, value given) of each float value made a tensor here (a float again on remove).
        self._converted: list[tuple[dict[str, Any], str, Any]] = []
        #: Per group, the learning rate tensor the step reads.
        self._learning_rates: list[torch.Tensor | None] = []
        self._apply()
        # Checkpoints hold the optimizer as the user made it, not as the step runs it.
        self._state_dict_hook = optimizer.register_state_dict_post_hook(self._as_given)

    def _apply(self) -> None:
        self._groups = list(self._optimizer.param_groups)
        self._learning_rates = []
        for group in self._groups:
            if group.get("fused"):
                self._set(group, "fused", False)
            tensors_given = any(isinstance(v, torch.Tensor) for k, v in group.items() if k != "params")
            if "foreach" in group and group["foreach"] is None and not group.get("differentiable") \
                    and ("capturable" in group or not tensors_given):
                self._set(group, "foreach", True)
            lr = group.get(LEARNING_RATE)
            if isinstance(lr, (int, float)) and not isinstance(lr, bool):
                group[LEARNING_RATE] = _as_tensor(lr)
                self._converted.append((group, LEARNING_RATE, lr))
            lr = group.get(LEARNING_RATE)
            self._learning_rates.append(lr if isinstance(lr, torch.Tensor) else None)
            betas = group.get(BETAS)
            if "capturable" in group and isinstance(betas, tuple) and all(isinstance(b, float) for b in betas):
                group[BETAS] = tuple(_as_tensor(b) for b in betas)
                self._converted.append((group, BETAS, betas))
            if "capturable" in group and group.get("foreach") and not group["capturable"] \
                    and any(isinstance(v, torch.Tensor) for k, v in group.items() if k != "params"):
                self._set(group, "capturable", True)

    def _set(self, group: dict[str, Any], key: str, value: Any) -> None:
        self._changed.append((group, key, group[key]))
        group[key] = value

    def sync(self) -> None:
        """Before a step: a float a loop assigned to a learning rate is written into its tensor
        (which goes back in the group), so that the step reads it as an input; groups that
        ``load_state_dict`` replaced get the settings anew."""
        groups = self._optimizer.param_groups
        if len(groups) != len(self._groups) or any(a is not b for a, b in zip(groups, self._groups, strict=True)):
            self._restore(only_live=True)
            self._apply()
            return
        for index, group in enumerate(groups):
            tensor, value = self._learning_rates[index], group.get(LEARNING_RATE)
            if value is tensor:
                continue
            if isinstance(value, torch.Tensor):
                self._learning_rates[index] = value  # the user's own tensor from now on
            elif tensor is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                with torch.no_grad():
                    tensor.fill_(float(value))
                group[LEARNING_RATE] = tensor

    def _as_given(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state_dict post-hook: the groups' settings as the user gave them."""
        saved = state_dict["param_groups"]
        by_group = {id(g): index for index, g in enumerate(optimizer.param_groups)}
        for group, key, given in self._converted:
            index = by_group.get(id(group))
            if index is not None and key in saved[index]:
                saved[index][key] = _as_floats(saved[index][key], given)
        for group, key, previous in self._changed:
            index = by_group.get(id(group))
            if index is not None:
                saved[index][key] = previous
        return state_dict

    def _restore(self, only_live: bool = False) -> None:
        live = {id(g) for g in self._optimizer.param_groups}
        for group, key, given in self._converted:
            if not only_live or id(group) in live:
                group[key] = _as_floats(group.get(key), given)
        self._converted.clear()
        for group, key, previous in reversed(self._changed):
            if not only_live or id(group) in live:
                group[key] = previous
        self._changed.clear()

    def remove(self) -> None:
        """The groups as they were given, converted values as floats of their current values."""
        self._restore()
        self._state_dict_hook.remove()


def _as_floats(value: Any, given: Any) -> Any:
    """``value`` (a tensor, or a tuple of them) as floats: ``given``'s own where the tensor still
    holds it (a float32 tensor holds 1e-3 as 0.0010000000474974513), else the tensor's value."""
    if isinstance(value, tuple):
        givens = given if isinstance(given, tuple) and len(given) == len(value) else (None,) * len(value)
        return tuple(_as_floats(v, g) for v, g in zip(value, givens, strict=True))
    if not isinstance(value, torch.Tensor):
        return value
    if isinstance(given, (int, float)) and float(value) == float(_as_tensor(given)):
        return given
    return float(value)
