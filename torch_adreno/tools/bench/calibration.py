"""How far below a GPU's roofline our kernels run, by kernel kind: the calibration that turns a
roofline projection (:mod:`torch_adreno.profiler.roofline`) into a calibrated one.

For one profiled step on a real GPU, a kind's *achieved fraction* is its roofline time over its
measured device time: ``max(GFLOP / peak GFLOP/s, bytes / peak bandwidth) / measured``. The profile
records that the measurements come from (``benchmarks/workloads.py``'s ``by_kind``) give each kind's
FLOPs and bytes summed over its launches, so the roofline is taken of the sums: the larger of the
two sums' times, which is at most the sum of the launches' own rooflines (a kind mixing
compute-bound and memory-bound launches has a larger one). The fraction is therefore a lower bound
of the per-launch one, and a projection that divides each launch's roofline time by it errs on the
slow side; ``fraction_upper`` (both sums' times added, an upper bound of the per-launch roofline
sum) brackets it from above.

A kind whose launches are too small to show a throughput (their mean roofline time per launch under
:data:`LATENCY_BOUND_US` on the measuring GPU: its fixed per-kernel latency is all that was
measured) takes a stand-in kind's fraction (:data:`STAND_INS`), said in its entry.

The stored calibration (``calibration_reference_gpu.json`` beside this module) is made by
``benchmarks/calibrate_projection.py`` from the result files of the reference GPU (a data-center NVIDIA
GPU, :data:`REFERENCE_GPU_MODEL`), each number with where it came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The stored calibration: our kernels on the reference GPU (the profiled steps of benchmarks/workloads.py there).
CALIBRATION_FILE = Path(__file__).with_name("calibration_reference_gpu.json")
#: A kind whose mean roofline time per launch on the measuring GPU is under this many microseconds
#: measured the GPU's fixed per-kernel latency (a few microseconds), not a throughput.
LATENCY_BOUND_US = 1.0
#: The kind whose fraction a latency-bound kind takes: a batch norm's running statistics written back
#: (``copies``) are element-wise copies, as pointwise kernels are; a small reduction (a bias's
#: gradient of a small batch) reads its elements once, as a pointwise kernel does.
STAND_INS = {"copies": "pointwise", "reduction": "pointwise"}
#: Kinds newer than the calibration's records, and the measured kind each is projected with: a fused
#: attention kernel's FLOPs are its two matrix products (when the calibration was measured, attention ran as
#: GEMM and softmax kernels, so its share is in the GEMMs').
UNMEASURED_STAND_INS = {"attention": "gemm"}
#: Fractions pooled over every workload of the calibration, for models it did not measure.
POOLED = "pooled"


class CalibrationError(ValueError):
    """A calibration file or profile that cannot calibrate a projection (the message says why and what to do)."""


@dataclass(frozen=True)
class KindFraction:
    """One kernel kind's achieved share of the measuring GPU's roofline, in (0, 1], with its evidence."""

    kind: str
    fraction: float
    fraction_upper: float
    calls: int
    measured_ms: float
    roofline_ms: float
    gflop: float
    mb: float
    stand_in: str | None = None


@dataclass(frozen=True)
class Calibration:
    """Achieved fractions by workload (and :data:`POOLED`) and kernel kind, on one measuring GPU.

    Invariant: every fraction is in (0, 1]; every table names the same kinds as the pooled one or
    fewer."""

    device: str
    peak_gflops: float
    bandwidth_gbs: float
    fractions: Mapping[str, Mapping[str, KindFraction]]
    sources: Mapping[str, str]

    def for_workload(self, workload: str) -> tuple[str, Mapping[str, KindFraction]]:
        """The workload's own fractions where the calibration measured it, else the pooled ones; with
        the name of the table used."""
        name = workload if workload in self.fractions else POOLED
        return name, self.fractions[name]


def _kind_fraction(kind: str, rows: list[Mapping[str, Any]], peak_gflops: float, bandwidth_gbs: float) -> KindFraction:
    measured = sum(r["time_ms"] for r in rows)
    gflop = sum(r["gflop"] for r in rows)
    mb = sum(r["mb"] for r in rows)
    compute_ms, memory_ms = gflop / peak_gflops * 1e3, mb / bandwidth_gbs
    if measured <= 0:
        raise CalibrationError(f"kind {kind!r}: the records give it no measured time; profile the steps with "
                               "device timing on (torch_adreno.profile())")
    return KindFraction(kind, max(compute_ms, memory_ms) / measured, min(1.0, (compute_ms + memory_ms) / measured),
                        sum(r["calls"] for r in rows), measured, max(compute_ms, memory_ms), gflop, mb)


def _with_stand_ins(table: dict[str, KindFraction]) -> dict[str, KindFraction]:
    out = dict(table)
    for kind, entry in table.items():
        if entry.roofline_ms * 1e3 / entry.calls >= LATENCY_BOUND_US:
            continue
        stand_in = STAND_INS.get(kind)
        if stand_in is None or stand_in not in table:
            raise CalibrationError(
                f"kind {kind!r}: its launches average {entry.roofline_ms * 1e3 / entry.calls:.3f} us of roofline time "
                f"on the measuring GPU, too little to show a throughput, and it has no measured stand-in kind "
                f"(STAND_INS: {STAND_INS}); add one to torch_adreno.tools.bench.calibration.STAND_INS")
        borrowed = table[stand_in]
        out[kind] = KindFraction(kind, borrowed.fraction, borrowed.fraction_upper, entry.calls, entry.measured_ms,
                                 entry.roofline_ms, entry.gflop, entry.mb, stand_in)
    return out


def calibrate(records: Iterable[Mapping[str, Any]], peak_gflops: float,
              bandwidth_gbs: float) -> dict[str, dict[str, KindFraction]]:
    """Fractions by workload and kind (and pooled over workloads) from profiled-step records, each
    with ``workload`` and ``by_kind`` (``{kind: {calls, time_ms, gflop, mb}}``); several records of
    one workload pool their times."""
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise CalibrationError(f"the measuring GPU's peaks must be positive, got {peak_gflops} GFLOP/s and "
                               f"{bandwidth_gbs} GB/s")
    rows: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for record in records:
        for kind, row in record["by_kind"].items():
            rows.setdefault(record["workload"], {}).setdefault(kind, []).append(row)
            rows.setdefault(POOLED, {}).setdefault(kind, []).append(row)
    if not rows:
        raise CalibrationError("no profiled-step records to calibrate from (each needs 'workload' and 'by_kind')")
    return {workload: _with_stand_ins({kind: _kind_fraction(kind, kind_rows, peak_gflops, bandwidth_gbs)
                                       for kind, kind_rows in sorted(kinds.items())})
            for workload, kinds in sorted(rows.items())}


#: The reference GPU the stored calibration was measured on: the model its records' device names.
REFERENCE_GPU_MODEL = "H200"
#: The reference GPU's fp32 peak the fractions are of, and where it comes from (NVIDIA's datasheet).
REFERENCE_GPU_FP32_GFLOPS = 67_000.0
REFERENCE_GPU_FP32_SOURCE = ("NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: FP32 67 TFLOPS), "
                             "https://www.nvidia.com/en-us/data-center/h200/")
REFERENCE_GPU_HBM_NOMINAL_GBS = 4_800.0


def usable_record(record: Mapping[str, Any]) -> bool:
    """A ``benchmarks/workloads.py`` record of our replayed step profiled in full size on the reference GPU."""
    return (record.get("benchmark") == "workloads" and record.get("peer") == "ours"
            and REFERENCE_GPU_MODEL in record.get("device", "") and not record.get("small")
            and record.get("profiled_step_replayed") is True and isinstance(record.get("by_kind"), dict))


def calibration_data(records: Sequence[Mapping[str, Any]], files: str) -> dict[str, Any]:
    """The stored calibration's content (``calibration_reference_gpu.json``) from the usable records of
    ``benchmarks/workloads.py`` result files (named in ``files``), every number with its source: the
    fp32 peak NVIDIA's datasheet figure, the bandwidth the best copy bandwidth the records measured."""
    records = [r for r in records if usable_record(r)]
    measured = [r["device_peaks"] for r in records if isinstance(r.get("device_peaks"), dict)]
    if not records or not measured:
        raise CalibrationError(f"{files}: no usable records with measured device_peaks (benchmarks/workloads.py, "
                               "peer 'ours', full size, profiled step replayed, on the reference GPU)")
    bandwidth = max(p["bandwidth_gbs"] for p in measured)
    tables = calibrate(records, REFERENCE_GPU_FP32_GFLOPS, bandwidth)
    return {
        "device": records[0]["device"], "peak_gflops": REFERENCE_GPU_FP32_GFLOPS, "bandwidth_gbs": bandwidth,
        "sources": {
            "records": f"{files}: {len(records)} profiled replayed steps of our kernels "
                       f"({', '.join(sorted({r['workload'] for r in records}))}), dated "
                       f"{', '.join(sorted({r['date'] for r in records}))}, driver {records[0]['driver']}",
            "peak_gflops": f"{REFERENCE_GPU_FP32_SOURCE}; our FMA-chain micro-benchmark reached "
                           f"{min(p['gflops'] for p in measured) / 1e3:.1f}-{max(p['gflops'] for p in measured) / 1e3:.1f}"
                           " TFLOP/s (device_peaks of the records)",
            "bandwidth_gbs": f"the best of the records' measured copy bandwidths (device_peaks.bandwidth_gbs, "
                             f"{min(p['bandwidth_gbs'] for p in measured):.0f}-{bandwidth:.0f} GB/s: "
                             "torch_adreno.profiler.roofline's float4 stream kernel, read + write); HBM3e nominal "
                             f"{REFERENCE_GPU_HBM_NOMINAL_GBS:.0f} GB/s",
            "fraction": "the kind's roofline time (the larger of its summed GFLOP over peak_gflops and summed MB over "
                        "bandwidth_gbs) over its summed measured device time: a lower bound of the per-launch "
                        "fraction; fraction_upper adds the two times instead (an upper bound, capped at 1)",
            "stand_in": f"a kind whose launches average under {LATENCY_BOUND_US:g} us of roofline time measured the "
                        "GPU's per-kernel latency only; it takes the named kind's fractions",
            "generated_by": "python benchmarks/calibrate_projection.py",
        },
        "fractions": {workload: {kind: {k: v for k, v in asdict(entry).items() if k != "kind"}
                                 for kind, entry in kinds.items()} for workload, kinds in tables.items()},
    }


