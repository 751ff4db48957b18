"""Projected step times on an Adreno target (``python -m torch_adreno project``).

A reference model's training step is compiled *for the target* (``options={"target": ...}``:
the target's work-group sizes, local memory and GEMM tiles) and run as a replayed
:class:`~torch_adreno.TrainingStep` on the present device under ``torch_adreno.profile()``. Each
launch of that step is then placed on the target's roofline
(:func:`torch_adreno.profiler.roofline.project_step`): its counted global-memory bytes over the
target's bandwidth, its FLOPs over the target's fp32 peak, the larger of the two, plus an assumed
per-launch cost; the copies the step makes (the batch in, the loss out) move DRAM bytes too.

What this is not: a measurement. The peaks are published or estimated figures
(:mod:`torch_adreno.target.profiles`), kernels rarely reach a roofline (the projection is a lower
bound on device time with the launch cost as assumed), and the texture cache, clocks under thermal
limits and the driver's real dispatch cost are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.profiler.roofline import ASSUMED_LAUNCH_US, SEED_GEMM_GFLOPS, StepProjection, project_step
from torch_adreno.target.profiles import AdrenoTarget
from torch_adreno.training.optimizers import make_optimizer

#: The seed's own workload: an MLP 784-256-128-16 trained on MNIST-shaped batches of 32.
SEED_MLP = "seed_mlp"
SEED_BATCH = 32


def _seed_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 16))


def workloads() -> dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], tuple[Any, Any]]]]:
    """Model makers and batch makers, by the name ``--model`` takes: the reference models with their
    suite batches, and the seed's MLP."""
    table: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], tuple[Any, Any]]]] = {
        name: (spec.make, spec.batch) for name, spec in MODELS.items()}
    table[SEED_MLP] = (_seed_mlp, lambda g: (torch.randn(SEED_BATCH, 1, 28, 28, generator=g),
                                             torch.randint(0, 16, (SEED_BATCH,), generator=g)))
    return table


@dataclass(frozen=True)
class ModelProjection:
    model: str
    projection: StepProjection
    #: Device time of the same step's kernels on the device that ran it, microseconds.
    measured_here_us: float


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def profile_step(model_name: str, target: AdrenoTarget, device: str | int | None = None) -> torch_adreno.profile:
    """One replayed TrainingStep (SGD, lr 0.01) of ``model_name`` compiled for ``target``, profiled."""
    make, batch = workloads()[model_name]
    torch.manual_seed(0)
    model = make()
    x, y = batch(torch.Generator().manual_seed(0))
    options: dict[str, Any] = {"target": target.name}
    if device is not None:
        options["device"] = device
    opt = make_optimizer("sgd", model.parameters(), momentum=0.0)  # the projection's step since it was written
    with torch_adreno.TrainingStep(model, _loss, opt, options) as step:
        for _ in range(3):  # compile, capture, replay
            step(x, y)
        with torch_adreno.profile() as prof:
            step(x, y)
    if prof.replayed_steps != 1:
        raise RuntimeError(f"{model_name}: the profiled step was not replayed ({prof.replay_fallbacks}); "
                           "its launches would include the compiled graphs' extra work")
    return prof


def project_model(model_name: str, targets: Sequence[AdrenoTarget], launch_us: float = ASSUMED_LAUNCH_US,
                  device: str | int | None = None) -> list[ModelProjection]:
    """The step of ``model_name`` profiled once per target (each compiles its own kernels) and
    projected onto that target."""
    results = []
    for target in targets:
        torch._dynamo.reset()
        prof = profile_step(model_name, target, device)
        copied = prof.bytes_host_to_device + prof.bytes_device_to_host
        results.append(ModelProjection(model_name, project_step(prof.kernels, target, copied, launch_us),
                                       prof.device_time_us))
    return results


def summary_row(p: ModelProjection) -> dict[str, Any]:
    s = p.projection
    return {
        "model": p.model, "target": s.target, "launches": len(s.kernels),
        "kernel_mb": sum(k.bytes for k in s.kernels) / 1e6, "mflop": sum(k.flops for k in s.kernels) / 1e6,
        "projected_ms": s.total_us / 1e3, "roofline_ms": s.kernel_us / 1e3, "launch_ms": s.launches_us / 1e3,
        "copy_ms": s.copy_us / 1e3, "data_movement_share": s.share(s.data_movement_us),
        "launch_share": s.share(s.launches_us), "compute_share": s.share(s.compute_us),
        "memory_bound_kernels": sum(k.memory_bound for k in s.kernels), "gemm_gflops": s.gemm_gflops,
        "launch_us_assumed": s.launch_us,
        "projected_ms_seed_gemm_rate": [s.total_us_with_gemm_rate(r) / 1e3 for r in SEED_GEMM_GFLOPS], "measured_here_ms": p.measured_here_us / 1e3,
    }


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| model | target | launches | kernel MB | MFLOP | projected step ms | roofline / launches / copies ms "
            "| data movement | launch cost | compute | memory-bound kernels | GEMM GFLOP/s (with launch) "
            "| step ms, GEMMs at the seed's 70 / 40 GFLOP/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['target']} | {r['launches']} | {r['kernel_mb']:.2f} | {r['mflop']:.1f} | "
            f"{r['projected_ms']:.3f} | {r['roofline_ms']:.3f} / {r['launch_ms']:.3f} / {r['copy_ms']:.3f} | "
            f"{r['data_movement_share']:.0%} | {r['launch_share']:.0%} | {r['compute_share']:.0%} | "
            f"{r['memory_bound_kernels']}/{r['launches']} | {r['gemm_gflops']:.0f} | "
            f"{r['projected_ms_seed_gemm_rate'][1]:.2f} / {r['projected_ms_seed_gemm_rate'][0]:.2f} |")
    return "\n".join(lines)


def kernel_table(p: ModelProjection, limit: int = 20) -> str:
    s = p.projection
    lines = [f"{'kernel':<48} {'kind':<10} {'KB':>9} {'MFLOP':>8} {'mem us':>8} {'flop us':>8} {'bound':<7}"]
    for k in sorted(s.kernels, key=lambda k: -k.roofline_us)[:limit]:
        lines.append(f"{k.name[:48]:<48} {k.kind:<10} {k.bytes / 1e3:>9.1f} {k.flops / 1e6:>8.2f} "
                     f"{k.memory_us:>8.2f} {k.compute_us:>8.2f} {'memory' if k.memory_bound else 'compute':<7}")
    return "\n".join(lines)
