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



def _is_data_dependent(err: BaseException) -> bool:
    """Whether Dynamo stopped on a shape or a loop count that depends on tensor values: a guard on
    an unbacked size (a UserError) or, under ``fullgraph``, the graph break of an op whose output
    shape does (Unsupported)."""
    text = str(err)
    return isinstance(err, torch._dynamo.exc.UserError | torch._dynamo.exc.Unsupported) and (
        "data-dependent" in text or "Dynamic shape operator" in text)


def _where(err: BaseException) -> str:
    """The innermost user frame Dynamo was tracing when it stopped: 'file:line: code'."""
    stack = getattr(err, "real_stack", None)
    if not stack:
        return ""
    frame = stack[-1]
    return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"


def _eager_experts(model: torch.nn.Module) -> list[str]:
    """Modules of ``model`` running transformers' loop over experts (``experts_implementation``
    "eager"): recognised by the attributes transformers' ``use_experts_implementation`` gives them."""
    return [name for name, module in model.named_modules()
            if hasattr(module, "_is_expert_parallel")
            and getattr(getattr(module, "config", None), "_experts_implementation", None) == "eager"]


def graph_break_advice(model: torch.nn.Module) -> str | None:
    """How to make a loss of ``model`` one graph again, where a known cause of its break is found
    (transformers' "eager" experts loop); None where none is."""
    experts = _eager_experts(model)
    if not experts:
        return None
    shown = ", ".join(experts[:3]) + (", ..." if len(experts) > 3 else "")
    return (f"{shown} run transformers' experts_implementation='eager' (a shape per step): "
            "model.set_experts_implementation('grouped_mm') is one graph and replays")


def data_dependent_loss_error(err: BaseException, model: torch.nn.Module) -> Exception | None:
    """A clear error for a loss Dynamo cannot trace into one graph because a shape or a loop count
    depends on tensor values (``nonzero``, ``torch.where(mask)``, a loop over a tensor's entries),
    with what to do; None for other errors."""
    from torch_adreno.errors import UnsupportedOpError

    if not _is_data_dependent(err):
        return None
    where = _where(err)
    # (Dynamo's own advice, to annotate with torch._check, cannot give a value a static size)
    reason = str(err).strip().splitlines()[0].replace("Consider annotating your code using torch._check*(). ", "")
    head = (f"TrainingStep: the loss does not compile into one graph of static shapes, a loop count or a shape "
            f"depends on tensor values ({reason.strip()})" + (f"\n  from your code: {where}" if where else "") + "\n")
    experts = _eager_experts(model)
    if experts:
        shown = ", ".join(experts[:3]) + (", ..." if len(experts) > 3 else "")
        return UnsupportedOpError(
            head + f"Cause: {shown} run transformers' experts_implementation='eager', which loops over the experts "
            "that received tokens and gathers each one's tokens with torch.where(mask): how many there are is a "
            "tensor value, a different shape at every step. How to proceed: use transformers' default grouped "
            "implementation, model.set_experts_implementation('grouped_mm') (or from_pretrained(..., "
            "experts_implementation='grouped_mm')), or 'batched_mm': both have static shapes and run on the device")
    return UnsupportedOpError(
        head + "How to proceed: give the computation fixed sizes (a mask multiplied in instead of the elements it "
        "selects, padding to a bound), or compute such sizes outside the loss function")
