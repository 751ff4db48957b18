"""Finding the first operation where a replayed step departs from its recording.

The reference is the same recording replayed the plainest way: every identity made during the
step in memory of its own (no reuse a lifetime mistake could spoil), every kernel as compiled (no
arena rewrite), no merged copies (:class:`~torch_adreno.replay.step.ReplayOptions`). Both run one
operation at a time from the same state, batch and random seeds; after each recorded operation
the bytes it wrote are compared. The first that differ name the kernel (or copy), the FX nodes it
came from and the value written.

The two runs share the persistent tensors' device buffers (parameters, optimizer state): the
state the step updates is saved before and put back between runs and at the end, so checking
leaves the step where it found it. The random generator is rewound likewise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torch_adreno.replay.capture import RecordedCopy, RecordedLaunch, StepRecording
from torch_adreno.replay.step import ReplayedStep


@dataclass(frozen=True)
class Difference:
    """Where a replay first departs from its reference: the recorded operation (its position and
    description), the identity it wrote, and how the values differ."""

    position: int
    operation: str
    identity: str
    detail: str

    def __str__(self) -> str:
        return f"operation {self.position} ({self.operation}) wrote {self.identity}: {self.detail}"


def describe_operation(recording: StepRecording, position: int) -> str:
    """A recorded operation for messages: graph, kernel and the FX nodes it came from."""
    op = recording.operations[position]
    if isinstance(op, RecordedCopy):
        return (f"{op.graph} copy of {recording.identities[op.source].label} into "
                f"{recording.identities[op.destination].label}")
    nodes = ", ".join(op.source.fx_nodes[:6]) + (", ..." if len(op.source.fx_nodes) > 6 else "")
    return f"{op.graph} kernel {op.source.name} (FX nodes {nodes})" if nodes else f"{op.graph} kernel {op.source.name}"


def written_identities(recording: StepRecording, position: int) -> dict[int, int]:
    """The identities recorded operation ``position`` writes, each with the bytes of it the
    operation's graph uses (its buffer may be larger: a pool block, a slot)."""
    op = recording.operations[position]
    if isinstance(op, RecordedCopy):
        return {op.destination: op.nbytes}
    assert isinstance(op, RecordedLaunch)
    buffers = recording.programs[op.graph].graph.buffers
    written: dict[int, int] = {}
    for name, identity in zip(op.source.params, op.args, strict=True):
        if name in op.source.writes:
            nbytes = buffers[name].nbytes if name in buffers else recording.identities[identity].nbytes
            written[identity] = max(written.get(identity, 0), nbytes)
    return written


class StateBackup:
    """The bytes of the persistent identities a replay updates, saved and put back on the device."""

    def __init__(self, replay: ReplayedStep) -> None:
        self._replay = replay
        self._saved = {index: replay.identity_bytes(index) for index in replay.recording.updated}
        self._rng = torch.get_rng_state()

    def restore(self) -> None:
        for index, data in self._saved.items():
            self._replay.write_identity(index, data)
        torch.set_rng_state(self._rng)


def _run(replay: ReplayedStep, batch: tuple[Any, ...],
         visit: Callable[[int, int, np.ndarray], bool]) -> None:
    """Run ``replay`` stepwise; ``visit(position, identity, bytes)`` for each identity each
    recorded operation wrote, in order, until it returns False."""
    stopped = False

    def after(positions: tuple[int, ...]) -> None:
        nonlocal stopped
        for position in positions:
            for identity, nbytes in written_identities(replay.recording, position).items():
                if not stopped and not visit(position, identity, replay.identity_bytes(identity)[:nbytes]):
                    stopped = True

    replay.run_stepwise(batch, after)


def _detail(replay: ReplayedStep, identity: int, ours: np.ndarray, theirs: np.ndarray) -> str:
    """How the bytes differ: as floats where the identity's first reader or writer says float32."""
    differing = int(np.count_nonzero(ours != theirs))
    text = f"{differing} of {ours.size} bytes differ"
    if ours.size % 4 == 0 and ours.size:
        mine, reference = ours.view(np.float32), theirs.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            gap = np.abs(mine.astype(np.float64) - reference.astype(np.float64))
        at = int(np.nanargmax(gap)) if np.isfinite(gap).any() else 0
        text += (f"; read as float32, the largest difference is {float(gap[at]):.3g} at element {at} "
                 f"(replay {float(mine[at])!r}, reference {float(reference[at])!r})")
    return text


def first_difference(replay: ReplayedStep, reference: ReplayedStep, batch: tuple[Any, ...]) -> Difference | None:
    """The first recorded operation whose written bytes differ between ``replay`` and
    ``reference`` (built from the same recording) on ``batch``, from the state the device holds
    now; None if none do. The device state and the random generator are as before when it returns."""
    backup = StateBackup(replay)
    digests: list[tuple[int, int, bytes]] = []

    def record(position: int, identity: int, data: np.ndarray) -> bool:
        digests.append((position, identity, hashlib.sha1(data.tobytes()).digest()))
        return True

    try:
        _run(replay, batch, record)
        backup.restore()
        expected = iter(digests)
        found: list[tuple[int, int, np.ndarray]] = []

        def compare(position: int, identity: int, data: np.ndarray) -> bool:
            entry = next(expected, None)
            if entry is None or entry[:2] != (position, identity) or entry[2] != hashlib.sha1(data.tobytes()).digest():
                found.append((position, identity, data.copy()))
                return False
            return True

        _run(reference, batch, compare)
        if not found:
            return None
        position, identity, theirs = found[0]
        backup.restore()
        ours: list[np.ndarray] = []

        def fetch(at: int, written: int, data: np.ndarray) -> bool:
            if (at, written) == (position, identity):
                ours.append(data.copy())
                return False
            return True

        _run(replay, batch, fetch)
        label = replay.recording.identities[identity].label
        detail = _detail(replay, identity, ours[0], theirs) if ours else "the replay did not write it"
        return Difference(position, describe_operation(replay.recording, position), label, detail)
    finally:
        backup.restore()

