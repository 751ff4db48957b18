"""Measuring training steps: eager PyTorch and the adreno backend in several configurations.

Used by the scripts in ``benchmarks/`` (which write JSON lines and plots) and by the command
line. Variants of one model are timed *interleaved* (one step of each, in turn) so that the
drift of a shared, noisy machine hits them alike; compare ratios within one run only. Nothing
here asserts a timing: benchmarks measure, tests check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.training.optimizers import make_optimizer
from torch_adreno.training.step import TrainingStep

#: A variant is "eager" or the options of torch.compile(backend="adreno").
Variant = str | Mapping[str, Any]


@dataclass
class StepStats:
    """Step times (ms) after warm-up, and the counts of one profiled step."""

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
    peak_device_bytes: int | None = None
    bytes_shared: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x), y)


class _Runner:
    """One variant: its own copy of the model (same seed), optimizer and compiled step."""

    def __init__(self, model_name: str, variant: Variant, optimizer: str, seed: int) -> None:
        variant = dict(variant) if variant != "eager" else variant  # type: ignore[arg-type]
        on_device = variant != "eager" and bool(variant.pop("optimizer_on_device", False))  # type: ignore[union-attr]
        whole_step = variant != "eager" and bool(variant.pop("training_step", False))  # type: ignore[union-attr]
        replay = variant != "eager" and bool(variant.pop("replay", True))  # type: ignore[union-attr]
        spec = MODELS[model_name]
        torch.manual_seed(seed)
        self.model = spec.make()
        self.x, self.y = spec.batch(torch.Generator().manual_seed(seed))
        self.eager = variant == "eager"
        self.options = {} if self.eager else dict(variant)  # type: ignore[arg-type]
        self.step_loss: Callable[..., torch.Tensor] = _loss if self.eager else torch.compile(
            _loss, backend="adreno", options=self.options, dynamic=False)
        params = list(self.model.parameters())
        # The suite's SGD has no momentum (as in every result it recorded); other optimizers as named.
        self.opt = make_optimizer(optimizer, params, **({"momentum": 0.0} if optimizer == "sgd" else {}))
        self.opt_step: Callable[[], Any] = (torch.compile(self.opt.step, backend="adreno", options=self.options,
                                                          dynamic=False)
                                            if on_device else self.opt.step)
        # TrainingStep: loss, backward and optimizer step compiled, training state kept on the device.
        self.training_step = (TrainingStep(self.model, _loss, self.opt, self.options, replay=replay)
                              if whole_step else None)
        self.reported_options = ({**self.options, "optimizer_on_device": on_device or whole_step,
                                  "training_step": whole_step, "replay": whole_step and replay}
                                 if not self.eager else {})
        self.compile_s: float | None = None
        self.times: list[float] = []

    def step(self) -> None:
        if self.training_step is not None:
            self.training_step(self.x, self.y)
            return
        self.opt.zero_grad(set_to_none=True)
        self.step_loss(self.model, self.x, self.y).backward()
        self.opt_step()

    def timed_step(self) -> None:
        start = time.perf_counter()
        self.step()
        self.times.append((time.perf_counter() - start) * 1e3)


def variant_name(variant: Variant) -> str:
    if variant == "eager":
        return "eager"
    options = dict(variant)  # type: ignore[arg-type]
    return "adreno" + "".join(f" {k}={v}" for k, v in sorted(options.items()) if k != "device")


def steps_run(variant: Variant, steps: int, warmup: int = 2, remote: bool = False) -> int:
    """The steps :func:`compare_variants` runs of ``variant``: warm-up (the first compiles), the
    timed ones, and one profiled step where the kernels are this machine's."""
    return max(1, warmup) + steps + (0 if variant == "eager" or remote else 1)


