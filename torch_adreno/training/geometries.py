"""A :class:`~torch_adreno.TrainingStep`'s replays, one per batch geometry, and the checks a step
makes of its model, optimizer and batch.

A geometry's first step compiles (and warms) the graphs; its second runs them under a recorder
and becomes a :class:`~torch_adreno.replay.step.ReplayedStep` with its guard; later steps
replay while the guard holds. Invariants: at most ``limit`` replays are kept (the oldest goes
first); a geometry whose capture could not be replayed is never captured again, and its reason is
kept; a replay whose guard fails is dropped (the step runs the compiled graphs and captures again).
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from torch_adreno.replay import guards
from torch_adreno.replay.capture import StepRecorder
from torch_adreno.replay.step import CaptureError, ReplayedStep, ReplayOptions
from torch_adreno.runtime import host_writes
from torch_adreno.runtime.residency import Residency
from torch_adreno.training.gradients import GradientOnDevice

_log = logging.getLogger("torch_adreno")

Replay = tuple[ReplayedStep, guards.StepGuard]


class Replays:
    """The replays of one step by batch signature (see the module docstring)."""

    def __init__(self, limit: int, refused: str | None = None) -> None:
        """``refused``: why no geometry of this step is captured at all (reported by :attr:`reasons`)."""
        self._limit = limit
        self._replays: OrderedDict[Hashable, Replay] = OrderedDict()
        # Batch geometries that completed a step through the compiled graphs (compiled and warm).
        self._warm: set[Hashable] = set()
        # Batch geometries whose capture cannot be replayed, with the reason.
        self._unreplayable: dict[Hashable, str] = {} if refused is None else {None: refused}

    def __bool__(self) -> bool:
        return bool(self._replays)

    def values(self) -> list[Replay]:
        """The replays kept and their guards, oldest first."""
        return list(self._replays.values())

    @property
    def latest(self) -> ReplayedStep | None:
        """The replay of the geometry captured last (None before any was captured)."""
        return next(reversed(self._replays.values()))[0] if self._replays else None

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(self._unreplayable.values())

    def should_capture(self, signature: Hashable) -> bool:
        return signature in self._warm and signature not in self._unreplayable

    def is_warm(self, signature: Hashable) -> bool:
        """Whether a call with ``signature`` completed through the compiled graphs before."""
        return signature in self._warm

    def warm(self, signature: Hashable) -> None:
        self._warm.add(signature)

    def unreplayable(self, signature: Hashable) -> str | None:
        return self._unreplayable.get(signature)

    def refuse(self, signature: Hashable, reason: str) -> None:
        """Never capture ``signature``: its step cannot be replayed, for ``reason``."""
        self._unreplayable.setdefault(signature, reason)

    def add(self, signature: Hashable, build: Callable[[], Replay]) -> str | None:
        """Keep the replay ``build`` makes for ``signature``; if the capture cannot be replayed,
        remember why and return the reason."""
        try:
            self._replays[signature] = build()
        except CaptureError as err:
            reason = f"its capture cannot be replayed: {err}"
            self._unreplayable[signature] = reason
            _log.warning("TrainingStep: this step is not replayed: %s", err)
            return reason
        finally:
            while len(self._replays) > self._limit:
                self._replays.popitem(last=False)
        return None

    def watched_versions(self) -> dict[int, int]:
        """The current version of every host tensor a kept replay's guard watches, by ``id``."""
        return {id(t): int(t._version) for _, guard in self._replays.values() for t in guard.book.tensors}

    def accept_own_writes(self, before: dict[int, int], only: Hashable | None = None) -> None:
        """A step ran through the compiled graphs (``before``: :meth:`watched_versions` just before
        it): the kept replays expect the versions its writes gave (their tensors' device copies
        hold those values); host edits made before it still fail their guards. ``only``: the
        replay of that signature alone (the one whose device holds the values written)."""
        for signature, (_, guard) in self._replays.items():
            if only is None or signature == only:
                guard.book.accept_own_writes(before)

    def guard_reason(self, signature: Hashable, batch: tuple[Any, ...]) -> str | None:
        """Why the replay of ``signature`` cannot serve ``batch`` (None: it can); a replay that is
        not kept cannot."""
        entry = self._replays.get(signature)
        return "no replay of this batch geometry" if entry is None else entry[1](batch)

    def clear(self) -> None:
        """Drop every replay (the geometries are captured again, from the host's state)."""
        self._replays.clear()

    def valid_for(self, batch: tuple[Any, ...], signature: Hashable) -> tuple[ReplayedStep | None, str | None]:
        """The replay of ``signature`` (``batch``'s geometry, and what else keys a call) if its
        guard holds; else None and why (a replay whose guard failed is dropped; None, None: no
        replay of that signature)."""
        entry = self._replays.get(signature)
        if entry is None:
            return None, None
        replay, guard = entry
        replay.batch_input.prestage(batch)  # a large batch is copied into place while the guard runs
        # The guard holds what check_can_step checks (the batch needs no grad, no gradient hooks).
        try:
            reason = guard(batch)
        except BaseException:
            replay.batch_input.settle()
            raise
        if reason is not None:
            replay.batch_input.settle()
            del self._replays[signature]
            _log.info("TrainingStep: not replayed because %s; running the compiled graphs and capturing again", reason)
            return None, reason
        return replay, None


