"""The command line: devices, ops and the digits training demo (the main job)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


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
