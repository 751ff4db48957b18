"""The command line: devices, ops and the digits training demo (the main job)."""

from __future__ import annotations

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