def build_replay(recorder: StepRecorder, loss: torch.Tensor, batch: tuple[Any, ...], model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, residency: Residency, heap_group: Hashable,
                 options: ReplayOptions) -> Replay:
    """The replay of a recorded step and the guard of what it assumes; :class:`CaptureError` where
    the step cannot be replayed."""
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    hooks = [*optimizer_module._global_optimizer_pre_hooks.values(),
             *optimizer_module._global_optimizer_post_hooks.values(),
             *optimizer._optimizer_step_pre_hooks.values(), *optimizer._optimizer_step_post_hooks.values()]
    hooks = [hook for hook in hooks if not host_writes.is_own_hook(hook)]
    if hooks:
        raise CaptureError("the optimizer has step hooks, which run Python code in every step")
    # Tensor hyperparameters (learning rates, betas) are the step's scalar inputs: a new value is
    # uploaded by the replay, not a reason to capture again.
    inputs = [t for t, place in guards.state_tensors(model, optimizer) if place[0] == "group"]
    replay = ReplayedStep(recorder, loss, residency, heap_group=heap_group, options=options, inputs=inputs)
    names = guards.tensor_names(model, optimizer)
    # The tensors its kernels read, and the frozen parameters they read 16-bit copies of.
    return replay, guards.build_guard(batch, model, optimizer, recorder.watched_tensors(), names,
                                      inputs=replay.scalar_inputs)


def check_can_step(params: Sequence[torch.nn.Parameter], batch: tuple[Any, ...]) -> None:
    """What a step needs of its parameters and batch, checked before it runs."""
    if any(p.grad is not None and type(p.grad) is not GradientOnDevice for p in params):
        raise ValueError(
            "TrainingStep computes and clears the gradients itself, but some parameters already have a "
            ".grad: call optimizer.zero_grad(set_to_none=True) before the first step, and do not call "
            "backward() on the model outside the step"
        )
    if any(p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) for p in params):
        raise ValueError("TrainingStep keeps gradients on the device, where parameter hooks cannot see them: "
                         "remove the gradient hooks of the parameters")
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in batch):
        raise ValueError("TrainingStep takes batches that do not require gradients (only parameters get them)")


def check_can_train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """What a step needs of its model and optimizer, checked when it is made."""
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    outside = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in in_optimizer]
    if outside:
        raise ValueError(f"TrainingStep needs every parameter that requires grad in the optimizer (their "
                         f"gradients stay on the device); not in it: {', '.join(outside[:5])}. Freeze them "
                         "with requires_grad_(False) or add them to the optimizer")
