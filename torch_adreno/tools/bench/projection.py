"""Projected step times on an Adreno target (``python -m torch_adreno project``).

A workload's training step (:mod:`.projected_workloads`) is compiled *for the target*
(``options={"target": ...}``: the target's work-group sizes, local memory and GEMM tiles) and run as
a replayed :class:`~torch_adreno.TrainingStep` on the present device under ``torch_adreno.profile()``.
Each launch of that step is then placed on the target's roofline
(:func:`torch_adreno.profiler.roofline.project_step`): its counted global-memory bytes over the
target's bandwidth, its FLOPs over the target's fp32 peak, the larger of the two, plus an assumed
per-launch cost; the copies the step makes (the batch in, the loss out) move DRAM bytes too.

Two figures per step: the *roofline* one (every kernel at its roofline: a lower bound) and the
*calibrated* one, where each kernel's roofline time is divided by the fraction of the reference GPU's
roofline that kernels of its kind reached there (:mod:`.calibration`: the workload's own measured
fractions where the reference GPU ran it, else pooled ones). The calibrated figure assumes our kernels
reach the same share of an Adreno's peaks as of the reference GPU's; launch and copy costs are not
calibrated.

A GPT-2 step profiled with fewer blocks (``profile_layers``) is extrapolated per block: every
quantity projected here is a sum over launches, a step of ``n`` blocks launches the kernels of the
1-block step plus ``n - 1`` blocks' worth (the blocks are identical), so the total is
``P(a) + (n - a) * (P(b) - P(a)) / (b - a)`` from profiles at ``a`` and ``b`` blocks.

Energy per step (:mod:`torch_adreno.targets.energy`): the step's kernel bytes and copies at the
target's picojoules per DRAM byte, its FLOPs at the GPU's picojoules per FLOP (fp32, as the kernels
compute unless ``native_half``; fp16 too in the JSON); published figures and estimates, each with
its source, no static power.

What this is not: a measurement. The peaks are published or estimated figures
(:mod:`torch_adreno.targets.profiles`), the calibration comes from another GPU, and the texture
cache, clocks under thermal limits and the driver's real dispatch cost are not modelled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

import torch_adreno
from torch_adreno.profiler.roofline import ASSUMED_LAUNCH_US, SEED_GEMM_GFLOPS, StepProjection, project_step
from torch_adreno.runtime import get_runtime
from torch_adreno.targets.energy import EnergyCosts, StepEnergy, energy_costs, project_energy
from torch_adreno.targets.profiles import AdrenoTarget, compile_profile
from torch_adreno.tools.bench.calibration import (
    UNMEASURED_STAND_INS,
    Calibration,
    KindFraction,
    fraction_of,
    load_calibration,
)
from torch_adreno.tools.bench.projected_workloads import StepWorkload, step_workloads
from torch_adreno.training.optimizers import make_optimizer


@dataclass(frozen=True)
class StepTotals:
    """A projected step's sums over its launches (every field adds up over launches, so that two
    profiles at different depths extrapolate field by field), microseconds unless named otherwise."""

    launches: float
    kernel_bytes: float
    flops: float
    #: Host<->device bytes the step copies (the batch in, the loss out).
    copied_bytes: float
    roofline_us: float
    calibrated_us: float
    launches_us: float
    copy_us: float
    data_movement_us: float
    compute_us: float
    memory_bound_kernels: float
    gemm_flops: float
    gemm_with_launch_us: float
    measured_here_us: float
    #: Extra microseconds with every GEMM at the seed's rates (:data:`SEED_GEMM_GFLOPS`, in order).
    seed_gemm_extra_us: tuple[float, ...]
    #: Roofline and calibrated microseconds by kernel kind.
    by_kind: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        return self.roofline_us + self.launches_us + self.copy_us

    @property
    def calibrated_total_us(self) -> float:
        return self.calibrated_us + self.launches_us + self.copy_us

    def share(self, part_us: float) -> float:
        return part_us / self.total_us if self.total_us else 0.0

    @property
    def gemm_gflops(self) -> float:
        return self.gemm_flops / (self.gemm_with_launch_us * 1e3) if self.gemm_with_launch_us else 0.0

    def plus(self, other: StepTotals, weight: float) -> StepTotals:
        """``self + weight * other``, field by field."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "by_kind":
                kinds = sorted(set(mine) | set(theirs))
                values[f.name] = {k: tuple(a + weight * b for a, b in zip(mine.get(k, (0.0, 0.0)),
                                                                          theirs.get(k, (0.0, 0.0)), strict=True))
                                  for k in kinds}
            elif isinstance(mine, tuple):
                values[f.name] = tuple(a + weight * b for a, b in zip(mine, theirs, strict=True))
            else:
                values[f.name] = mine + weight * theirs
        return StepTotals(**values)


