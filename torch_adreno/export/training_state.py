"""The training state in an exported step's files: the names an export gives it, and loading the
state a run wrote (the Python runner's ``.npz`` or ``.onnx``, the native runtime's
``.safetensors``) back into a PyTorch module and optimizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from torch_adreno.replay.guards import state_tensors

__all__ = ["load_state", "reset_state", "state_names"]


def state_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """ONNX input names of the step's persistent tensors, by ``id``: ``state_dict`` names for the
    model's, ``optimizer.<parameter>.<key>`` for optimizer state, ``lr`` for a tensor learning rate."""
    names: dict[int, str] = {}
    single_group = len(optimizer.param_groups) == 1
    for tensor, place in state_tensors(model, optimizer):
        if place[0] == "module":
            name = place[1]
        elif place[0] == "group":
            name = "lr" if single_group and place[2] == "lr" else f"optimizer.group{place[1]}.{place[2]}"
        else:
            name = f"optimizer.{names.get(id(place[1]), 'parameter')}.{place[2]}"
        names.setdefault(id(tensor), name)
    return names


def load_state(module: torch.nn.Module, path: str | Path, optimizer: torch.optim.Optimizer | None = None) -> list[str]:
    """Load the state a run of :mod:`torch_adreno.runner` (``.npz`` or ``.onnx``) or of the native
    runtime, ``torch-adreno-step`` (``.safetensors``), wrote into
    ``module``, and into ``optimizer`` its state (``optimizer.*``, ``lr``: by the names the export
    gave them; without ``optimizer`` those are not loaded). Returns the names loaded; a name of the
    file that neither has is an error, as is a parameter of the module the file lacks."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as archive:
            arrays = {k: archive[k] for k in archive.files}
    elif path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
    else:
        model = onnx.load(str(path))
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    arrays = {k: v for k, v in arrays.items() if not k.startswith("captured.")}
    if optimizer is None:
        arrays = {k: v for k, v in arrays.items() if not (k == "lr" or k.startswith(("optimizer.", "lr.")))}
    targets: dict[str, torch.Tensor] = dict(module.state_dict(keep_vars=True))
    if optimizer is not None:
        ids = state_names(module, optimizer)
        tensors = {id(v): v for group in optimizer.param_groups for v in group.values() if isinstance(v, torch.Tensor)}
        tensors.update({id(v): v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)})
        targets.update({ids[i]: t for i, t in tensors.items() if i in ids})
        # State an optimizer makes at its first step (momentum, Adam's moments) is made here.
        params = dict(module.named_parameters())
        for name, array in arrays.items():
            owner, _, key = name.removeprefix("optimizer.").rpartition(".")
            if name.startswith("optimizer.") and name not in targets and owner in params:
                tensor = torch.zeros(array.shape, dtype=torch.from_numpy(np.asarray(array).reshape(-1)[:0].copy()).dtype)
                optimizer.state[params[owner]][key] = targets[name] = tensor
        # Hyperparameters the file holds as tensors (a TrainingStep reads learning rates and betas
        # as inputs) that this optimizer holds as numbers: set as numbers.
        for name in [n for n in arrays if n not in targets]:
            place = _group_hyperparameter(name, len(optimizer.param_groups))
            if place is not None:
                _set_group_number(optimizer.param_groups[place[0]], place[1], place[2], arrays.pop(name))
    unknown = sorted(set(arrays) - set(targets))
    if unknown:
        raise KeyError(f"{path} holds state this model/optimizer has not: {', '.join(unknown[:5])}"
                       + ("" if optimizer is not None else " (pass the optimizer to load its state)"))
    missing = sorted(n for n, _ in module.named_parameters() if n not in arrays)
    if missing:
        raise KeyError(f"{path} lacks parameters of the model: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, array in arrays.items():
            target = targets[name]
            if tuple(target.shape) != array.shape:
                raise ValueError(f"{name}: {path} holds shape {list(array.shape)}, the model {list(target.shape)}")
            target.copy_(torch.from_numpy(np.array(array)))  # (ascontiguousarray makes 0-d arrays 1-d)
    return sorted(arrays)


def _group_hyperparameter(name: str, groups: int) -> tuple[int, str, int | None] | None:
    """(group, key, position in a tuple or None) of an export's hyperparameter name (``lr``,
    ``optimizer.group1.lr``, ``optimizer.group0.betas.1``); None for any other name."""
    if name == "lr":
        return (0, "lr", None) if groups == 1 else None
    parts = name.split(".")
    if len(parts) in (3, 4) and parts[0] == "optimizer" and parts[1].startswith("group") and parts[1][5:].isdigit():
        index = int(parts[1][5:])
        if index < groups:
            return index, parts[2], int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None
    return None


def _set_group_number(group: dict[str, Any], key: str, position: int | None, array: np.ndarray) -> None:
    value = float(np.asarray(array).reshape(-1)[0])
    if key not in group:
        raise KeyError(f"the optimizer has no hyperparameter {key!r} to load")
    if position is None:
        group[key] = value
        return
    current = list(group[key])
    current[position] = value
    group[key] = tuple(current)


def reset_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, initial: dict[str, torch.Tensor]) -> None:
    """Put the model's state back to ``initial`` (a ``state_dict`` copy) and zero the optimizer's
    state tensors: the state before a first step, for optimizers whose first step from zeroed state
    is their first step (SGD with momentum, Adam)."""
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            tensor.copy_(initial[name])
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
