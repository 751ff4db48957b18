"""Measuring training steps: eager PyTorch and the adreno backend on the same model and batch.

Used by the scripts in ``benchmarks/`` (which write JSON lines and plots) and by the command
line. Nothing here asserts a timing: benchmarks measure, tests check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.models import MODELS


@dataclass
class StepStats:
    """Timings (ms) of ``steps`` training steps after warm-up, and one profiled step's counts."""

    model: str
    variant: str
    steps: int
    median_ms: float
    min_ms: float
    max_ms: float
    compile_s: float | None = None
    kernel_launches: int | None = None
    bytes_host_to_device: int | None = None
    bytes_device_to_host: int | None = None
    bytes_kernel_read: int | None = None
    bytes_kernel_written: int | None = None
    device_time_ms: float | None = None
    host_fallback_ops: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _timed(fn: Callable[[], None], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure_training_step(model_name: str, variant: str, steps: int = 20, warmup: int = 2,
                          options: dict[str, Any] | None = None, optimizer: str = "sgd",
                          seed: int = 0) -> StepStats:
    """Median step time of forward + loss + backward + optimizer step.

    ``variant`` is ``"eager"`` (PyTorch on the host) or ``"adreno"`` (model and loss compiled
    together with ``options``). The same seed gives both the same weights and batch.
    """
    spec = MODELS[model_name]
    torch.manual_seed(seed)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(seed))

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    step_loss = loss_fn if variant == "eager" else torch.compile(
        loss_fn, backend="adreno", options=options or {}, dynamic=False)
    params = list(model.parameters())
    opt: torch.optim.Optimizer = (torch.optim.SGD(params, lr=0.01) if optimizer == "sgd"
                                  else torch.optim.Adam(params, lr=1e-3))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        step_loss(model, x, y).backward()
        opt.step()

    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start if variant != "eager" else None
    for _ in range(max(0, warmup - 1)):
        step()
    times = _timed(step, steps)
    stats = StepStats(model_name, variant, steps, statistics.median(times), min(times), max(times), compile_s)
    if variant != "eager":
        with torch_adreno.profile() as prof:
            step()
        stats.kernel_launches = prof.kernel_launches
        stats.bytes_host_to_device = prof.bytes_host_to_device
        stats.bytes_device_to_host = prof.bytes_device_to_host
        stats.bytes_kernel_read = prof.bytes_kernel_read
        stats.bytes_kernel_written = prof.bytes_kernel_written
        stats.device_time_ms = prof.device_time_us / 1e3
        stats.host_fallback_ops = len(prof.host_fallback_ops)
    return stats
