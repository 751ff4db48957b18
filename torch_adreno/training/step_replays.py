"""The replay side of a :class:`~torch_adreno.TrainingStep`: its replays (one per batch geometry,
:class:`~torch_adreno.training.geometries.Replays`), how a capture becomes one, how a call runs
one, and what is counted.

A call first asks :meth:`StepReplays.run` for the replay of its batch geometry; where there is
none (or its guard fails) the step runs the compiled graphs, recorded where the geometry is warm,
and :meth:`StepReplays.capture` turns the recording into a replay (or remembers why it cannot be
one). With option ``verify_replay`` each capture also gets a reference replay, and the first
replayed steps are checked against the compiled graphs (:mod:`.replay_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from torch_adreno.replay.capture import StepRecorder
from torch_adreno.replay.step import ReplayedStep, ReplayOptions
from torch_adreno.runtime.residency import Residency
from torch_adreno.training import host_sync
from torch_adreno.training.geometries import Replays, build_replay
from torch_adreno.training.gradients import GradientMarkers
from torch_adreno.training.replay_check import ReplayCheck, reference_options

#: Replays kept per TrainingStep, one per batch geometry (a partial last batch is a second one;
#: :class:`~torch_adreno.Buckets` makes a few lengths of many). Each holds its own step memory.
MAX_REPLAYS = 8


class StepReplays:
    """The replays of one TrainingStep and their counts (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, residency: Residency,
                 heap_group: Hashable, options: ReplayOptions, gradients: GradientMarkers,
                 refused: str | None, verify: int) -> None:
        """``refused``: why no call of the step can be replayed (None: calls can be); ``verify``:
        replayed steps to check against the compiled graphs (option ``verify_replay``)."""
        self._model, self._optimizer, self._residency = model, optimizer, residency
        self._heap_group = heap_group
        self._gradients = gradients
        #: How replays are built (from the step's options).
        self.options = options
        #: The replays kept, by signature.
        self.kept = Replays(MAX_REPLAYS, refused=refused)
        self._check = ReplayCheck(verify) if verify else None
        #: Calls that ran as a replay (no Dynamo, AOTAutograd or autograd).
        self.replayed_steps = 0
        #: Calls that captured a replay (one per batch geometry, more where a guard failed).
        self.captures = 0

    @property
    def verified(self) -> int:
        """Replayed steps checked against the compiled graphs so far."""
        return 0 if self._check is None else self._check.checked

    def run(self, batch: tuple[Any, ...], signature: Hashable | None,
            started: float) -> tuple[ReplayedStep | None, torch.Tensor | None, str | None]:
        """The step as the replay of ``signature``, if there is one and its guard holds: the replay
        and the loss; else Nones and the reason the guard gave (the replay is dropped; the caller
        runs the compiled graphs, which capture again). Called with torch functions disabled (the
        caller's host_sync mode would otherwise see every check)."""
        replay, reason = self.kept.valid_for(batch, signature)
        if replay is None:
            return None, None, reason
        if self._check is not None:
            self._check.before(replay)
        try:
            loss = replay(batch, started)
        finally:
            self._gradients.keep()  # (also when the replay raised)
            if self._residency.has_deferred:  # host reads of out-of-date copies synchronize first
                host_sync.arm(self._residency)
        self._optimizer._opt_called = True  # type: ignore[attr-defined]  # as optimizer.step() sets it
        self.replayed_steps += 1
        return replay, loss, None

    def checked(self, replay: ReplayedStep, batch: tuple[Any, ...], loss: torch.Tensor,
                compiled_step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """With ``verify_replay``, the replay that just ran checked against ``compiled_step`` (see
        :class:`ReplayCheck`); the loss to report."""
        return loss if self._check is None else self._check.after(replay, batch, loss, compiled_step)

    def capture(self, signature: Hashable, recorder: StepRecorder, loss: torch.Tensor,
                batch: tuple[Any, ...]) -> str | None:
        """Keep the replay of ``recorder``'s step for ``signature``; the reason where it cannot be one."""
        refused = self.kept.add(signature, lambda: self._build(recorder, loss, batch))
        self.captures += refused is None
        return refused

    def _build(self, recorder: StepRecorder, loss: torch.Tensor, batch: tuple[Any, ...]) -> Any:
        built = build_replay(recorder, loss, batch, self._model, self._optimizer, self._residency,
                             self._heap_group, self.options)
        if self._check is not None and self._check.remaining > 0:
            self._check.add_reference(built[0], ReplayedStep(
                recorder, loss, self._residency, heap_group=self._heap_group,
                options=reference_options(self.options), inputs=built[0].scalar_inputs))
        return built