def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    """The calibration stored at ``path``, checked: every fraction in (0, 1] and a pooled table."""
    try:
        data = json.loads(path.read_text())
        tables = {workload: {kind: KindFraction(kind=kind, **entry) for kind, entry in kinds.items()}
                  for workload, kinds in data["fractions"].items()}
        calibration = Calibration(data["device"], float(data["peak_gflops"]), float(data["bandwidth_gbs"]), tables,
                                  data["sources"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CalibrationError(f"{path}: not a readable calibration ({type(error).__name__}: {error}); regenerate it "
                               "with python benchmarks/calibrate_projection.py") from error
    if POOLED not in tables:
        raise CalibrationError(f"{path}: no {POOLED!r} table; regenerate it with python benchmarks/calibrate_projection.py")
    bad = [f"{w}/{k}: {e.fraction}" for w, kinds in tables.items() for k, e in kinds.items() if not 0 < e.fraction <= 1]
    if bad:
        raise CalibrationError(f"{path}: fractions outside (0, 1] ({', '.join(bad)}): a measured time below the "
                               "roofline means the peaks are too low or the records wrong")
    return calibration


def fraction_of(fractions: Mapping[str, KindFraction], kind: str, table: str) -> float:
    """``kind``'s fraction in ``fractions`` (the table named ``table``), that of its stand-in in
    :data:`UNMEASURED_STAND_INS` where the table never measured it, or a clear error."""
    entry = fractions.get(kind)
    if entry is None and kind in UNMEASURED_STAND_INS:
        entry = fractions.get(UNMEASURED_STAND_INS[kind])
    if entry is None:
        raise CalibrationError(f"kernel kind {kind!r} is not in the calibration's {table!r} table (it has "
                               f"{', '.join(sorted(fractions))}): profile a step with such kernels on the GPU and "
                               "regenerate the calibration with python benchmarks/calibrate_projection.py")
    return entry.fraction
