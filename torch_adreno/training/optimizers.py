"""The optimizers the package's own tools build by name (the command line, the benchmarks, the
ONNX export of a reference model, the Flower client).

A :class:`~torch_adreno.TrainingStep` takes any ``torch.optim.Optimizer`` the user made: what it
compiles is the optimizer's own ``step()``, traced like the rest of the step. This table only
gives the tools one place that says which optimizers they offer and how each is configured, so
that a new one is added here and every tool offers it (``--optimizer`` choices come from
:data:`OPTIMIZERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OptimizerSpec:
    """One named optimizer: what it is (``description``, for help texts), the learning rate the
    tools use when none is given, and how to make it (keyword ``overrides`` replace its
    hyperparameters, e.g. ``momentum=0.0``)."""

    name: str
    description: str
    default_lr: float
    make: Callable[..., torch.optim.Optimizer]
    hyperparameters: tuple[tuple[str, Any], ...] = ()


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "sgd": OptimizerSpec("sgd", "SGD with momentum 0.9", 0.01, torch.optim.SGD, (("momentum", 0.9),)),
    "adam": OptimizerSpec("adam", "Adam", 1e-3, torch.optim.Adam),
}


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float | torch.Tensor | None = None,
                   **overrides: Any) -> torch.optim.Optimizer:
    """Optimizer ``name`` of :data:`OPTIMIZERS` over ``params`` (``lr``: its default when None; a
    tensor learning rate is an input of a captured step). An unknown name is a ``ValueError``
    naming the known ones."""
    spec = OPTIMIZERS.get(name)
    if spec is None:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    return spec.make(params, lr=spec.default_lr if lr is None else lr, **{**dict(spec.hyperparameters), **overrides})


def describe_optimizers() -> str:
    """``name: description`` of every optimizer, for help texts."""
    return "; ".join(f"{s.name}: {s.description}" for s in OPTIMIZERS.values())


class MultiTensorPreference:
    """``foreach=True`` set in the parameter groups of an optimizer that leave it unset (``None``),
    are not ``fused`` or ``differentiable`` and hold no tensor hyperparameter (a tensor ``lr``
    needs the per-tensor step unless ``capturable``); :meth:`remove` sets them back.

    Unset, PyTorch picks the per-tensor implementation for the host tensors a step's parameters
    are, and Dynamo traces its loop once per parameter: a 12-block GPT-2's 48 LoRA tensors take
    about 1 s more to trace than through the multi-tensor one, which PyTorch itself takes for
    tensors on a GPU. Both compile to the same kernels (the foreach ops are decomposed per tensor,
    then grouped into one launch), and for SGD, Adam, AdamW, RMSprop and Adagrad they are bitwise
    the same update (the same ops in the same order).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.groups = [group for group in optimizer.param_groups
                       if "foreach" in group and group["foreach"] is None and not group.get("fused")
                       and not group.get("differentiable")
                       and not any(isinstance(v, torch.Tensor) for k, v in group.items() if k != "params")]
        for group in self.groups:
            group["foreach"] = True

    def remove(self) -> None:
        """The optimizer as it was given (the groups' ``foreach`` unset again)."""
        for group in self.groups:
            group["foreach"] = None
        self.groups = []
