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
