"""A :class:`~torch_adreno.TrainingStep`'s call through the compiled graphs (Dynamo, AOTAutograd,
autograd): what a step needs, checked before it runs, and the run itself in the step's context.

Invariants: no call starts without :func:`~torch_adreno.training.geometries.check_can_step`'s checks
and the state's memory check; host_sync's mode is off the stack while the compiled code runs and
back on where host copies are left out of date; the gradients' host copies are marked as never
filled in after every call, and a failed call leaves the deferred records as the host left them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from torch_adreno.replay.capture import StepRecorder
from torch_adreno.runtime.residency import Residency, StepContext
from torch_adreno.training import host_sync
from torch_adreno.training.batch_check import BatchHistory
from torch_adreno.training.compiled_step import CompiledStep
from torch_adreno.training.geometries import check_can_step
from torch_adreno.training.gradients import GradientMarkers
from torch_adreno.training.hyperparameters import StepHyperparameters
from torch_adreno.training.memory_limits import StepMemory
from torch_adreno.training.state import REMEMBERED_SIGNATURES, batch_shapes


class FullPath:
    """The checked call through ``compiled`` (see the module docstring)."""

    def __init__(self, compiled: CompiledStep, residency: Residency, context: StepContext, gradients: GradientMarkers,
                 hyperparameters: StepHyperparameters, memory: StepMemory, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                 name_of: Callable[[torch.Tensor], str | None]) -> None:
        self._compiled, self._residency, self._context = compiled, residency, context
        self._gradients, self._hyperparameters, self._memory = gradients, hyperparameters, memory
        self._model, self._optimizer, self._params, self._name_of = model, optimizer, params, name_of
        #: The batch geometries seen, in order (for the message of a recompile limit).
        self.batch_shapes: dict[Hashable, None] = {}
        # The last batch a step ran with, to explain a failing one.
        self._history = BatchHistory()

    def check(self, batch: tuple[Any, ...]) -> None:
        """What a step needs (the caller refused a closed step already), checked before it runs;
        host_sync's mode is off the stack afterwards, or back on if the checks failed."""
        host_sync.suspend(self._residency)  # the step's compiled code must not trace it
        try:
            check_can_step(self._params, batch)
            self._memory.check_state(self._model, self._optimizer, self._name_of)
        except BaseException:
            if self._residency.deferred_tensors:  # no step ran: host copies still out of date
                host_sync.arm(self._residency)
            raise
        signature = batch_shapes(batch)
        if signature not in self.batch_shapes and len(self.batch_shapes) < REMEMBERED_SIGNATURES:
            self.batch_shapes[signature] = None

    def run(self, batch: tuple[Any, ...], recorder: StepRecorder | None) -> torch.Tensor:
        """The step through the compiled graphs, recorded when ``recorder`` is given (checked first)."""
        self._gradients.clear()  # left by the previous step
        versions_before = self._residency.deferred_versions()
        try:
            with self._history.explaining(batch):  # errors the user can fix, said short
                return self._compiled.run(batch, self._residency, self._context, recorder,
                                          list(self.batch_shapes), self._hyperparameters.changes)
        except BaseException:
            # Only this step ran since the records were made: its version bumps are not host edits.
            self._residency.accept_versions(versions_before)
            raise
        finally:
            # The gradients' host copies were never filled in: nobody may read them.
            self._gradients.mark()
            if self._residency.deferred_tensors:
                host_sync.arm(self._residency)  # the first read of an out-of-date host copy synchronizes
