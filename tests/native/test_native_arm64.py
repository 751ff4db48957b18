"""The phone's binary, run: the aarch64 ``torch-adreno-step`` (zig's cross build, as ``native build
--target linux-aarch64`` makes it) trains an exported LeNet step under ``qemu-aarch64`` with
Debian's arm64 PoCL 3.1 as its OpenCL runtime, and gives the x86-64 build's losses and state.

``native/tools/arm64_sysroot.py`` fetches the emulator and the runtime (no root, nothing installed)
into torch_adreno's cache root and keeps them, with PoCL's kernel cache and the runtime's program
cache: a first run fetches about 115 MB and builds every program under emulation (minutes); the
runs after it take seconds. Under CI the test never skips: a machine that cannot fetch or run
them fails it."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import in_ci
from native_fixtures import ROOT, build_once
from onnx import numpy_helper
from safetensors.numpy import load_file

pytestmark = pytest.mark.device

STEPS = 3
#: How far the aarch64 run's losses and state may be from the x86-64 run's.
TOLERANCE = 1e-5


def _load_tool():
    spec = importlib.util.spec_from_file_location("arm64_sysroot", ROOT / "native" / "tools" / "arm64_sysroot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


arm64 = _load_tool()


@pytest.fixture(scope="module")
def emulation() -> Path:
    try:
        return arm64.prepare()
    except arm64.EmulationUnavailable as err:
        if in_ci():
            pytest.fail(f"CI=true: aarch64 emulation cannot be set up here: {err}", pytrace=False)
        pytest.skip(f"aarch64 emulation cannot be set up here (a tool not installed?): {err}")


def _losses(done: subprocess.CompletedProcess[str]) -> list[float]:
    assert done.returncode == 0, done.stderr[-3000:]
    return [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("step ")]


def test_the_aarch64_binary_trains_lenet_under_qemu_as_the_x86_64_build_does(native, environment, platforms, exported,
                                                                            emulation, tmp_path_factory,
                                                                            tmp_path) -> None:
    built = build_once(tmp_path_factory, "native-aarch64", target="linux-aarch64")
    header = built.executable.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and struct.unpack("<H", header[18:20])[0] == 183  # EM_AARCH64: not this host's
    step, data = exported("digits")  # LeNet on the digits, batch 64
    arm_state, host_state = tmp_path / "arm.safetensors", tmp_path / "host.safetensors"
    arm = subprocess.run(arm64.command(emulation, built.executable, "train", str(step), "--data", str(data), "--steps",
                                       str(STEPS), "--out", str(arm_state)),
                         capture_output=True, text=True, env=arm64.environment(emulation), timeout=1500)
    assert "on Portable Computing Language: pthread, driver 3.1" in arm.stdout, arm.stdout + arm.stderr[-3000:]
    device = next((p for p in platforms if p == "Portable Computing Language"), platforms[0])
    host = subprocess.run([str(native.executable), "train", str(step), "--data", str(data), "--steps", str(STEPS),
                           "--out", str(host_state), "--device", device, "--no-cache"],
                          capture_output=True, text=True, env=environment, timeout=600)
    theirs, ours = _losses(arm), _losses(host)
    assert len(theirs) == len(ours) == STEPS
    assert np.allclose(theirs, ours, rtol=0, atol=TOLERANCE), (theirs, ours)
    trained, reference = load_file(str(arm_state)), load_file(str(host_state))
    assert sorted(trained) == sorted(reference)
    for name, value in reference.items():
        assert np.allclose(trained[name], value, rtol=0, atol=TOLERANCE), name
    initial = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(step)).graph.initializer}
    assert not np.array_equal(trained["fc1.weight"], initial["fc1.weight"])  # it trained
