"""The command line: devices, ops and the digits training demo (the main job)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch_adreno


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch_adreno", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.device
def test_devices_lists_capabilities():
    result = run("devices")
    assert result.returncode == 0, result.stderr
    assert re.search(r"\*\[\d+\] ", result.stdout)
    assert "work-group <=" in result.stdout and "unified memory" in result.stdout
    # PoCL and NVIDIA's driver have neither; an Adreno reports Qualcomm's recordable queues.
    assert "recordable queues (cl_qcom_recordable_queues) no" in result.stdout
    assert re.search(r"Replayed TrainingStep launch loop: (native \(|off |no C compiler|the )", result.stdout)
    # Per device, how a replayed step is enqueued: recorded in the driver, or launch by launch and why.
    paths = re.findall(r"replayed TrainingStep enqueues: (.*)", result.stdout)
    assert paths and all(p.startswith(("recorded once in a command buffer (cl_khr_command_buffer ", "launch by launch ("))
                         for p in paths), paths


def test_ops_lists_lowerings():
    result = run("ops")
    assert result.returncode == 0, result.stderr
    assert "aten.convolution_backward.default" in result.stdout


@pytest.mark.device
def test_train_reaches_ninety_percent_on_digits():
    result = run("train")
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", result.stdout).group(1))
    assert accuracy > 90.0
    assert re.search(r"per training step: \d+ kernel launches, \d+ B host->device, \d+ B device->host, "
                     r"0 host fallback ops", result.stdout)
    replayed, total = map(int, re.search(r"(\d+) of (\d+) steps replayed", result.stdout).groups())
    assert replayed == total - 2  # the first step compiles, the second captures


@pytest.mark.device
def test_opinfo_command_counts_and_writes_json_lines(tmp_path):
    out = tmp_path / "opinfo.jsonl"
    result = run("opinfo", "--ops", "neg", "mul", "--samples", "2", "--shard", "1/2", "--jsonl", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    # Shard 1 of 2 takes every second claimed entry from the second: one of the two asked for.
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["op"] for r in lines}) == 1 and all(r["passed"] for r in lines)
    assert re.search(r"total: \d+/\d+ samples pass \(100\.0%\) over 1 OpInfo entries", result.stdout)


@pytest.mark.device
def test_bench_shows_progress_and_writes_into_a_folder_of_the_current_directory(tmp_path):
    """A fresh process in an empty directory: the progress bar names what runs (compiling is most
    of a short run), and the results go to ./torch_adreno_bench, not into the package or checkout."""
    package = Path(torch_adreno.__file__).resolve().parent
    before = {p for p in package.parent.rglob("suite.*")}
    done = subprocess.run([sys.executable, "-m", "torch_adreno", "bench", "--models", "mlp", "--variants", "eager",
                           "unfused", "--steps", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(package.parent)}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    bar = done.stderr.replace("\r", "\n")
    assert "benchmark suite" in bar and "mlp unfused: compiling" in bar, bar
    assert re.search(r"\b9/9 \[", bar), bar  # eager: 2 warm-up + 2 timed; unfused: the same and 1 profiled
    out = tmp_path / "torch_adreno_bench"
    assert (out / "suite.jsonl").is_file() and (out / "suite.png").is_file()
    assert {json.loads(line)["variant"] for line in (out / "suite.jsonl").read_text().splitlines()} == {"eager",
                                                                                                       "unfused"}
    assert {p for p in package.parent.rglob("suite.*")} == before, "bench wrote into the package or checkout"


def test_bench_defaults_are_the_quick_run_and_full_is_the_suite():
    import argparse

    from torch_adreno.cli import bench as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    quick = parser.parse_args(["bench"])
    assert bench_cli.measured(quick) == (bench_cli.QUICK_MODELS, bench_cli.QUICK_STEPS)
    assert quick.out == Path("torch_adreno_bench") and not quick.out.is_absolute()
    full = parser.parse_args(["bench", "--full", "--out", "elsewhere"])
    assert bench_cli.measured(full) == (bench_cli.FULL_MODELS, bench_cli.FULL_STEPS) and full.out == Path("elsewhere")
    assert bench_cli.measured(parser.parse_args(["bench", "--full", "--steps", "3"]))[1] == 3
