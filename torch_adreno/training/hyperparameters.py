"""An optimizer's hyperparameters as scalar inputs of a :class:`~torch_adreno.TrainingStep`.

Dynamo specialises a Python float it reads to its value: a learning rate or momentum changed
every step (a warmup, a cosine schedule, ``OneCycleLR`` cycling momentum) would be a new
compilation every step, and a new capture of the replay. So during each call of the step --
and only then -- every hyperparameter the compiled update reads as a number is a 0-dim float32
tensor in its group, the same tensor object at every call, holding the group's current value:
the compiled graphs read it as an input, and a replay uploads it when its value changed
(:mod:`torch_adreno.replay.inputs`) instead of capturing again. Between calls the groups hold
exactly what the user, a scheduler or ``load_state_dict`` put there (floats stay floats:
schedulers compute in float64 as in eager PyTorch, ``optimizer.state_dict()`` saves the settings
as given, and nothing is left to undo at ``close()``).

Which keys are inputs: for an optimizer whose update the step traces itself
(:mod:`.updates`), every float hyperparameter of its rule (``lr``, ``betas``, ``momentum``,
``dampening``, ``weight_decay``, ``eps``, ``alpha``, ...), except that a zero weight decay or
momentum stays the number 0 (no decay term, no momentum buffer: compiled in, as in PyTorch);
for another optimizer, which runs its own ``step()``, the learning rate and, where the group has
a ``capturable`` setting (Adam's family), ``betas`` (with ``capturable=True`` and
``foreach=True`` for the call, which PyTorch needs for tensor hyperparameters; a ``fused=True``
group runs PyTorch's same update unfused on the device). A tensor the user gave is used as it is.

Everything else in a group (booleans such as ``nesterov``, ``amsgrad``, ``maximize``; whether a
weight decay or momentum is zero; any other number) is compiled in: a change compiles and
captures the step again, and the first change of each setting is logged as one warning naming it
(:attr:`StepHyperparameters.changes` keeps them for the message of a recompile limit).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from torch_adreno.training.update_rules import UpdateRule

_log = logging.getLogger("torch_adreno")

#: The keys another optimizer's own step() takes as tensors (see the module docstring).
LEARNING_RATE = "lr"
BETAS = "betas"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_setting(value: Any) -> Any:
    """A group value as compared between calls: tensors by identity (never elementwise)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_as_setting(v) for v in value)
    return value


class _GroupInputs:
    """The input tensors of one parameter group, by key (a tuple key's elements by position)."""

    def __init__(self, keys: tuple[str, ...], zero_is_structural: frozenset[str]) -> None:
        self.keys = keys
        self.zero_is_structural = zero_is_structural
        self._tensors: dict[tuple[str, int], torch.Tensor] = {}
        self._values: dict[tuple[str, int], float] = {}
        self._tuples: dict[str, tuple[Any, ...]] = {}

    def _tensor(self, key: str, position: int, value: float) -> torch.Tensor:
        slot = (key, position)
        tensor = self._tensors.get(slot)
        if tensor is None:
            tensor = self._tensors[slot] = torch.tensor(float(value), dtype=torch.float32)
        elif self._values[slot] != value:
            with torch.no_grad():
                tensor.fill_(float(value))  # a version bump: the next call uploads it
        self._values[slot] = value
        return tensor

    def input_for(self, key: str, value: Any) -> Any:
        """What the group holds for ``key`` during a call (``value`` itself where it is no input)."""
        if _is_number(value):
            if value == 0 and key in self.zero_is_structural:
                return value
            return self._tensor(key, 0, value)
        if isinstance(value, tuple) and any(_is_number(v) for v in value):
            items = tuple(self._tensor(key, position, v) if _is_number(v) else v for position, v in enumerate(value))
            kept = self._tuples.get(key)
            if kept is not None and len(kept) == len(items) and all(a is b for a, b in zip(kept, items, strict=True)):
                return kept  # one tuple object across calls
            self._tuples[key] = items
            return items
        return value


