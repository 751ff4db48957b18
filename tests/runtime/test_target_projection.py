"""Projection of a profiled step onto an Adreno target's roofline, and the `project` and `devices`
commands."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from torch_adreno.cli import main
from torch_adreno.profiler.roofline import project_step
from torch_adreno.targets.profiles import get_target
from torch_adreno.tools.bench.calibration import load_calibration

ADRENO740 = get_target("adreno740")  # 63 GB/s, 3700 GFLOP/s fp32


def _record(name: str, kind: str, nbytes: int, flops: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, kind=kind, bytes=nbytes, flops=flops)


def test_each_launch_is_placed_on_the_targets_roofline_plus_the_launch_cost():
    kernels = [_record("update", "segmented", 63_000, 0),          # 1 us of bytes at 63 GB/s
               _record("gemm", "gemm", 6_300, 3_700_000 * 2)]     # 0.1 us of bytes, 2 us of FLOPs at 3.7 TFLOP/s
    step = project_step(kernels, ADRENO740, copied_bytes=31_500, launch_us=10.0)
    update, gemm = step.kernels
    assert update.memory_bound and math.isclose(update.memory_us, 1.0) and update.compute_us == 0
    assert not gemm.memory_bound and math.isclose(gemm.compute_us, 2.0) and math.isclose(gemm.memory_us, 0.1)
    assert math.isclose(step.copy_us, 1.0)  # a copy reads and writes: 2 x 31.5 kB at 63 GB/s
    assert math.isclose(step.total_us, 1.0 + 2.0 + 2 * 10.0 + 1.0)
    assert math.isclose(step.data_movement_us, 2.0) and math.isclose(step.compute_us, 2.0)
    assert math.isclose(step.share(step.launches_us), 20 / 24)
    assert math.isclose(step.gemm_gflops, 7.4e6 / 12e3)  # FLOPs over (2 us + 10 us) of the GEMM
    # At the seed's 40 GFLOP/s the GEMM takes 185 us instead of 2.
    assert math.isclose(step.total_us_with_gemm_rate(40.0), step.total_us + 7.4e6 / 40e3 - 2.0)
    assert step.total_us_with_gemm_rate(1e9) == step.total_us


def test_bad_projection_inputs_are_refused():
    with pytest.raises(ValueError, match="per-launch cost"):
        project_step([], ADRENO740, launch_us=-1.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["project", "--target", "adreno999"], r"--target: invalid choice: 'adreno999' \(choose from .*adreno740"),
    (["project", "--model", "vgg"], r"--model: invalid choice: 'vgg' \(choose from .*seed_mlp"),
    (["project", "--launch-us", "-1"], r"--launch-us: expected a number >= 0, got '-1'"),
])
def test_bad_project_arguments_are_refused_by_name(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(("argv", "message"), [
    (["project", "--model", "gpt2_lora", "--profile-layers", "2", "1"], "expected two increasing depths, got 2 1"),
    (["project", "--model", "mlp", "--profile-layers", "1", "2"], "none of mlp has repeated blocks"),
    (["project", "--model", "mlp", "--calibration", "/nonexistent/calibration.json"],
     "--calibration: .*not a readable calibration.*calibrate_projection.py"),
])
def test_bad_calibration_arguments_are_refused_before_anything_is_profiled(capsys, argv, message):
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.device
def test_devices_shows_the_matched_profile_and_the_targets(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "Adreno profile: none" in out  # PoCL (or NVIDIA) is no Adreno
    for name in ("adreno640", "adreno650", "adreno660", "adreno730", "adreno740", "adreno750", "adreno830"):
        assert re.search(rf"^  {name}: Adreno \d+ \(Snapdragon", out, re.MULTILINE), name


@pytest.mark.device
def test_project_profiles_a_replayed_step_compiled_for_the_target(capsys, tmp_path, monkeypatch):
    from torch_adreno.tools.bench import projection

    profiled = []
    profile_step = projection.profile_step

    def keep(*args, **kwargs):
        profiled.append(profile_step(*args, **kwargs))
        return profiled[-1]

    monkeypatch.setattr(projection, "profile_step", keep)
    out_file = tmp_path / "projection.jsonl"
    assert main(["project", "--target", "adreno740", "--model", "seed_mlp", "--kernels", "--launch-us", "5",
                 "--jsonl", str(out_file)]) == 0
    out = capsys.readouterr().out
    (prof,) = profiled
    assert prof.replayed_steps == 1 and prof.kernel_launches > 0
    # The launches are the target's: GEMM tiles in local memory (PoCL itself gets the direct template).
    assert any(k.kind == "gemm" and k.local_size[0] * k.local_size[1] % 64 == 0 for k in prof.kernels)
    (row,) = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert row["model"] == "seed_mlp" and row["target"] == "adreno740" and row["launches"] == prof.kernel_launches
    assert math.isclose(row["launch_ms"], prof.kernel_launches * 5e-3)
    assert math.isclose(row["projected_ms"], row["roofline_ms"] + row["launch_ms"] + row["copy_ms"])
    assert math.isclose(row["mflop"], prof.flops / 1e6)
    assert "| seed_mlp | adreno740 |" in out and "Nothing here was measured on an Adreno" in out
    assert "forward_" in out and "memory" in out  # the per-kernel table
    # Both figures: the roofline's and the one calibrated by the reference GPU's measured fractions
    # (pooled: the calibration's records hold no seed MLP step), each kernel's roofline time over its kind's fraction.
    fractions = load_calibration().fractions["pooled"]
    kernels = project_step(prof.kernels, ADRENO740, launch_us=5.0).kernels
    assert row["calibration"] == "pooled" and row["profiled"] == "profiled"
    assert math.isclose(row["calibrated_kernel_ms"], sum(k.roofline_us / fractions[k.kind].fraction for k in kernels) / 1e3)
    assert math.isclose(row["calibrated_ms"], row["calibrated_kernel_ms"] + row["launch_ms"] + row["copy_ms"])
    assert row["calibrated_ms"] > row["projected_ms"]
    assert math.isclose(row["samples_per_s"], 32 / (row["projected_ms"] * 1e-3))
    assert math.isclose(row["samples_per_s_calibrated"], 32 / (row["calibrated_ms"] * 1e-3))
    assert "| projected step ms (roofline) | calibrated step ms |" in out
    assert f"| {row['projected_ms']:.3f} | {row['calibrated_ms']:.3f} (pooled) |" in out
    assert re.search(r"seed_mlp .*: profiled; calibration 'pooled': copies 0\.\d+ \(as pointwise\), gemm", out)


def test_project_records_projects_the_reference_gpus_recorded_steps_without_profiling(capsys, tmp_path):
    records = Path(__file__).parents[1] / "data" / "workloads_reference_gpu.jsonl"  # benchmarks/workloads.py there
    recorded = next(r for r in map(json.loads, records.read_text().splitlines())
                if r["workload"] == "gpt2_lora" and r["peer"] == "ours")
    out_file = tmp_path / "projection.jsonl"
    assert main(["project", "--records", str(records), "--model", "gpt2_lora", "--target", "adreno740",
                 "--jsonl", str(out_file)]) == 0
    out = capsys.readouterr().out
    (row,) = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert row["launches"] == recorded["launches"] and math.isclose(row["mflop"], recorded["gflop"] * 1e3)
    # Each kind's sums on the roofline: GEMMs compute-bound at 3.7 TFLOP/s, the rest bytes at 63 GB/s.
    kinds = recorded["by_kind"]
    # (a kind's launches as equal shares of its sums, rounded to whole bytes and FLOPs)
    assert row["roofline_kernel_ms_by_kind"]["gemm"] == pytest.approx(kinds["gemm"]["gflop"] / 3700 * 1e3, rel=1e-6)
    assert row["roofline_kernel_ms_by_kind"]["pointwise"] == pytest.approx(kinds["pointwise"]["mb"] / 63, rel=1e-6)
    fractions = load_calibration().fractions["gpt2_lora"]
    assert row["calibration"] == "gpt2_lora"
    for kind, ms in row["roofline_kernel_ms_by_kind"].items():
        assert math.isclose(row["calibrated_kernel_ms_by_kind"][kind], ms / fractions[kind].fraction)
    assert math.isclose(row["tokens_per_s"], 1024 / (row["projected_ms"] * 1e-3))
    assert math.isclose(row["tokens_per_s_calibrated"], 1024 / (row["calibrated_ms"] * 1e-3))
    assert f"recorded on the {recorded['device']}" in row["profiled"] and "| gpt2_lora | adreno740 |" in out
    assert main(["project", "--records", str(records), "--model", "lenet"]) == 2
    assert "has no profiled full-size step of lenet (it has gpt2_lora, mobilenet_v2, resnet18)" in capsys.readouterr().err