def step_totals(projection: StepProjection, fractions: Mapping[str, KindFraction], table: str,
                measured_here_us: float) -> StepTotals:
    """The sums of one projected step, each kernel's calibrated time its roofline time over its
    kind's fraction in ``fractions`` (the calibration table named ``table``)."""
    by_kind: dict[str, tuple[float, float]] = {}
    calibrated = 0.0
    for k in projection.kernels:
        slow = k.roofline_us / fraction_of(fractions, k.kind, table)
        calibrated += slow
        roof, cal = by_kind.get(k.kind, (0.0, 0.0))
        by_kind[k.kind] = (roof + k.roofline_us, cal + slow)
    gemms = [k for k in projection.kernels if k.kind == "gemm"]
    return StepTotals(
        launches=len(projection.kernels), kernel_bytes=sum(k.bytes for k in projection.kernels),
        flops=sum(k.flops for k in projection.kernels), copied_bytes=projection.copied_bytes,
        roofline_us=projection.kernel_us, calibrated_us=calibrated,
        launches_us=projection.launches_us, copy_us=projection.copy_us,
        data_movement_us=projection.data_movement_us, compute_us=projection.compute_us,
        memory_bound_kernels=sum(k.memory_bound for k in projection.kernels),
        gemm_flops=sum(k.flops for k in gemms), gemm_with_launch_us=sum(k.total_us for k in gemms),
        measured_here_us=measured_here_us,
        seed_gemm_extra_us=tuple(projection.total_us_with_gemm_rate(r) - projection.total_us for r in SEED_GEMM_GFLOPS),
        by_kind=by_kind)


@dataclass(frozen=True)
class ModelProjection:
    model: str
    target: AdrenoTarget
    totals: StepTotals
    workload: StepWorkload
    #: The calibration table the kernels were projected with (a workload's name or "pooled").
    calibration: str
    #: How the launches were obtained: "profiled" or how they were extrapolated.
    profiled: str
    #: The deepest profile's launches on the target's roofline (for the per-kernel table).
    projection: StepProjection
    #: The calibration's fractions by kind the calibrated times used.
    fractions: Mapping[str, KindFraction]
    #: Wall seconds each profile took here (compile, capture, one replayed step), and the device.
    profile_s: tuple[float, ...]
    profiled_on: str

    @property
    def energy_costs(self) -> EnergyCosts | None:
        """The target's energy figures; None for a target without them (see :attr:`energy_reason`)."""
        try:
            return energy_costs(self.target)
        except ValueError:
            return None

    @property
    def energy_reason(self) -> str | None:
        """Why no energy is projected for this target; None when it is."""
        try:
            energy_costs(self.target)
        except ValueError as error:
            return str(error)
        return None

    def energy(self, arithmetic: str = "fp32") -> StepEnergy | None:
        """The step's projected energy with its arithmetic in ``arithmetic``; None without figures."""
        costs = self.energy_costs
        if costs is None:
            return None
        return project_energy(costs, self.totals.kernel_bytes, self.totals.copied_bytes, self.totals.flops,
                              arithmetic)

    @property
    def items_per_s(self) -> tuple[float, float]:
        """Images, tokens or samples per second: roofline, calibrated."""
        return (self.workload.items / (self.totals.total_us * 1e-6) if self.totals.total_us else 0.0,
                self.workload.items / (self.totals.calibrated_total_us * 1e-6) if self.totals.calibrated_total_us else 0.0)


