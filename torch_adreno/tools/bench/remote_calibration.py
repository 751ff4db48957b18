"""A projection's calibration measured on a remote device (``python -m torch_adreno project
--remote HOST:PORT``): each projected workload's step runs there as a replayed TrainingStep under
``torch_adreno.profile()``, and each kernel kind's achieved fraction of that device's roofline
(:func:`torch_adreno.tools.bench.calibration.calibrate`) replaces the stored reference GPU's fractions.

The roofline's peaks are the remote device's Adreno profile's (its fp32 peak and bandwidth, each with
its source in :mod:`torch_adreno.targets.profiles`) when its name matches one, else the ones the user
gives (``--remote-peaks``). Invariant: every fraction of the result is in (0, 1]; a kind that ran
faster than the peaks allow means the peaks are wrong, and is refused (:class:`CalibrationError`)
rather than clipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch_adreno.profiler import profile
from torch_adreno.remote import RemoteDevice, device_profile, parse_remote
from torch_adreno.targets.profiles import match_device
from torch_adreno.tools.bench.calibration import Calibration, CalibrationError, calibrate
from torch_adreno.tools.bench.projected_workloads import StepWorkload
from torch_adreno.tools.bench.projection import profile_step


@dataclass(frozen=True)
class Peaks:
    """A device's fp32 peak and memory bandwidth, with where each comes from."""

    gflops: float
    bandwidth_gbs: float
    source: str


def remote_peaks(spec: str, given: tuple[float, float] | None) -> tuple[str, Peaks]:
    """The remote device's name and the peaks its fractions are of: ``given`` (GFLOP/s, GB/s) if
    set, else its matched Adreno profile's; a CalibrationError saying what to pass when neither."""
    address = parse_remote(spec)
    if address is None:
        raise CalibrationError(f"{spec!r} is not a remote device (remote:HOST:PORT)")
    with RemoteDevice(*address) as device:
        properties = device_profile(device.properties())
    name = f"{properties.name} at {address[0]}:{address[1]}"
    if given is not None:
        gflops, bandwidth = given
        if gflops <= 0 or bandwidth <= 0:
            raise CalibrationError(f"--remote-peaks: two positive numbers (GFLOP/s, GB/s), got {gflops} {bandwidth}")
        return name, Peaks(gflops, bandwidth, "given on the command line (--remote-peaks)")
    matched = match_device(properties.name, properties.opencl_version)
    if matched is None:
        raise CalibrationError(f"the remote device {properties.name!r} matches no Adreno profile, so its fp32 peak "
                               "and bandwidth are unknown: give them with --remote-peaks GFLOPS GBS (from its "
                               "datasheet or a micro-benchmark)")
    sources = matched.sources
    return name, Peaks(matched.peak_fp32_gflops, matched.bandwidth_gbs,
                       f"the {matched.name} profile's: fp32 peak from {sources.get('peak_fp32_gflops', '?')}; "
                       f"bandwidth from {sources.get('bandwidth_gbs', '?')}")


def kind_rows(prof: profile) -> dict[str, dict[str, float]]:
    """One profiled step's launches summed by kernel kind: calls, measured ms, GFLOP and MB."""
    rows: dict[str, dict[str, float]] = {}
    for kernel in prof.kernels:
        if kernel.device_time_us is None:
            raise CalibrationError(f"kernel {kernel.name} has no device time: the remote step was not profiled")
        row = rows.setdefault(kernel.kind, {"calls": 0, "time_ms": 0.0, "gflop": 0.0, "mb": 0.0})
        row["calls"] += 1
        row["time_ms"] += kernel.device_time_us / 1e3
        row["gflop"] += kernel.flops / 1e9
        row["mb"] += kernel.bytes / 1e6
    return rows


def measure_calibration(spec: str, workloads: Sequence[StepWorkload],
                        given_peaks: tuple[float, float] | None = None) -> Calibration:
    """The kinds' achieved fractions of the remote device's roofline, from one replayed step of
    each of ``workloads`` run there (each workload under its own calibration table, and pooled)."""
    name, peaks = remote_peaks(spec, given_peaks)
    records: list[Mapping[str, Any]] = [
        {"workload": work.calibration, "by_kind": kind_rows(profile_step(work, None, spec))} for work in workloads]
    tables = calibrate(records, peaks.gflops, peaks.bandwidth_gbs)
    for workload, kinds in tables.items():
        for kind, entry in kinds.items():
            if not 0 < entry.fraction <= 1:
                raise CalibrationError(
                    f"{workload}: {kind} kernels reached {entry.fraction:.2f} of the roofline of {peaks.gflops:g} "
                    f"GFLOP/s and {peaks.bandwidth_gbs:g} GB/s ({peaks.source}): faster than those peaks allow, so "
                    "they are not this device's; give its real ones with --remote-peaks")
    sources = {
        "records": f"one replayed step of {', '.join(w.name for w in workloads)} profiled now on {name} "
                   "(its own OpenCL events)",
        "peak_gflops": peaks.source, "bandwidth_gbs": peaks.source,
    }
    return Calibration(name, peaks.gflops, peaks.bandwidth_gbs, tables, sources)
