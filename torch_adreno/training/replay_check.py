"""Option ``verify_replay=N``: a TrainingStep's first N replayed steps also run as captured, and
must agree bit for bit.

For each: the state the step updates (device bytes) and the random generator are saved; the
replay runs and its loss and updated state are read; the state is put back and the same step runs
through the compiled graphs (Dynamo, AOTAutograd and autograd: what the capture recorded), whose
loss and state are read in turn. Where they differ, the replay is checked operation by operation
against its reference (:func:`torch_adreno.replay.verify.first_difference`) and a
:class:`~torch_adreno.errors.ReplayMismatchError` names the first kernel whose output differs; if
every operation agrees, the recording itself lacks work the compiled graphs do (work on the host
between graphs), and the error names the tensors that differ. The step continues from the
compiled graphs' results either way, so checking never changes what it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from torch_adreno.errors import ReplayMismatchError
from torch_adreno.replay.step import ReplayedStep, ReplayOptions
from torch_adreno.replay.verify import StateBackup, first_difference


def reference_options(options: ReplayOptions) -> ReplayOptions:
    """The plainest replay of a recording: memory of its own for every identity, kernels as
    compiled, no merged copies (the reference a replay is checked against)."""
    return ReplayOptions(arena_kernels=False, merge_copies=False, verify_memory=False, limits=options.limits,
                         share_memory=False, fill_uninitialized_memory=options.fill_uninitialized_memory)


class ReplayCheck:
    """The checks still to run (see the module docstring) and each replay's reference."""

    def __init__(self, steps: int) -> None:
        #: Replayed steps still to check.
        self.remaining = steps
        #: Replayed steps checked so far.
        self.checked = 0
        self._references: dict[int, ReplayedStep] = {}
        self._backup: StateBackup | None = None

    def add_reference(self, replay: ReplayedStep, reference: ReplayedStep) -> None:
        self._references[id(replay)] = reference

    def before(self, replay: ReplayedStep) -> None:
        """A replay is about to run: save what it updates, if it is to be checked."""
        self._backup = StateBackup(replay) if self.remaining > 0 and id(replay) in self._references else None

    def after(self, replay: ReplayedStep, batch: tuple[Any, ...], loss: torch.Tensor,
              compiled_step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The replay ran on ``batch`` and gave ``loss``: run ``compiled_step`` from the same state
        and compare (a no-op where :meth:`before` saved nothing). Returns the loss to report."""
        backup, self._backup = self._backup, None
        if backup is None:
            return loss
        self.remaining -= 1
        self.checked += 1
        updated = replay.recording.updated
        replayed = {index: replay.identity_bytes(index) for index in updated}
        backup.restore()
        expected = compiled_step()
        compiled = {index: replay.identity_bytes(index) for index in updated}
        differing = [index for index in updated if not np.array_equal(replayed[index], compiled[index])]
        same_loss = loss.view(-1).view(torch.uint8).equal(expected.detach().reshape(-1).view(torch.uint8))
        if same_loss and not differing:
            return expected
        difference = None
        try:
            backup.restore()
            difference = first_difference(replay, self._references[id(replay)], batch)
        finally:
            for index, data in compiled.items():  # the compiled graphs' results, where the step goes on from
                replay.write_identity(index, data)
        what = [] if same_loss else [f"loss {float(loss)!r} against {float(expected)!r}"]
        what += [replay.recording.identities[index].label for index in differing[:5]]
        more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
        where = (f"the first kernel whose output differs from its reference: {difference}" if difference is not None
                 else "every recorded operation agrees with its reference, so the recording lacks work the compiled "
                      "graphs do (work done on the host between graphs)")
        raise ReplayMismatchError(
            f"replayed step {self.checked} differs from the same step run through the compiled graphs "
            f"({', '.join(what)}{more}); {where}. Run without replay (TrainingStep(..., replay=False)) until this "
            "is fixed, and please report it with this message")