def profile_step(work: StepWorkload, target: AdrenoTarget | None, device: str | int | None = None) -> torch_adreno.profile:
    """One replayed TrainingStep (SGD, lr 0.01, the workload's momentum, its trainable parameters)
    of ``work`` compiled for ``target`` (None: the device's own limits; a remote device is its own
    target), profiled."""
    model = work.make()
    x, y = work.batch(torch.Generator().manual_seed(0))
    options: dict[str, Any] = {"target": target} if target is not None else {}
    if device is not None:
        options["device"] = device
    opt = make_optimizer("sgd", [p for p in model.parameters() if p.requires_grad], momentum=work.momentum)
    with torch_adreno.TrainingStep(model, work.loss, opt, options) as step:
        for _ in range(2):  # compile, capture: the next call is the first replay
            step(x, y)
        with torch_adreno.profile(energy=False) as prof:
            step(x, y)
    if prof.replayed_steps != 1:
        raise RuntimeError(f"{work.name}: the profiled step was not replayed ({prof.replay_fallbacks}); "
                           "its launches would include the compiled graphs' extra work")
    return prof


def _plan_key(target: AdrenoTarget, device: str | int | None) -> Any:
    """What the compiler plans with for ``target`` here, less the target's name: targets with equal
    keys get the same kernels, so one profile serves them all."""
    return dataclasses.replace(compile_profile(get_runtime(device).profile, target), target="")


def project_model(model_name: str, targets: Sequence[AdrenoTarget], launch_us: float = ASSUMED_LAUNCH_US,
                  device: str | int | None = None, calibration: Calibration | None = None,
                  profile_layers: tuple[int, int] | None = None) -> list[ModelProjection]:
    """The step of ``model_name`` profiled for each target (once per distinct compile plan) and
    projected onto it, roofline and calibrated. ``profile_layers=(a, b)``: a layered workload is
    profiled with ``a`` and ``b`` blocks and extrapolated to its own depth."""
    work = step_workloads()[model_name]
    calibration = calibration or load_calibration()
    table, fractions = calibration.for_workload(work.calibration)
    depths: tuple[int, ...] = (work.layers,) if profile_layers is None else profile_layers
    if profile_layers is not None and not (0 < profile_layers[0] < profile_layers[1]):
        raise ValueError(f"profile layers must be two increasing depths >= 1, got {profile_layers}")
    profiled: dict[Any, list[torch_adreno.profile]] = {}
    seconds: dict[Any, list[float]] = {}
    results = []
    for target in targets:
        key = _plan_key(target, device)
        if key not in profiled:
            profiled[key], seconds[key] = [], []
            for depth in depths:
                torch._dynamo.reset()
                part = work if profile_layers is None else work.with_layers(depth)
                start = time.perf_counter()
                profiled[key].append(profile_step(part, target, device))
                seconds[key].append(time.perf_counter() - start)
        totals = []
        for prof in profiled[key]:
            copied = prof.bytes_host_to_device + prof.bytes_device_to_host
            projection = project_step(prof.kernels, target, copied, launch_us)
            totals.append(step_totals(projection, fractions, table, prof.device_time_us))
        how = "profiled"
        step = totals[0]
        if profile_layers is not None:
            low, high = profile_layers
            step = totals[0].plus(totals[1].plus(totals[0], -1.0), (work.layers - low) / (high - low))
            how = f"profiled at {low} and {high} layers, extrapolated per layer to {work.layers}"
        results.append(ModelProjection(model_name, target, step, work, table, how, projection, fractions,
                                       tuple(seconds[key]), get_runtime(device).profile.name))
    return results


def _shape_of(work: StepWorkload) -> dict[str, int]:
    if work.gpt2 is not None:
        return {"layers": work.gpt2.layers, "d": work.gpt2.d, "seq": work.gpt2.seq, "batch": work.gpt2.batch}
    x, _ = work.batch(torch.Generator().manual_seed(0))
    return {"batch": x.shape[0], "image": x.shape[-1]}


