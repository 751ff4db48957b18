"""What a replayed training step assumes, checked before every replay (the guards).

A :class:`~torch_adreno.replay.step.ReplayedStep` runs the kernels one full step enqueued,
bound to the buffers that step used. That is right only while everything the compiled graphs
took as given at capture still holds. :func:`build_guard` writes those facts down as one Python
function (generated source) that reads every watched fact into one tuple and compares it with the
tuple taken at capture -- one C-level comparison, identities as ``id()`` of objects the guard
holds, dictionaries' keys and values read by iteration rather than looked up -- and returns
``None`` when a replay is valid, otherwise the first fact that changed, in words:

- the batch: number of arguments, each tensor's type, shape, strides, storage offset, dtype and
  ``requires_grad``; each other argument's value; which arguments share memory;
- grad mode, the global module hooks, and the train/eval mode and hook counts (forward,
  forward-pre, backward, backward-pre) of every submodule; the optimizer's step hooks (global
  and its own: a capture with any is refused, one added later would be skipped by a replay);
- every parameter and buffer is still the same tensor object in its module, with the same
  ``requires_grad``; the optimizer's groups hold the same parameters with the same hyperparameters
  (lr, momentum, betas, weight decay, ...: anything but the parameter list), and its state the
  same tensors under the same keys (non-tensor state by value);
- every host tensor the step's kernels read in place or from a device copy (parameters, buffers,
  optimizer state, tensors the loss function captured) has the version and memory address it had
  at capture: a host edit, ``load_state_dict`` or ``.data`` swap fails the guard, and the step
  then runs the full path (which uploads the change) and captures again. Tensor hyperparameters
  (learning rates, betas) are the replay's scalar inputs: only their memory address is checked,
  and a new value is uploaded by the replay.

:func:`describe_persistent` names every such tensor for messages and refuses a capture that bound
a host tensor the guards could not watch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from torch_adreno.replay.capture import MemoryIdentity

Guard = Callable[[tuple[Any, ...]], "str | None"]



def batch_signature(batch: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A hashable key for the geometry of a batch, or None if an argument cannot be keyed. The
    device is part of it: a replay binds host memory, and a batch elsewhere takes the full path."""
    parts: list[Any] = []
    for value in batch:
        if isinstance(value, torch.Tensor):
            parts.append((type(value), value.dtype, tuple(value.shape), value.stride(), value.storage_offset(),
                          value.device))
        else:
            try:
                hash(value)
            except TypeError:
                return None
            parts.append((type(value), value))
    return tuple(parts)


