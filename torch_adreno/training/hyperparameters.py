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

import logging
import operator
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
    """One parameter group's inputs: a tensor per input value (a tuple key's elements by
    position), the replacements a call makes (its plan), and what was compiled in, as last seen.

    Invariant: while the group holds the very value objects it held at the last :meth:`plan`
    (floats and tuples are immutable), that plan is still right and its tensors hold the values."""

    def __init__(self, keys: tuple[str, ...], zero_is_structural: frozenset[str],
                 settings_for_call: dict[str, Any]) -> None:
        self.keys = keys
        self.zero_is_structural = zero_is_structural
        #: Values the call sets (another optimizer's foreach/capturable/fused).
        self.settings_for_call = settings_for_call
        self._tensors: dict[tuple[str, int], torch.Tensor] = {}
        self._values: dict[tuple[str, int], float] = {}
        self._tuples: dict[str, tuple[Any, ...]] = {}
        #: The group's keys and value objects at the last plan, and the plan: (key, value held in the call).
        #: Per input key: (the value the group held, what the call holds instead), or _ABSENT.
        self._held: dict[str, Any] = {}
        self.seen_keys: tuple[str, ...] = ()
        self.seen_values: list[Any] = []
        self.plan: list[tuple[str, Any]] = []
        #: What is compiled in, by key (``"zero <key>"``: whether a zero-is-structural value is zero).
        self.compiled_in: dict[str, Any] | None = None

    def holds_what_it_planned(self, group: dict[str, Any]) -> bool:
        return len(group) == len(self.seen_values) and all(map(operator.is_, group.values(), self.seen_values)) \
            and tuple(group) == self.seen_keys

    def _tensor(self, key: str, position: int, value: float) -> torch.Tensor:
        slot = (key, position)
        tensor = self._tensors.get(slot)
        if tensor is None:
            tensor = self._tensors[slot] = torch.tensor(float(value), dtype=torch.float32)
        elif self._values[slot] != value:
            tensor.fill_(float(value))  # a version bump: the next call uploads it (no grad: a plain leaf)
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

    def make_plan(self, group: dict[str, Any]) -> dict[str, Any]:
        """The plan for ``group`` as it is now (input tensors filled); returns what is compiled in."""
        changed = {key for key, value in zip(self.seen_keys, self.seen_values, strict=True)
                   if group.get(key, _ABSENT) is not value} | (set(group) - set(self.seen_keys))
        compiled_in = dict(self.compiled_in or {})
        for key in changed:
            compiled_in.pop(key, None)
            compiled_in.pop("zero " + key, None)
            if key not in group or key == "params":
                continue
            value = group[key]
            if key not in self.keys:
                compiled_in[key] = _as_setting(value)
            elif key in self.zero_is_structural and _is_number(value):
                compiled_in["zero " + key] = value == 0
        for key in self.keys:
            if key in changed or key not in self._held:
                value = group.get(key, _ABSENT)
                self._held[key] = value if value is _ABSENT else (value, self.input_for(key, value))
        plan = list(self.settings_for_call.items())
        plan += [(key, held[1]) for key, held in self._held.items() if held is not _ABSENT and held[1] is not held[0]]
        self.seen_keys, self.seen_values, self.plan = tuple(group), list(group.values()), plan
        return compiled_in


_ABSENT = object()


class StepHyperparameters:
    """The module docstring's inputs for ``optimizer``; ``rule``: the update the step traces (None:
    the optimizer's own ``step()``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, rule: UpdateRule | None) -> None:
        self._optimizer = optimizer
        self._rule = rule
        self._groups: list[dict[str, Any]] = []
        self._inputs: list[_GroupInputs] = []
        #: (group, key, value before the call) of everything :meth:`enter` replaced.
        self._replaced: list[tuple[dict[str, Any], str, Any]] = []
        self._warned: set[str] = set()
        #: Nesting depth of enter() (an export inside a call enters again: only the outermost acts).
        self._depth = 0
        #: Each change of a compiled-in setting seen, in words ("'nesterov' of group 0: False -> True").
        self.changes: list[str] = []

    def _rebuild(self, groups: list[dict[str, Any]]) -> None:
        self._groups = list(groups)
        self._inputs = []
        for group in groups:
            if self._rule is not None:
                self._inputs.append(_GroupInputs(self._rule.inputs, self._rule.zero_is_structural, {}))
            else:
                keys = (LEARNING_RATE, BETAS) if "capturable" in group else (LEARNING_RATE,)
                self._inputs.append(_GroupInputs(keys, frozenset(), _own_step_settings(group)))

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
            inputs = self._inputs[index]
            if not inputs.holds_what_it_planned(group):
                compiled_in = inputs.make_plan(group)
                if inputs.compiled_in is not None and compiled_in != inputs.compiled_in:
                    self._note_changes(index, inputs.compiled_in, compiled_in)
                inputs.compiled_in = compiled_in
            for key, held in inputs.plan:
                replaced.append((group, key, group[key]))
                group[key] = held

    def exit(self) -> None:
        """After a call: every group as it was before it."""
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        for group, key, value in reversed(self._replaced):
            group[key] = value
        self._replaced.clear()

    def __enter__(self) -> StepHyperparameters:
        """``with hyperparameters:`` the groups as a call sees them, inside the block."""
        try:
            self.enter()
        except BaseException:
            self.exit()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def applied(self) -> StepHyperparameters:
        """The groups as a call sees them, as a context manager (``with step._hyperparameters.applied():``)."""
        return self

    def _note_changes(self, index: int, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Warn (once per setting) that what is compiled into the step changed since the last call."""
        for key in sorted(set(old) | set(new)):
            if old.get(key, "(none)") == new.get(key, "(none)"):
                continue
            name = key.removeprefix("zero ")
            what = (f"whether {name!r} of parameter group {index} is zero" if key.startswith("zero ")
                    else f"{key!r} of parameter group {index}")
            change = f"{what}: {_shown(old.get(key, '(none)'))} -> {_shown(new.get(key, '(none)'))}"
            self.changes.append(change)
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
