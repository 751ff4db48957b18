"""What a replayed training step assumes, checked before every replay (the guards).

A :class:`~torch_adreno.runtime.replay.ReplayedStep` runs the kernels one full step enqueued,
bound to the buffers that step used. That is right only while everything the compiled graphs
took as given at capture still holds. :func:`build_guard` writes those facts down as one Python
function (generated source, one flat sequence of comparisons: about 0.1 us a check) that returns
``None`` when a replay is valid and otherwise the first fact that changed, in words:

- the batch: number of arguments, each tensor's type, shape, strides, storage offset, dtype and
  ``requires_grad``; each other argument's value;
- grad mode and the train/eval mode (and forward-hook count) of every submodule;
- every parameter and buffer is still the same tensor object in its module, with the same
  ``requires_grad``; the optimizer's groups hold the same parameters with the same hyperparameters
  (lr, momentum, betas, weight decay, ...: anything but the parameter list), and its state the
  same tensors under the same keys (non-tensor state by value);
- every host tensor the step's kernels read in place or from a device copy (parameters, buffers,
  optimizer state, tensor hyperparameters, tensors the loss function captured) has the version
  and memory address it had at capture: a host edit, ``load_state_dict`` or ``.data`` swap fails
  the guard, and the step then runs the full path (which uploads the change) and captures again.

:func:`describe_persistent` names every such tensor for messages and refuses a capture that bound
a host tensor the guards could not watch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from torch_adreno.runtime.capture import MemoryIdentity

Guard = Callable[[tuple[Any, ...]], "str | None"]


def batch_signature(batch: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A hashable key for the geometry of a batch, or None if an argument cannot be keyed."""
    parts: list[Any] = []
    for value in batch:
        if isinstance(value, torch.Tensor):
            parts.append((type(value), value.dtype, tuple(value.shape), value.stride(), value.storage_offset()))
        else:
            try:
                hash(value)
            except TypeError:
                return None
            parts.append((type(value), value))
    return tuple(parts)


def tensor_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """Readable names of the model's and optimizer's tensors, by ``id``."""
    names: dict[int, str] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        names.setdefault(id(tensor), name)
    for index, group in enumerate(optimizer.param_groups):
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                names.setdefault(id(value), f"optimizer.param_groups[{index}][{key!r}]")
    for param, state in optimizer.state.items():
        owner = names.get(id(param), "a parameter")
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                names.setdefault(id(value), f"optimizer state {key!r} of {owner}")
    return names


def describe_persistent(identities: Iterable[MemoryIdentity], names: dict[int, str]) -> dict[int, str]:
    """Names of the persistent tensors a recording bound (tensors a loss function captured get
    their graph input's name)."""
    return {id(i.tensor): names.get(id(i.tensor), f"the tensor bound to {i.label}")
            for i in identities if i.tensor is not None}


class _Writer:
    """The guard function's source, one check at a time, with the objects it compares against."""

    def __init__(self) -> None:
        self.lines: list[str] = ["def explain(batch):"]
        self.failing: list[str] = []
        self.namespace: dict[str, Any] = {}

    def bind(self, value: Any) -> str:
        name = f"v{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def check(self, failing: str, reason: str) -> None:
        self.failing.append(f"({failing})")
        self.lines.append(f"    if {failing}:")
        self.lines.append(f"        return {reason!r}")

    def build(self) -> Guard:
        """Two functions: one expression of every check (the common case: all hold), and, when
        one fails, the checks one by one to say which."""
        self.lines.append("    return None")
        self.lines.append("def guard(batch):")
        self.lines.append(f"    if {' or '.join(self.failing) or 'False'}:")
        self.lines.append("        return explain(batch)")
        self.lines.append("    return None")
        exec(compile("\n".join(self.lines), "<torch_adreno step guard>", "exec"), self.namespace)
        guard: Guard = self.namespace["guard"]
        return guard


def build_guard(batch: tuple[Any, ...], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                persistent: Iterable[torch.Tensor], names: dict[int, str]) -> Guard:
    """The checks that a step's replay is valid for the next call (see the module docstring),
    taken from the state right after the captured step."""
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
    w.check(f"{w.bind(torch.is_grad_enabled)}() is not {torch.is_grad_enabled()}", "grad mode changed")
    hooks = torch.nn.modules.module._global_forward_hooks
    w.check(f"len({w.bind(hooks)}) != {len(hooks)}", "a global forward hook was added or removed")
    for name, module in model.named_modules():
        label = name or "the model"
        prefix = f"{name}." if name else ""
        m = w.bind(module)
        w.check(f"{m}.training is not {module.training}", f"train/eval mode of {label} changed")
        w.check(f"len({m}._forward_hooks) != {len(module._forward_hooks)} or "
                f"len({m}._forward_pre_hooks) != {len(module._forward_pre_hooks)}",
                f"a forward hook of {label} was added or removed")
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
    # Read through the optimizer each time: load_state_dict gives it a new state dict and new groups.
    opt = w.bind(optimizer)
    w.check(f"len({opt}.param_groups) != {len(optimizer.param_groups)}", "the optimizer's parameter groups changed")
    for index, group in enumerate(optimizer.param_groups):
        g = f"{opt}.param_groups[{index}]"
        w.check(f"{g} is not {w.bind(group)}", f"optimizer parameter group {index} was replaced (load_state_dict?)")
        w.check(f"len({g}) != {len(group)}", f"optimizer parameter group {index} changed its keys")
        for key, value in group.items():
            if key == "params":
                params = w.bind(list(value))
                w.check(f"len({g}['params']) != {len(value)} or any(a is not b for a, b in zip({g}['params'], {params}))",
                        f"the parameters of optimizer group {index} changed")
            elif isinstance(value, torch.Tensor):
                w.check(f"{g}.get({key!r}) is not {w.bind(value)}",
                        f"optimizer hyperparameter {key!r} of group {index} was replaced")
            else:
                w.check(f"{g}.get({key!r}) != {w.bind(value)}",
                        f"optimizer hyperparameter {key!r} of group {index} changed (a new learning rate?)")
    state = f"{opt}.state"
    w.check(f"len({state}) != {len(optimizer.state)}", "the optimizer's state changed")
    for param, entries in optimizer.state.items():
        s = w.bind(entries)
        owner = names.get(id(param), "a parameter")
        w.check(f"{state}.get({w.bind(param)}) is not {s} or len({s}) != {len(entries)}",
                f"the optimizer state of {owner} was replaced (load_state_dict?)")
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                w.check(f"{s}.get({key!r}) is not {w.bind(value)}",
                        f"optimizer state {key!r} of {owner} was replaced")
            else:
                w.check(f"{s}.get({key!r}) != {w.bind(value)}", f"optimizer state {key!r} of {owner} changed")
    for tensor in persistent:
        t = w.bind(tensor)
        w.check(f"{t}._version != {tensor._version} or {t}.data_ptr() != {tensor.data_ptr()}",
                f"{names.get(id(tensor), 'a tensor the step reads')} was changed on the host")
    return w.build()
