"""What a :class:`torch_adreno.TrainingStep` trains, in the user's words: names of its tensors and
the reasons a step stops.

Errors raised deep in the runtime know a tensor as a graph input (``primals_1 of forward_0``);
the user knows it as ``0.weight`` or ``state['exp_avg'] of 0.weight``. Names are looked up only
when an error is raised, so steps pay nothing for them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from torch_adreno.runtime.frozen import FROZEN_COPIES

#: How many distinct batch signatures a step remembers (enough to name the cause of a recompile limit).
REMEMBERED_SIGNATURES = 32


def name_of(tensor: torch.Tensor, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """``tensor``'s name as a parameter or buffer of ``model`` (``0.weight``), as optimizer state
    (``state['exp_avg'] of 0.weight``) or as the 16-bit copy of a frozen one (``0.weight as
    torch.bfloat16``, :mod:`torch_adreno.runtime.frozen`); None if it is none of these."""
    source = FROZEN_COPIES.source_of(tensor)
    if source is not None:
        source_name = name_of(source, model, optimizer)
        return f"{source_name} as {tensor.dtype}" if source_name is not None else None
    names: dict[int, str] = {}
    for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        if t is tensor:
            return name
        names.setdefault(id(t), name)
    for index, (p, state) in enumerate(optimizer.state.items()):
        for key, value in state.items():
            if value is tensor:
                owner = names.get(id(p), f"parameter {index} of the optimizer")
                return f"state[{key!r}] of {owner}"
    return None


def batch_shapes(batch: tuple[Any, ...]) -> Hashable:
    """What the compiled loss specializes on in a batch: each tensor's shape and dtype."""
    return tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in batch)


def _shapes(signature: Hashable) -> str:
    assert isinstance(signature, tuple)
    return "(" + ", ".join(f"[{', '.join(map(str, s[0]))}]" if isinstance(s, tuple) else s.__name__
                           for s in signature) + ")"


def recompile_limit_message(stage: str, signatures: list[Hashable], changes: list[str] | tuple[str, ...] = ()) -> str:
    """Why Dynamo reached its recompile limit in ``stage`` ("loss" or "optimizer step"), from what
    the step saw: the batches' shapes when they changed; for the optimizer, the settings compiled
    into the step that changed (``changes``, in words)."""
    prefix = (f"TrainingStep: Dynamo reached its recompile limit for the {stage}, and running it as host code "
              "would read gradients that are only on the device. ")
    if stage == "loss" and len(signatures) > 1:
        shown = ", ".join(_shapes(s) for s in signatures[:4]) + (", ..." if len(signatures) > 4 else "")
        return prefix + (
            f"Cause: the batches came in {len(signatures)} different shapes ({shown}), and the step is compiled "
            "for fixed shapes, once per shape. Give every step the same shapes: drop the last partial batch "
            "(DataLoader(..., drop_last=True)) or pad batches to one size (for sequences: a few fixed lengths)")
    if stage == "loss":
        return prefix + ("The batches kept their shapes, so something else the loss depends on changed from step "
                         "to step (a Python attribute or global it reads, train()/eval() toggled each step); "
                         "TORCH_LOGS=recompiles shows what")
    if changes:
        shown = "; ".join(changes[-3:]) + (f" (and {len(changes) - 3} earlier changes)" if len(changes) > 3 else "")
        return prefix + (f"Cause: optimizer settings compiled into the step kept changing ({shown}); each new value "
                         "is a new compilation. Keep them fixed: learning rates, betas, momentum, weight decay, eps "
                         "and the like are inputs of the step for torch.optim's optimizers, but booleans (nesterov, "
                         "amsgrad, maximize), whether a weight decay or momentum is zero, and numbers an optimizer of "
                         "another class reads (other than its lr) are compiled in")
    return prefix + ("The optimizer's settings did not change between calls; something else its step reads did "
                     "(TORCH_LOGS=recompiles shows what)")