def compare_variants(model_name: str, variants: Mapping[str, Variant], steps: int = 20, warmup: int = 2,
                     optimizer: str = "sgd", seed: int = 0, interleaved: bool = True,
                     progress: Callable[[str, int], None] | None = None) -> list[StepStats]:
    """Median step time (forward, loss, backward, optimizer step) of each variant, their steps
    interleaved (a shared machine's noise falls on all alike); ``interleaved=False`` runs one
    variant after another, each closed before the next starts (a step server serves one step).
    ``progress(what, steps_done)`` is told what runs next and how many steps (of
    :func:`steps_run` per variant) ran since it was last told."""
    tell = progress if progress is not None else (lambda what, done: None)
    runners: dict[str, _Runner] = {}
    results: dict[str, StepStats] = {}
    for name, variant in variants.items():
        torch._dynamo.reset()
        tell(f"{model_name} {name}: compiling", 0)
        runner = _Runner(model_name, variant, optimizer, seed)
        start = time.perf_counter()
        runner.step()
        if not runner.eager:
            runner.compile_s = time.perf_counter() - start
        for _ in range(max(0, warmup - 1)):
            runner.step()
        tell(f"{model_name} {name}: timing", max(1, warmup))
        if interleaved:
            runners[name] = runner
            continue
        for _ in range(steps):
            runner.timed_step()
            tell(f"{model_name} {name}: timing", 1)
        results[name] = _measured(model_name, name, runner, steps)
        tell(f"{model_name} {name}: profiled", int(_profiled(runner)))
        if runner.training_step is not None:
            runner.training_step.close()
    for _ in range(steps):
        for runner in runners.values():
            runner.timed_step()
            tell(f"{model_name}: timing, interleaved", 1)
    for name, runner in runners.items():
        results[name] = _measured(model_name, name, runner, steps)
        tell(f"{model_name} {name}: profiled", int(_profiled(runner)))
    return [results[name] for name in variants]


def _profiled(runner: _Runner) -> bool:
    """Whether one step of ``runner`` is profiled: not eager's, nor a remote device's (its kernels
    are not seen here: its steps' times are the figures)."""
    return not runner.eager and not (runner.training_step is not None and runner.training_step.remote is not None)


def _measured(model_name: str, name: str, runner: _Runner, steps: int) -> StepStats:
    """``runner``'s step times, and (on this machine's device) one profiled step's figures."""
    t = runner.times
    stats = StepStats(model_name, name, steps, statistics.median(t), min(t), max(t), runner.compile_s,
                      options=runner.reported_options)
    if not _profiled(runner):
        return stats
    with torch_adreno.profile() as prof:
        runner.step()
    stats.kernel_launches = prof.kernel_launches
    stats.bytes_host_to_device = prof.bytes_host_to_device
    stats.bytes_device_to_host = prof.bytes_device_to_host
    stats.bytes_kernel_read = prof.bytes_kernel_read
    stats.bytes_kernel_written = prof.bytes_kernel_written
    stats.device_time_ms = prof.device_time_us / 1e3
    stats.host_fallback_ops = len(prof.host_fallback_ops)
    stats.peak_device_bytes = prof.step_peak_device_bytes("planned")
    stats.bytes_shared = prof.bytes_shared
    return stats


#: The suite's configurations: eager on the host, then the backend from no fusion and no reuse up
#: to everything (fusion, memory reuse and the optimizer step compiled too).
SUITE_VARIANTS: dict[str, Variant] = {
    "eager": "eager",
    "unfused": {"fusion": False, "memory_reuse": False},
    "fused": {"fusion": True, "memory_reuse": False},
    "fused+reuse": {"fusion": True, "memory_reuse": True},
    "fused+reuse+device-opt": {"fusion": True, "memory_reuse": True, "optimizer_on_device": True},
}


def cuda_step(model_name: str, steps: int, compiled: bool, seed: int = 0) -> StepStats | None:
    """PyTorch's own CUDA path for the same step (eager, or torch.compile with inductor)."""
    if not torch.cuda.is_available():
        return None
    spec = MODELS[model_name]
    torch.manual_seed(seed)
    model = spec.make().cuda()
    x, y = (t.cuda() for t in spec.batch(torch.Generator().manual_seed(seed)))
    opt = make_optimizer("sgd", model.parameters(), momentum=0.0)  # as the suite's steps
    loss_fn = torch.compile(_loss) if compiled else _loss
    start = time.perf_counter()
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()
        opt.step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return StepStats(model_name, "inductor CUDA" if compiled else "eager CUDA", steps, statistics.median(times),
                     min(times), max(times), compile_s if compiled else None)
