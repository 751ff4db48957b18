"""The projection's calibration: kernel kinds' achieved fractions of the reference GPU's
roofline, stored with the package, and the calibrated projection they give."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torch_adreno.profiler.roofline import project_step
from torch_adreno.targets.profiles import get_target
from torch_adreno.tools.bench.calibration import (
    CALIBRATION_FILE,
    POOLED,
    REFERENCE_GPU_MODEL,
    Calibration,
    CalibrationError,
    KindFraction,
    calibrate,
    calibration_data,
    load_calibration,
)
from torch_adreno.tools.bench.projected_workloads import step_workloads
from torch_adreno.tools.bench.projection import step_totals

#: ``benchmarks/workloads.py`` records of our replayed step profiled on the reference GPU (2026-12-02): the input
#: the stored calibration was made from (``python benchmarks/calibrate_projection.py``).
REFERENCE_RESULTS = Path(__file__).parents[1] / "data" / "workloads_reference_gpu.jsonl"
ADRENO740 = get_target("adreno740")  # 63 GB/s, 3700 GFLOP/s fp32


def _row(calls: int, time_ms: float, gflop: float, mb: float) -> dict[str, float]:
    return {"calls": calls, "time_ms": time_ms, "gflop": gflop, "mb": mb}


def test_the_stored_calibration_loads_with_every_fraction_in_0_1():
    calibration = load_calibration()
    assert REFERENCE_GPU_MODEL in calibration.device and calibration.peak_gflops == 67_000.0
    assert 3_000 < calibration.bandwidth_gbs < 4_800  # measured copy bandwidth, below HBM3e's nominal
    assert {"resnet18", "mobilenet_v2", "gpt2_lora", POOLED} <= set(calibration.fractions)
    for workload, kinds in calibration.fractions.items():
        assert {"gemm", "pointwise", "reduction"} <= set(kinds), workload
        for kind, entry in kinds.items():
            assert 0 < entry.fraction <= entry.fraction_upper <= 1, (workload, kind)
            assert entry.calls > 0 and entry.measured_ms > 0
    # ResNet-18's GEMMs reach roughly a fifth of the reference GPU's fp32 peak.
    assert 0.1 < calibration.fractions["resnet18"]["gemm"].fraction < 0.3
    assert calibration.fractions["resnet18"]["copies"].stand_in == "pointwise"
    for source in ("records", "peak_gflops", "bandwidth_gbs", "fraction"):
        assert calibration.sources[source], source


def test_the_stored_calibration_is_what_the_reference_results_give():
    records = [json.loads(line) for line in REFERENCE_RESULTS.read_text().splitlines()]
    stored = json.loads(CALIBRATION_FILE.read_text())
    regenerated = calibration_data(records, "tests/data/workloads_reference_gpu.jsonl")
    # The stored file names the records' file as it was called when it was generated; what follows
    # the name (how many records, which workloads, their date and driver) must be the same.
    described = [s["sources"].pop("records").split(": ", 1)[1] for s in (regenerated, stored)]
    assert described[0] == described[1], described
    assert regenerated == stored, "stale: run python benchmarks/calibrate_projection.py"


def test_a_kinds_fraction_is_its_roofline_time_over_its_measured_time():
    records = [{"workload": "w", "by_kind": {
        "gemm": _row(2, 10.0, 100.0, 100.0),       # 100 GFLOP at 50 TFLOP/s: 2 ms; 100 MB at 1 TB/s: 0.1 ms
        "pointwise": _row(4, 1.0, 0.0, 400.0),     # 0.4 ms of bytes
        "copies": _row(1, 0.01, 0.0, 0.1)}}]       # 0.1 us: the GPU's latency, no throughput
    tables = calibrate(records, peak_gflops=50_000.0, bandwidth_gbs=1_000.0)
    gemm, pointwise, copies = (tables["w"][k] for k in ("gemm", "pointwise", "copies"))
    assert math.isclose(gemm.fraction, 2.0 / 10.0) and math.isclose(gemm.fraction_upper, 2.1 / 10.0)
    assert math.isclose(pointwise.fraction, 0.4)
    assert copies.stand_in == "pointwise" and copies.fraction == pointwise.fraction
    assert tables[POOLED]["gemm"] == gemm  # one workload: pooled is the same
    records[0]["by_kind"] = {"gemm": _row(1, 1.0, 0.001, 0.001)}  # latency-bound, no stand-in kind
    with pytest.raises(CalibrationError, match=r"'gemm'.*too little to show a throughput"):
        calibrate(records, peak_gflops=50_000.0, bandwidth_gbs=1_000.0)


def _calibration(gemm: float, pointwise: float) -> Calibration:
    def entry(kind: str, fraction: float) -> KindFraction:
        return KindFraction(kind, fraction, fraction, 1, 1.0, fraction, 0.0, 0.0)

    table = {"gemm": entry("gemm", gemm), "pointwise": entry("pointwise", pointwise)}
    return Calibration("GPU", 1.0, 1.0, {POOLED: table}, {})


def test_a_calibrated_projection_is_slower_by_each_kinds_fraction():
    kernels = [SimpleNamespace(name="gemm", kind="gemm", bytes=6_300, flops=3_700_000 * 2),   # 2 us of FLOPs
               SimpleNamespace(name="add", kind="pointwise", bytes=63_000, flops=0)]           # 1 us of bytes
    projection = project_step(kernels, ADRENO740, copied_bytes=31_500, launch_us=10.0)
    table, fractions = _calibration(gemm=0.25, pointwise=0.5).for_workload("resnet18")  # not measured: pooled
    assert table == POOLED
    totals = step_totals(projection, fractions, table, measured_here_us=0.0)
    assert math.isclose(totals.total_us, projection.total_us)
    assert math.isclose(totals.calibrated_us, 2.0 / 0.25 + 1.0 / 0.5)
    assert math.isclose(totals.calibrated_total_us, totals.calibrated_us + 20.0 + 1.0)  # launches, copies as they are
    # Compared per kind: pytest 9.2 refuses approx() of a dictionary of tuples.
    assert sorted(totals.by_kind) == ["gemm", "pointwise"]
    assert totals.by_kind["gemm"] == pytest.approx((2.0, 8.0))
    assert totals.by_kind["pointwise"] == pytest.approx((1.0, 2.0))
    # A profile at 1 and 2 blocks extrapolates to 12 as the 12-block profile projects.
    block = step_totals(project_step(kernels[1:], ADRENO740, launch_us=10.0), fractions, table, 0.0)
    deep = step_totals(project_step(kernels + kernels[1:] * 11, ADRENO740, 31_500, 10.0), fractions, table, 0.0)
    two = step_totals(project_step(kernels + kernels[1:], ADRENO740, 31_500, 10.0), fractions, table, 0.0)
    extrapolated = totals.plus(two.plus(totals, -1.0), 11.0)
    assert extrapolated.calibrated_total_us == pytest.approx(deep.calibrated_total_us)
    assert extrapolated.launches == deep.launches == 13 and block.launches == 1
    # A fused attention kernel (newer than the calibration's records) is projected as a GEMM, and said so.
    attention = [SimpleNamespace(name="sdpa", kind="attention", bytes=6_300, flops=3_700_000 * 2)]
    assert math.isclose(step_totals(project_step(attention, ADRENO740), fractions, table, 0.0).calibrated_us, 8.0)
    kernels.append(SimpleNamespace(name="sum", kind="reduction", bytes=1, flops=0))
    with pytest.raises(CalibrationError, match="kind 'reduction' is not in the calibration's 'pooled' table"):
        step_totals(project_step(kernels, ADRENO740), fractions, table, 0.0)


@pytest.mark.parametrize(("content", "message"), [
    ("{", "not a readable calibration"),
    (json.dumps({"device": "G", "peak_gflops": 1, "bandwidth_gbs": 1, "sources": {}, "fractions": {}}), "no 'pooled'"),
    (json.dumps({"device": "G", "peak_gflops": 1, "bandwidth_gbs": 1, "sources": {}, "fractions": {POOLED: {"gemm": {
        "fraction": 1.5, "fraction_upper": 1.5, "calls": 1, "measured_ms": 1, "roofline_ms": 1.5, "gflop": 1, "mb": 1,
        "stand_in": None}}}}), r"outside \(0, 1\] \(pooled/gemm: 1.5\)"),
], ids=["not JSON", "no pooled table", "a fraction above 1"])
def test_a_bad_calibration_file_is_refused_with_what_to_do(tmp_path, content, message):
    path = tmp_path / "calibration.json"
    path.write_text(content)
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


def test_the_real_workloads_have_their_shapes_and_calibration_tables():
    workloads = step_workloads()
    generator = torch.Generator().manual_seed(0)
    for name, batch, table in (("resnet18", 16, "resnet18"), ("resnet18_b32", 32, "resnet18"),
                               ("mobilenet_v2", 16, "mobilenet_v2"), ("mobilenet_v2_b32", 32, "mobilenet_v2")):
        x, y = workloads[name].batch(generator)
        assert x.shape == (batch, 3, 224, 224) and y.shape == (batch,)
        assert workloads[name].calibration == table and workloads[name].unit == "images"
    for name, seq in (("gpt2_lora", 256), ("gpt2_lora_s512", 512)):
        work = workloads[name]
        tokens, targets = work.batch(generator)
        assert tokens.shape == targets.shape == (4, seq) and work.items == 4 * seq and work.unit == "tokens"
        assert work.layers == 12 and work.calibration == "gpt2_lora"
        shallow = work.with_layers(2)
        assert shallow.layers == 2 and shallow.items == work.items and shallow.gpt2.seq == seq
    with pytest.raises(ValueError, match="no repeated blocks"):
        workloads["resnet18"].with_layers(2)