def project_record(record: Mapping[str, Any], targets: Sequence[AdrenoTarget], launch_us: float = ASSUMED_LAUNCH_US,
                   calibration: Calibration | None = None) -> list[ModelProjection]:
    """A step profiled elsewhere (a ``benchmarks/workloads.py`` record: its kernel kinds' launches,
    bytes and FLOPs) projected onto each target without profiling here. Each kind's launches are
    taken as equal shares of its sums, so a kind's roofline time is that of its sums (at most the
    per-launch sum a profile gives: this errs on the fast side for kinds mixing compute- and
    memory-bound launches)."""
    name = record["workload"]
    work = step_workloads().get(name)
    if work is None:
        raise ValueError(f"record of {name!r}: not a workload project knows ({', '.join(sorted(step_workloads()))})")
    want, have = _shape_of(work), {k: record.get("shape", {}).get(k) for k in _shape_of(work)}
    if want != have:
        raise ValueError(f"record of {name!r} has shape {have}, the workload {want}: project the shape it measured")
    calibration = calibration or load_calibration()
    table, fractions = calibration.for_workload(work.calibration)
    kernels = [SimpleNamespace(name=f"{kind} (mean of {row['calls']})", kind=kind,
                               bytes=round(row["mb"] * 1e6 / row["calls"]), flops=round(row["gflop"] * 1e9 / row["calls"]))
               for kind, row in record["by_kind"].items() for _ in range(row["calls"])]
    copied = record["h2d_bytes"] + record["d2h_bytes"]
    how = (f"kinds' sums recorded on the {record['device']} ({record['date']}; kernels compiled for it, not for "
           "the target), not profiled here")
    results = []
    for target in targets:
        projection = project_step(kernels, target, copied, launch_us)
        totals = step_totals(projection, fractions, table, record["device_ms"] * 1e3)
        results.append(ModelProjection(name, target, totals, work, table, how, projection, fractions, (),
                                       record["device"]))
    return results


def summary_row(p: ModelProjection) -> dict[str, Any]:
    s = p.totals
    roofline_rate, calibrated_rate = p.items_per_s
    return {
        "model": p.model, "title": p.workload.title, "target": p.target.name, "profiled": p.profiled,
        "launches": round(s.launches), "kernel_mb": s.kernel_bytes / 1e6, "mflop": s.flops / 1e6,
        "projected_ms": s.total_us / 1e3, "roofline_ms": s.roofline_us / 1e3, "launch_ms": s.launches_us / 1e3,
        "copy_ms": s.copy_us / 1e3, "calibrated_ms": s.calibrated_total_us / 1e3,
        "calibrated_kernel_ms": s.calibrated_us / 1e3, "calibration": p.calibration,
        "calibrated_kernel_ms_by_kind": {k: cal / 1e3 for k, (_, cal) in s.by_kind.items()},
        "roofline_kernel_ms_by_kind": {k: roof / 1e3 for k, (roof, _) in s.by_kind.items()},
        "unit": p.workload.unit, "items_per_step": p.workload.items,
        f"{p.workload.unit}_per_s": roofline_rate, f"{p.workload.unit}_per_s_calibrated": calibrated_rate,
        "data_movement_share": s.share(s.data_movement_us), "launch_share": s.share(s.launches_us),
        "compute_share": s.share(s.compute_us), "memory_bound_kernels": round(s.memory_bound_kernels),
        "gemm_gflops": s.gemm_gflops, "launch_us_assumed": p.projection.launch_us,
        "projected_ms_seed_gemm_rate": [(s.total_us + extra) / 1e3 for extra in s.seed_gemm_extra_us],
        "measured_here_ms": s.measured_here_us / 1e3, "profiled_on": p.profiled_on,
        "profile_s": list(p.profile_s), "copied_bytes": s.copied_bytes, **energy_fields(p),
    }


def energy_fields(p: ModelProjection) -> dict[str, Any]:
    """A projection's energy per step (mJ) by where it goes, per item, and the figures' sources; or
    the reason none is projected."""
    fp32, fp16, costs = p.energy("fp32"), p.energy("fp16"), p.energy_costs
    if fp32 is None or fp16 is None or costs is None:
        return {"energy_mj": None, "energy_not_projected": p.energy_reason}
    return {
        "energy_mj": fp32.total_joules * 1e3, "energy_dram_mj": fp32.dram_joules * 1e3,
        "energy_copy_mj": fp32.copy_joules * 1e3, "energy_arithmetic_mj": fp32.arithmetic_joules * 1e3,
        "energy_mj_fp16_arithmetic": fp16.total_joules * 1e3,
        f"energy_mj_per_{p.workload.unit.rstrip('s')}": fp32.total_joules * 1e3 / p.workload.items,
        "energy_memory": costs.memory, "energy_pj_per_byte": costs.pj_per_byte,
        "energy_pj_per_flop": dict(costs.pj_per_flop), "energy_sources": dict(costs.sources),
    }


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| model | target | launches | kernel MB | MFLOP | projected step ms (roofline) | calibrated step ms "
            "| roofline / launches / copies ms | per s (roofline / calibrated) | data movement | launch cost "
            "| compute | memory-bound kernels | GEMM GFLOP/s (with launch) | step ms, GEMMs at the seed's 70 / 40 GFLOP/s "
            "| energy mJ/step (DRAM / copies / arithmetic) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        unit = r["unit"]
        lines.append(
            f"| {r['model']} | {r['target']} | {r['launches']} | {r['kernel_mb']:.2f} | {r['mflop']:.1f} | "
            f"{r['projected_ms']:.3f} | {r['calibrated_ms']:.3f} ({r['calibration']}) | "
            f"{r['roofline_ms']:.3f} / {r['launch_ms']:.3f} / {r['copy_ms']:.3f} | "
            f"{r[f'{unit}_per_s']:.1f} / {r[f'{unit}_per_s_calibrated']:.1f} {unit} | "
            f"{r['data_movement_share']:.0%} | {r['launch_share']:.0%} | {r['compute_share']:.0%} | "
            f"{r['memory_bound_kernels']}/{r['launches']} | {r['gemm_gflops']:.0f} | "
            f"{r['projected_ms_seed_gemm_rate'][1]:.2f} / {r['projected_ms_seed_gemm_rate'][0]:.2f} | "
            f"{energy_cell(r)} |")
    return "\n".join(lines)


