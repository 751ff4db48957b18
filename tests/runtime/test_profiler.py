"""The profile's records and summaries, the Chrome trace, the roofline, and the benchmark suite."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.models import MODELS

pytestmark = pytest.mark.device


@pytest.fixture
def lenet_profile():
    spec = MODELS["lenet"]
    model = spec.make()
    x, y = spec.batch()
    step = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", options={"zero_copy": False})
    step(model, x, y).backward()
    with torch_adreno.profile() as prof:
        step(model, x, y).backward()
    return prof


def test_totals_are_sums_of_records(lenet_profile):
    prof = lenet_profile
    assert prof.kernel_launches == len(prof.kernels) > 0
    assert prof.bytes_kernel_read == sum(k.bytes_read for k in prof.kernels)
    assert prof.bytes_kernel_written == sum(k.bytes_written for k in prof.kernels)
    assert prof.flops == sum(k.flops for k in prof.kernels) > 0
    assert all(k.device_time_us is not None and k.device_time_us >= 0 for k in prof.kernels)
    assert prof.device_time_us == pytest.approx(sum(k.device_time_us for k in prof.kernels))
    copied = [t for t in prof.transfers if t.copied]
    assert prof.bytes_host_to_device + prof.bytes_device_to_host == sum(t.nbytes for t in copied)
    assert prof.wall_time_us >= prof.device_time_us
    for group_by in ("kernel", "op", "module", "graph"):
        rows = prof.grouped(group_by)
        assert sum(r["time"] for r in rows.values()) == pytest.approx(prof.device_time_us)
        assert sum(r["bytes"] for r in rows.values()) == pytest.approx(prof.bytes_kernel_read + prof.bytes_kernel_written)


def test_records_name_fx_nodes_modules_and_source_lines(lenet_profile):
    kernels = lenet_profile.kernels
    assert all(k.fx_nodes and k.aten_ops for k in kernels)
    modules = {m for k in kernels for m in k.modules}
    assert {"conv1", "conv2", "fc1"} <= modules
    assert any("models/reference.py" in line for k in kernels for line in k.source_lines)


def test_table_by_module_ranks_the_slowest_module(lenet_profile):
    text = lenet_profile.table(sort_by="device_time", group_by="module")
    first_row = text.splitlines()[6]
    slowest = max(lenet_profile.grouped("module").items(), key=lambda kv: kv[1]["time"])[0]
    assert first_row.startswith(slowest)
    with pytest.raises(ValueError, match="sort_by"):
        lenet_profile.table(sort_by="colour")
    with pytest.raises(ValueError, match="group_by"):
        lenet_profile.table(group_by="colour")


def test_roofline_classifies_kernels(lenet_profile):
    """Every kernel row is labelled by which side of the ridge its arithmetic intensity falls, with
    the fraction of that roof it reached."""
    prof = lenet_profile
    peaks = prof.device_peaks()
    assert peaks.bandwidth_gbs > 0 and peaks.gflops > 0
    rows = prof.grouped("kernel")
    text = prof.table(roofline=True, row_limit=len(rows))
    labelled = 0
    ordered = sorted(rows.items(), key=lambda kv: -kv[1]["time"])  # the table's order; it cuts names at 44
    lines = text.splitlines()[6:]
    assert len(lines) == len(ordered)
    for line, (name, row) in zip(lines, ordered, strict=True):
        assert line.startswith(name[:44]), (line, name)
        found = re.search(r"(memory|compute) \((\d+)%\)", line)
        if not row["time"]:
            assert found is None and line.split()[5] == "-", line
            continue
        assert found, line
        intensity = row["flops"] / row["bytes"] if row["bytes"] else float("inf")
        expected = "memory" if intensity < peaks.ridge else "compute"
        achieved = (row["bytes"] / 1e9 / peaks.bandwidth_gbs if expected == "memory" else
                    row["flops"] / 1e9 / peaks.gflops) / (row["time"] * 1e-6)
        assert found.group(1) == expected, (line, intensity, peaks.ridge)
        assert int(found.group(2)) == pytest.approx(100 * achieved, abs=1), line
        labelled += 1
    assert labelled == sum(1 for r in rows.values() if r["time"]) == len(rows)


@pytest.mark.parametrize(("flops", "bytes_", "bound", "percent"), [
    (10, 100, "memory", "5%"),  # 0.1 flop/byte below a ridge of 1: 1 GB/s of a 20 GB/s roof
    (1000, 100, "compute", "50%"),  # 10 flop/byte above it: 1 GFLOP/s of 2
])
def test_roofline_cell_sides_of_the_ridge(flops, bytes_, bound, percent):
    from torch_adreno.profiler import DevicePeaks

    peaks = DevicePeaks(bandwidth_gbs=20.0, gflops=2.0 if bound == "compute" else 20.0)
    seconds = bytes_ / 1e9 if bound == "memory" else flops / 1e9
    cells = torch_adreno.profile._roofline_cells({"time": seconds * 1e6, "flops": flops, "bytes": bytes_}, peaks)
    assert cells.split()[-2:] == [bound, f"({percent})"], cells


def test_chrome_trace_has_kernel_and_copy_lanes(lenet_profile, tmp_path):
    path = lenet_profile.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in trace if e.get("ph") == "X" and e["tid"] == 0]
    copies = [e for e in trace if e.get("ph") == "X" and e["tid"] == 1]
    assert len(kernels) == lenet_profile.kernel_launches
    assert copies and all(e["args"]["bytes"] >= 0 for e in copies)
    assert all(e["dur"] > 0 and e["ts"] >= 0 and "fx_nodes" in e["args"] for e in kernels)
    names = {e["args"]["name"] for e in trace if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert names == {"kernels", "copies"}


def test_suite_runs_end_to_end_on_a_tiny_configuration(tmp_path):
    from torch_adreno.tools.bench.suite import run_suite, summary_table

    records = run_suite(["mlp"], steps=2, out_dir=tmp_path, variants=["eager", "unfused", "fused+reuse"],
                        progress=False)
    variants = {r["variant"] for r in records}
    assert {"eager", "unfused", "fused+reuse"} <= variants
    lines = (tmp_path / "suite.jsonl").read_text().splitlines()
    assert len(lines) == len(records) and all(json.loads(line)["model"] == "mlp" for line in lines)
    assert (tmp_path / "suite.png").stat().st_size > 1000
    assert "fused+reuse" in summary_table(records)
