"""Devices are probed, a broken one is listed with its reason and never crashes
discovery, and pip-installed drivers (Intel's CPU runtime) are registered with the ICD loader.

The broken device is simulated on any machine: the probe's build is made to fail with the error
pyopencl's PoCL 3.0 gives on a CPU its LLVM 14 does not know (AMD Zen 5)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import torch_adreno.runtime.device as device_module
from torch_adreno import cli
from torch_adreno.errors import DeviceNotFoundError
from torch_adreno.opencl_drivers import register_pip_drivers, vendor_entries

ZEN5_ERROR = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
              "Build on <pyopencl.Device 'pthread-AMD EPYC 9B45'>:\n\nerror: unknown target CPU 'generic'\n"
              "note: valid target CPU values are: nocona, core2, ...")


class _Failing(set):
    """Device indices whose probe fails; adding some forgets the probes made so far."""

    def add(self, index: int) -> None:
        super().add(index)
        device_module._probes.clear()

    def update(self, *indices) -> None:
        super().update(*indices)
        device_module._probes.clear()


@pytest.fixture
def broken(monkeypatch):
    """Make the probe fail on the devices whose index is in the returned set (fresh probes)."""
    failing = _Failing()
    real_build = device_module._build_probe
    by_pointer = {e.device.int_ptr: e.index for e in device_module.list_devices()}

    def build(dev):
        if by_pointer.get(dev.int_ptr) in failing:
            raise RuntimeError(ZEN5_ERROR)
        return real_build(dev)

    monkeypatch.setattr(device_module, "_build_probe", build)
    monkeypatch.setattr(device_module, "_probes", {})
    monkeypatch.setattr(device_module, "_skipped_logged", set())
    monkeypatch.delenv(device_module.ENV_DEVICE, raising=False)
    return failing


@pytest.mark.device
def test_a_device_that_cannot_build_is_unusable_with_the_drivers_reason(broken) -> None:
    entries = device_module.list_devices()
    broken.add(entries[0].index)
    entry = device_module.list_devices()[0]
    assert entry.unusable == "its OpenCL driver cannot build a kernel: error: unknown target CPU 'generic'"
    with pytest.raises(DeviceNotFoundError, match=r"cannot be used: .*unknown target CPU 'generic'"):
        device_module.select_device(0)


@pytest.mark.device
def test_the_default_skips_a_broken_device_and_logs_it_once(broken, caplog) -> None:
    working = [e for e in device_module.list_devices() if e.unusable is None]
    default = device_module.select_device(None)
    broken.add(default.index)
    if len(working) == 1:  # (on a Zen 5 the bundled PoCL is broken already)
        with pytest.raises(DeviceNotFoundError, match="no OpenCL device here can build a kernel") as error:
            device_module.select_device(None)
        assert "pip install intel-opencl-rt" in str(error.value)
        return
    with caplog.at_level(logging.WARNING, logger="torch_adreno"):
        chosen = device_module.select_device(None)
        device_module.select_device(None)
    assert chosen.index != default.index and chosen.unusable is None
    skipped = [r for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(skipped) == 1 and "unknown target CPU" in skipped[0].getMessage()
    assert device_module.get_runtime(None).entry.index == chosen.index


@pytest.mark.device
def test_no_working_device_is_one_error_that_says_what_to_install(broken) -> None:
    broken.update(e.index for e in device_module.list_devices())
    with pytest.raises(DeviceNotFoundError) as error:
        device_module.get_runtime(None)
    message = str(error.value)
    assert "unknown target CPU 'generic'" in message
    assert "pip install intel-opencl-rt" in message and "pocl-opencl-icd" in message


@pytest.mark.device
def test_devices_lists_a_broken_device_with_its_reason_and_exits_0(broken, capsys) -> None:
    entries = device_module.list_devices()
    broken.add(entries[-1].index)
    code = cli.main(["devices"])
    out = capsys.readouterr().out
    assert f"[{entries[-1].index}] {entries[-1].label}" in out
    assert "unusable: its OpenCL driver cannot build a kernel: error: unknown target CPU 'generic'" in out
    if any(e.unusable is None for e in device_module.list_devices()):
        assert code == 0 and "* = default device" in out
    else:
        assert code == 1 and "pip install intel-opencl-rt" in out


# -- pip-installed drivers and the ICD loader (no device) ---------------------------------------


def test_vendor_directory_keeps_the_systems_drivers_and_adds_the_pip_ones(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    (system / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    library = tmp_path / "lib" / "libintelocl.so"
    library.parent.mkdir()
    library.write_text("")
    entries = vendor_entries({"intel-opencl-rt": library}, system)
    assert entries == {"nvidia.icd": "libnvidia-opencl.so.1\n", "torch-adreno-intel-opencl-rt.icd": f"{library}\n"}
    (system / "intel.icd").write_text(f"{library}\n")  # already registered by the system: not twice
    assert list(vendor_entries({"intel-opencl-rt": library}, system)) == ["intel.icd", "nvidia.icd"]


def test_registration_writes_the_directory_and_never_overrides_the_user(tmp_path: Path, monkeypatch) -> None:
    library = tmp_path / "libintelocl.so"
    library.write_text("")
    monkeypatch.setattr("torch_adreno.opencl_drivers.pip_driver_libraries", lambda: {"intel-opencl-rt": library})
    environ = {"TORCH_ADRENO_CACHE": str(tmp_path / "cache")}
    directory = register_pip_drivers(environ, system=tmp_path / "none")
    assert directory is not None and environ["OCL_ICD_VENDORS"] == str(directory)
    assert (directory / "torch-adreno-intel-opencl-rt.icd").read_text() == f"{library}\n"
    for variable in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES"):
        mine = {"TORCH_ADRENO_CACHE": str(tmp_path / "cache"), variable: "/my/choice"}
        assert register_pip_drivers(mine, system=tmp_path / "none") is None
        assert mine[variable] == "/my/choice" and set(mine) == {"TORCH_ADRENO_CACHE", variable}
    monkeypatch.setattr("torch_adreno.opencl_drivers.pip_driver_libraries", dict)
    assert register_pip_drivers({}, system=tmp_path / "none") is None


def test_the_installed_pip_driver_is_registered_in_this_process() -> None:
    """The test extra installs Intel's CPU runtime on x86-64 Linux: importing torch_adreno made it
    visible, before pyopencl loaded the ICD loader."""
    import os
    import platform

    from torch_adreno.opencl_drivers import pip_driver_libraries

    if platform.machine() != "x86_64" or not pip_driver_libraries():
        pytest.skip("intel-opencl-rt is installed on x86-64 Linux only")
    if not os.environ.get("OCL_ICD_VENDORS", "").rstrip("/").endswith("opencl-vendors"):
        pytest.skip("OCL_ICD_VENDORS was set by the user: the loader reads their drivers, not ours")
    labels = [e.label for e in device_module.list_devices()]
    assert any(label.startswith("Intel(R) OpenCL") for label in labels), labels


def test_a_pip_driver_that_cannot_load_is_reported_not_silently_skipped(tmp_path: Path) -> None:
    from torch_adreno.opencl_drivers import load_failures

    broken_library = tmp_path / "libintelocl.so"
    broken_library.write_bytes(b"not an ELF file")
    failures = load_failures({"intel-opencl-rt": broken_library})
    assert set(failures) == {"intel-opencl-rt"} and str(broken_library) in failures["intel-opencl-rt"]
    assert load_failures({}) == {}