def shared_memory(batch: tuple[Any, ...]) -> tuple[int, ...]:
    """For each batch argument, the first position holding a tensor over the same memory (its own
    position where none does; -1 for a non-tensor)."""
    seen: dict[int, int] = {}
    pattern = []
    for position, value in enumerate(batch):
        if isinstance(value, torch.Tensor) and value.numel():
            pattern.append(seen.setdefault(value.untyped_storage().data_ptr(), position))
        else:
            pattern.append(-1)
    return tuple(pattern)


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[tuple[torch.Tensor, tuple[Any, ...]]]:
    """Each tensor of a step's state with where it sits, first place first: ``("module", name)``
    for parameters and buffers, ``("group", index, key)`` for tensor hyperparameters (``betas.0``
    for one in a tuple) and
    ``("state", parameter, key)`` for optimizer state. A tensor held in several places comes
    once per place (callers keep the first)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        yield tensor, ("module", name)
    for index, group in enumerate(optimizer.param_groups):
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                yield value, ("group", index, key)
            elif isinstance(value, tuple) and key != "params":  # Adam's betas as tensors
                for position, item in enumerate(value):
                    if isinstance(item, torch.Tensor):
                        yield item, ("group", index, f"{key}.{position}")
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield value, ("state", param, key)


def tensor_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """Readable names of the model's and optimizer's tensors, by ``id``."""
    names: dict[int, str] = {}
    for tensor, place in state_tensors(model, optimizer):
        if place[0] == "module":
            name = place[1]
        elif place[0] == "group":
            name = f"optimizer.param_groups[{place[1]}][{place[2]!r}]"
        else:
            name = f"optimizer state {place[2]!r} of {names.get(id(place[1]), 'a parameter')}"
        names.setdefault(id(tensor), name)
    return names


def describe_persistent(identities: Iterable[MemoryIdentity], names: dict[int, str]) -> dict[int, str]:
    """Names of the persistent tensors a recording bound (tensors a loss function captured get
    their graph input's name)."""
    return {id(i.tensor): names.get(id(i.tensor), f"the tensor bound to {i.label}")
            for i in identities if i.tensor is not None}


class _Writer:
    """The guard's source, one check at a time, with the objects it compares against.

    Two functions are generated: ``guard``, one expression ``or``-ing every check (the common
    case: all hold, about 0.05-0.3 us a check), and ``explain``, run only when one fails (or an
    expression raised), going through the checks one at a time to name the first that fails."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, str, bool]] = []
        self.namespace: dict[str, Any] = {}

    def bind(self, value: Any) -> str:
        name = f"v{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def check(self, failing: str, reason: str, explain_only: bool = False) -> None:
        """``failing`` (over ``batch`` and bound names) is true when what was captured changed.
        ``explain_only``: a finer message for something other checks of the guard cover."""
        self.checks.append((f"({failing})", reason, explain_only))

    def check_value(self, expression: str, value: Any, reason: str) -> None:
        """A hyperparameter or state value: tensors by identity (their contents are watched as
        persistent tensors), tuples and lists element by element, anything else by equality."""
        if isinstance(value, torch.Tensor):
            self.check(f"{expression} is not {self.bind(value)}", reason)
        elif isinstance(value, (tuple, list)):
            self.check(f"type({expression}) is not {self.bind(type(value))} or len({expression}) != {len(value)}",
                       reason)
            for index, item in enumerate(value):
                self.check_value(f"{expression}[{index}]", item, reason)
        else:
            self.check(f"{expression} != {self.bind(value)}", reason)

    def check_identities(self, expression: str, objects: Iterable[Any], reason: str) -> None:
        """``expression`` iterates over exactly ``objects``, in order, compared by identity in C
        (``id`` of objects this guard holds, so no other object can have one of those ids)."""
        objects = list(objects)
        self.bind(objects)
        self.check(f"tuple(map(id, {expression})) != {self.bind(tuple(id(o) for o in objects))}", reason)

    def build(self) -> Guard:
        lines = ["def explain(batch):"]
        for failing, reason, _ in self.checks:
            lines += ["    try:", f"        if {failing}:", f"            return {reason!r}",
                      "    except Exception as error:",
                      f"        return {reason!r} + f' ({{type(error).__name__}}: {{error}})'"]
        lines.append("    return None")
        lines += ["def guard(batch):", "    try:",
                  f"        if not ({' or '.join(f for f, _, detail in self.checks if not detail) or 'False'}):",
                  "            return None", "    except Exception:", "        pass",
                  "    return explain(batch) or 'the state a replay assumes changed'"]
        exec(compile("\n".join(lines), "<torch_adreno step guard>", "exec"), self.namespace)
        guard: Guard = self.namespace["guard"]
        return guard


def _size_changed(expression: str, size: int) -> str:
    """A check that the container ``expression`` no longer holds ``size`` items; for an empty one
    (the usual hook table), its truth value, which costs no call."""
    return expression if size == 0 else f"len({expression}) != {size}"


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def build_guard(batch: tuple[Any, ...], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                persistent: Iterable[torch.Tensor], names: dict[int, str],
                inputs: Iterable[torch.Tensor] = ()) -> StepGuard:
    """The checks that a step's replay is valid for the next call (see the module docstring),
    taken from the state right after the captured step. ``inputs``: persistent tensors the replay
    uploads when their version moved (its scalar inputs): only their memory is watched."""
    w = _Writer()
    w.check(f"len(batch) != {len(batch)}", "the step got another number of batch arguments")
    for position, value in enumerate(batch):
        item = f"batch[{position}]"
        if isinstance(value, torch.Tensor):
            w.check(f"type({item}) is not {w.bind(type(value))} or {item}.dtype is not {w.bind(value.dtype)} "
                    f"or {item}.shape != {w.bind(value.shape)} or {item}.stride() != {value.stride()!r} "
                    f"or {item}.storage_offset() != {value.storage_offset()} or {item}.requires_grad",
                    f"batch argument {position} changed its shape, dtype or strides")
        else:
            w.check(f"type({item}) is not {w.bind(type(value))} or {item} != {w.bind(value)}",
                    f"batch argument {position} changed its value")
    # The compiled graphs take arguments that are one tensor (or views of one memory) as one input.
    w.check(f"{w.bind(shared_memory)}(batch) != {shared_memory(batch)!r}",
            "the batch arguments share memory otherwise than in the captured step (one tensor passed twice?)")
    w.check(f"{w.bind(torch.is_grad_enabled)}() is not {torch.is_grad_enabled()}", "grad mode changed")
    module_globals = torch.nn.modules.module
    for table in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                  "_global_backward_pre_hooks"):
        hooks = getattr(module_globals, table)
        w.check(_size_changed(w.bind(hooks), len(hooks)), "a global module hook was added or removed")
    for name, module in model.named_modules():
        label = name or "the model"
        prefix = f"{name}." if name else ""
        m = w.bind(module)
        w.check(f"{m}.training is not {module.training}", f"train/eval mode of {label} changed")
        w.check(" or ".join(_size_changed(f"{m}.{table}", len(getattr(module, table))) for table in _MODULE_HOOKS),
                f"a hook of {label} was added or removed")
        for child_name, child in module._modules.items():
            w.check(f"{m}._modules.get({child_name!r}) is not {w.bind(child)}",
                    f"submodule {prefix}{child_name} was replaced")
        for table in ("_parameters", "_buffers"):
            for key, tensor in getattr(module, table).items():
                w.check(f"{m}.{table}.get({key!r}) is not {w.bind(tensor)}",
                        f"{'parameter' if table == '_parameters' else 'buffer'} {prefix}{key} was replaced")
                if tensor is not None and table == "_parameters":
                    w.check(f"{w.bind(tensor)}.requires_grad is not {tensor.requires_grad}",
                            f"requires_grad of {prefix}{key} changed")
    for index, group in enumerate(optimizer.param_groups):
        for param in group["params"]:
            t = w.bind(param)
            name = names.get(id(param), f"a parameter of optimizer group {index}")
            w.check(f"{t}._backward_hooks or {t}._post_accumulate_grad_hooks",
                    f"a gradient hook was registered on {name}")
    # Read through the optimizer: load_state_dict gives it a new state dict and new groups. Once
    # their identities are the captured ones, the captured objects are read directly.
    opt = w.bind(optimizer)
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    step_hooks = [optimizer_module._global_optimizer_pre_hooks,
                  optimizer_module._global_optimizer_post_hooks]
    w.check(" or ".join([*(_size_changed(w.bind(hooks), len(hooks)) for hooks in step_hooks),
                         *(_size_changed(f"{opt}.{table}", len(getattr(optimizer, table)))
                           for table in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"))]),
            "an optimizer step hook was added (a replay would not run it)")
    w.check(f"len({opt}.param_groups) != {len(optimizer.param_groups)}", "the optimizer's parameter groups changed")
    for index, group in enumerate(optimizer.param_groups):
        w.check(f"{opt}.param_groups[{index}] is not {w.bind(group)}",
                f"optimizer parameter group {index} was replaced (load_state_dict?)")
    for index, group in enumerate(optimizer.param_groups):
        g = w.bind(group)
        w.check(f"len({g}) != {len(group)}", f"optimizer parameter group {index} changed its keys")
        for key, value in group.items():
            if key == "params":
                w.check_identities(f"{g}['params']", value, f"the parameters of optimizer group {index} changed")
            elif isinstance(value, torch.Tensor):
                w.check_value(f"{g}[{key!r}]", value, f"optimizer hyperparameter {key!r} of group {index} was replaced")
            else:
                w.check_value(f"{g}[{key!r}]", value,
                              f"optimizer hyperparameter {key!r} of group {index} changed (a new learning rate?)")
    state = f"{opt}.state"
    w.check(f"len({state}) != {len(optimizer.state)}", "the optimizer's state changed")
    for param, entries in optimizer.state.items():
        # Only in explain's messages: looking a parameter up hashes it (a Python call per tensor);
        # the guard compares keys and values by iteration below.
        owner = names.get(id(param), "a parameter")
        w.check(f"{state}.get({w.bind(param)}) is not {w.bind(entries)}",
                f"the optimizer state of {owner} was replaced (load_state_dict?)", explain_only=True)
    w.check_identities(state, optimizer.state.keys(), "the optimizer's state changed")
    w.check_identities(f"{state}.values()", optimizer.state.values(),
                       "the optimizer's state was replaced (load_state_dict?)")
    for param, entries in optimizer.state.items():
        s = w.bind(entries)
        owner = names.get(id(param), "a parameter")
        w.check(f"len({s}) != {len(entries)}", f"the optimizer state of {owner} changed its keys")
        for key, value in entries.items():
            verb = "was replaced" if isinstance(value, torch.Tensor) else "changed"
            w.check_value(f"{s}[{key!r}]", value, f"optimizer state {key!r} of {owner} {verb}")
    uploaded = {id(t) for t in inputs}
    # Versions are read from a list the guard owns: a step of this TrainingStep that wrote a tensor
    # (another batch geometry's, through the compiled graphs) moves the expected version with it.
    book = VersionBook()
    for tensor in persistent:
        t = w.bind(tensor)
        name = names.get(id(tensor), "a tensor the step reads")
        if id(tensor) in uploaded:
            w.check(f"{t}.data_ptr() != {tensor.data_ptr()}", f"{name} was given new memory on the host")
            continue
        slot = book.watch(tensor)
        w.check(f"{t}.data_ptr() != {tensor.data_ptr()} or {t}._version != {w.bind(book.expected)}[{slot}]",
                f"{name} was changed on the host")
    return StepGuard(w.build(), book)


class VersionBook:
    """The versions a guard expects of the host tensors it watches. Invariant: an expected version
    moves only with a write the step itself made (:meth:`accept_own_writes`), never with a host
    edit, which therefore keeps failing the guard until a step uploads it."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.expected: list[int] = []

    def watch(self, tensor: torch.Tensor) -> int:
        self.tensors.append(tensor)
        self.expected.append(int(tensor._version))
        return len(self.tensors) - 1

    def accept_own_writes(self, before: dict[int, int]) -> None:
        """A step of the owner ran (through its compiled graphs): ``before`` holds the versions
        taken just before it. A tensor the guard expected at that version and that the step moved
        holds what the device holds: its new version is expected."""
        for slot, tensor in enumerate(self.tensors):
            was = before.get(id(tensor))
            if was is not None and self.expected[slot] == was and tensor._version != was:
                self.expected[slot] = int(tensor._version)


class StepGuard:
    """A replay's guard (callable: ``guard(batch)`` is None while the replay is valid, else the
    first reason it is not) and the versions it expects."""

    def __init__(self, check: Callable[[tuple[Any, ...]], str | None], book: VersionBook) -> None:
        self._check = check
        self.book = book

    def __call__(self, batch: tuple[Any, ...]) -> str | None:
        return self._check(batch)

