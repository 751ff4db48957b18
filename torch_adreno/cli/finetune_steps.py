"""What both ``finetune`` tasks do with a ``TrainingStep``: the backend options of the command
line, the loop of steps under a progress bar (tokens or images per second, the loss), and the
report of what the steps measured."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from torch_adreno.memory.footprint import DeviceFootprint
from torch_adreno.runtime.device import select_device
from torch_adreno.training.step import TrainingStep

#: Steps at the start that do not run the replay (the first compiles, the second captures it).
WARMUP_STEPS = 2

#: Steps averaged for the first and the last loss of the report.
LOSS_WINDOW = 5


def describe_device(settings: argparse.Namespace) -> str:
    """The device the steps run on, and the target they are compiled for."""
    device = select_device(settings.device).label
    return f"{device}, compiled for {settings.target}" if settings.target else device


@dataclass
class TrainingLog:
    """What a run of steps measured: each step's loss and seconds (the loss read included), and
    how many steps ran as a replay."""

    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    replayed: int = 0
    #: The replayed step's device memory (None: no replay was captured).
    footprint: DeviceFootprint | None = None
    #: Why steps were not replayed (TrainingStep.unreplayable_reasons).
    unreplayable: tuple[str, ...] = ()

    @property
    def first_loss(self) -> float:
        """Mean loss of the first :data:`LOSS_WINDOW` steps (of the first half, if fewer)."""
        return statistics.fmean(self.losses[:self._window])

    @property
    def last_loss(self) -> float:
        """Mean loss of the last :data:`LOSS_WINDOW` steps (of the last half, if fewer)."""
        return statistics.fmean(self.losses[-self._window:])

    @property
    def _window(self) -> int:
        return max(1, min(LOSS_WINDOW, len(self.losses) // 2))

    @property
    def steady_seconds(self) -> list[float]:
        """The seconds of the steps after the warm-up (compile and capture)."""
        return self.seconds[WARMUP_STEPS:]

    def summary(self, units_per_step: int, unit: str) -> list[str]:
        """Report lines: the loss's trend, the steady step time and rate, the replayed steps."""
        lines = [f"training loss: {self.first_loss:.4f} -> {self.last_loss:.4f} (mean of the first and the last "
                 f"{self._window} of {len(self.losses)} steps)"]
        steady = self.steady_seconds
        if steady:
            median = statistics.median(steady)
            lines.append(f"step time: median {median * 1e3:.1f} ms over steps {WARMUP_STEPS + 1}..{len(self.seconds)}, "
                         f"{units_per_step / median:,.0f} {unit}/s ({units_per_step} {unit} per step; the first two "
                         f"steps, which compile and capture the replay, took {sum(self.seconds[:WARMUP_STEPS]):.1f} s)")
        lines.append(f"{self.replayed} of {len(self.losses)} steps replayed (one recorded launch list per step)")
        lines += [f"not replayed: {reason}" for reason in self.unreplayable]
        if self.footprint is not None:
            lines.append(f"device memory of the replayed step: {self.footprint.describe()}")
        return lines


def train_steps(step: TrainingStep, next_batch: Callable[[int], Sequence[torch.Tensor]], steps: int,
                units_per_step: int, unit: str, desc: str) -> TrainingLog:
    """Run ``step(*next_batch(i))`` for i in 0..steps-1 under a progress bar counting ``unit``
    (its rate: tokens or images per second) with the last loss."""
    log = TrainingLog()
    bar = tqdm(total=steps * units_per_step, desc=desc, unit=unit, unit_scale=True, dynamic_ncols=True)
    for index in range(steps):
        batch = next_batch(index)
        start = time.perf_counter()
        loss = step(*batch).item()
        log.seconds.append(time.perf_counter() - start)
        log.losses.append(loss)
        bar.set_postfix(loss=f"{loss:.4f}", step=index + 1, refresh=False)
        bar.update(units_per_step)
    bar.close()
    log.replayed = step.replayed_steps
    log.footprint = step.device_footprint
    log.unreplayable = step.unreplayable_reasons
    return log


def loss_fell(before: float, after: float, what: str) -> bool:
    """Whether ``after`` < ``before``; if not, says so on stderr with what to try."""
    if after < before:
        return True
    print(f"error: the {what} did not fall ({before:.4f} -> {after:.4f}); try another --lr or more --steps",
          file=sys.stderr)
    return False


def trainable_count(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter element counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