def energy_cell(row: dict[str, Any]) -> str:
    if row["energy_mj"] is None:
        return "not projected"
    return (f"{row['energy_mj']:.3g} ({row['energy_dram_mj']:.3g} / {row['energy_copy_mj']:.3g} / "
            f"{row['energy_arithmetic_mj']:.3g})")


def energy_lines(projections: Sequence[ModelProjection]) -> list[str]:
    """The energy figures each target was projected with, and their sources (once per target)."""
    lines = ["Energy (projected, not measured): kernel bytes and 2 x copied bytes at the DRAM's pJ/byte, FLOPs at "
             "the GPU's fp32 pJ/FLOP (the kernels' arithmetic unless native_half); no static power:"]
    seen = set()
    for p in projections:
        if p.target.name in seen:
            continue
        seen.add(p.target.name)
        costs = p.energy_costs
        if costs is None:
            lines.append(f"  {p.target.name}: not projected: {p.energy_reason}")
            continue
        lines.append(f"  {p.target.name}: {costs.memory} {costs.pj_per_byte:.3g} pJ/byte ({costs.sources['pj_per_byte']}); "
                     f"{costs.pj_per_flop['fp32']:.3g} pJ/FLOP fp32 ({costs.sources['pj_per_flop_fp32']})")
    return lines


def calibration_lines(projections: Sequence[ModelProjection], calibration: Calibration) -> list[str]:
    """Which calibration table each model used, with its fractions, and how its launches were got."""
    lines = [f"Calibrated: each kernel's roofline time over its kind's achieved fraction of the "
             f"{calibration.device}'s roofline ({calibration.peak_gflops / 1e3:.0f} TFLOP/s fp32, "
             f"{calibration.bandwidth_gbs:.0f} GB/s), from {calibration.sources.get('records', '?')}:"]
    seen = set()
    for p in projections:
        if p.model in seen:
            continue
        seen.add(p.model)
        kinds = ", ".join(f"{k} {e.fraction:.3f}" + (f" (as {e.stand_in})" if e.stand_in else "")
                          for k, e in p.fractions.items())
        unmeasured = sorted(set(p.totals.by_kind) - set(p.fractions))
        kinds += "".join(f"; {k} not measured there: as {UNMEASURED_STAND_INS[k]}" for k in unmeasured)
        lines.append(f"  {p.model} ({p.workload.title}): {p.profiled}; calibration {p.calibration!r}: {kinds}")
    return lines


def kernel_table(p: ModelProjection, limit: int = 20) -> str:
    s = p.projection
    lines = [f"{'kernel':<48} {'kind':<10} {'KB':>9} {'MFLOP':>8} {'mem us':>8} {'flop us':>8} {'calib us':>9} "
             f"{'bound':<7}"]
    for k in sorted(s.kernels, key=lambda k: -k.roofline_us)[:limit]:
        calibrated = k.roofline_us / fraction_of(p.fractions, k.kind, p.calibration)
        lines.append(f"{k.name[:48]:<48} {k.kind:<10} {k.bytes / 1e3:>9.1f} {k.flops / 1e6:>8.2f} "
                     f"{k.memory_us:>8.2f} {k.compute_us:>8.2f} {calibrated:>9.2f} "
                     f"{'memory' if k.memory_bound else 'compute':<7}")
    return "\n".join(lines)