class StepHyperparameters:
    """The module docstring's inputs for ``optimizer``; ``rule``: the update the step traces (None:
    the optimizer's own ``step()``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, rule: UpdateRule | None) -> None:
        self._optimizer = optimizer
        self._rule = rule
        self._groups: list[dict[str, Any]] = []
        self._inputs: list[_GroupInputs] = []
        #: Per group, values the call sets (another optimizer's foreach/capturable/fused).
        self._settings_for_call: list[dict[str, Any]] = []
        #: Per group, what is compiled in as last seen (see :meth:`_note_changes`).
        self._compiled_in: list[tuple[tuple[str, Any], ...] | None] = []
        #: (group, key, value before the call) of everything :meth:`enter` replaced.
        self._replaced: list[tuple[dict[str, Any], str, Any]] = []
        self._warned: set[str] = set()
        #: Nesting depth of enter() (an export inside a call enters again: only the outermost acts).
        self._depth = 0
        #: Each change of a compiled-in setting seen, in words ("'nesterov' of group 0: False -> True").
        self.changes: list[str] = []

    def _rebuild(self, groups: list[dict[str, Any]]) -> None:
        self._groups = list(groups)
        self._inputs, self._settings_for_call, self._compiled_in = [], [], []
        for group in groups:
            if self._rule is not None:
                self._inputs.append(_GroupInputs(self._rule.inputs, self._rule.zero_is_structural))
                self._settings_for_call.append({})
            else:
                keys = (LEARNING_RATE, BETAS) if "capturable" in group else (LEARNING_RATE,)
                self._inputs.append(_GroupInputs(keys, frozenset()))
                self._settings_for_call.append(_own_step_settings(group))
            self._compiled_in.append(None)

    def enter(self) -> None:
        """Before a call: the inputs into the groups (see the module docstring)."""
        self._depth += 1
        if self._depth > 1:
            return
        groups = self._optimizer.param_groups
        if len(groups) != len(self._groups) or any(a is not b for a, b in zip(groups, self._groups, strict=True)):
            self._rebuild(groups)  # new groups (load_state_dict, add_param_group)
        replaced = self._replaced
        for index, group in enumerate(groups):
            for key, value in self._settings_for_call[index].items():
                replaced.append((group, key, group[key]))
                group[key] = value
            inputs = self._inputs[index]
            zero_flags = []
            for key in inputs.keys:
                value = group.get(key)
                if key in inputs.zero_is_structural and _is_number(value):
                    zero_flags.append(("zero " + key, value == 0))
                held = inputs.input_for(key, value)
                if held is not value:
                    replaced.append((group, key, value))
                    group[key] = held
            self._note_changes(index, group, inputs.keys, zero_flags)

    def exit(self) -> None:
        """After a call: every group as it was before it."""
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        for group, key, value in reversed(self._replaced):
            group[key] = value
        self._replaced.clear()

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The groups as a call sees them, inside the ``with`` block."""
        try:
            self.enter()
            yield
        finally:
            self.exit()

    def _note_changes(self, index: int, group: dict[str, Any], input_keys: tuple[str, ...],
                      zero_flags: list[tuple[str, bool]]) -> None:
        """Warn (once per setting) when what is compiled into the step changed since the last call."""
        compiled_in = (*((k, _as_setting(v)) for k, v in group.items() if k != "params" and k not in input_keys),
                       *zero_flags)
        before = self._compiled_in[index]
        self._compiled_in[index] = compiled_in
        if before is None or before == compiled_in:
            return
        old, new = dict(before), dict(compiled_in)
        for key in sorted(set(old) | set(new), key=str):
            if old.get(key, "(none)") == new.get(key, "(none)"):
                continue
            what = (f"whether {key.removeprefix('zero ')!r} of parameter group {index} is zero" if key.startswith("zero ")
                    else f"{key!r} of parameter group {index}")
            change = f"{what}: {_shown(old.get(key, '(none)'))} -> {_shown(new.get(key, '(none)'))}"
            self.changes.append(change)
            name = key.removeprefix("zero ")
            if name not in self._warned:
                self._warned.add(name)
                _log.warning("TrainingStep: optimizer setting %s; it is compiled into the step, which is compiled and "
                             "captured again (later changes of %r are not logged)", change, name)

    def remove(self) -> None:
        """At ``close()``: nothing stays replaced."""
        self._depth = min(self._depth, 1)
        self.exit()


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and value[:1] == ("tensor",):
        return "a tensor"
    return repr(value)


def _own_step_settings(group: dict[str, Any]) -> dict[str, Any]:
    """What a group of an optimizer running its own ``step()`` is given for a call: ``fused=False``
    (PyTorch's fused kernels are host code; the unfused update is the same), ``foreach=True``
    where left unset (the multi-tensor update traces faster and is bitwise the same for torch's
    optimizers), and ``capturable=True`` where the multi-tensor Adam family needs it for tensor
    hyperparameters."""
    settings: dict[str, Any] = {}
    if group.get("fused"):
        settings["fused"] = False
    if "foreach" in group and group["foreach"] is None and not group.get("differentiable"):
        settings["foreach"] = True
    if "capturable" in group and not group["capturable"] and settings.get("foreach", group.get("foreach")):
        settings["capturable"] = True
    return settings
