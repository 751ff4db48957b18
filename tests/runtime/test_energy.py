"""Energy: the readers of the device's counters (a phone's sysfs laid out in a temporary directory,
NVML through a stand-in of the pynvml module: neither device is here), the profile's report of
energy where nothing can be read, and the arithmetic of the projected energy per step."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torch_adreno.cli import main
from torch_adreno.profiler.energy import (
    BATTERY,
    KGSL,
    DeviceIdentity,
    EnergyReading,
    NvmlMeter,
    Unmeasured,
    integrate,
    open_battery_meter,
    open_meter,
    open_nvml_meter,
    window_energy,
)
from torch_adreno.profiler.report import energy_line
from torch_adreno.targets import REFERENCE_PROFILE
from torch_adreno.targets.energy import DRAM_PJ_PER_BYTE, GPU_PJ_PER_FLOP, energy_costs, project_energy
from torch_adreno.targets.profiles import derive_target, get_target, target_of_device

# ---- Android: a phone's sysfs in a temporary directory ---------------------------------------------


def _phone(root: Path, current_ua: str, voltage_uv: str, status: str = "Discharging", kgsl: bool = True) -> Path:
    """Files as a Qualcomm phone's kernel lays them out (power_supply class, kgsl's pwrctrl)."""
    battery = root / BATTERY
    battery.mkdir(parents=True)
    (battery / "current_now").write_text(current_ua + "\n")
    (battery / "voltage_now").write_text(voltage_uv + "\n")
    (battery / "status").write_text(status + "\n")
    if kgsl:
        gpu = root / KGSL
        gpu.mkdir(parents=True)
        (gpu / "gpu_busy_percentage").write_text("63 %\n")  # kgsl_pwrctrl_gpu_busy_percentage_show: "%d %%\n"
        (gpu / "gpuclk").write_text("680000000\n")
    return root


def _window(meter: Any, seconds: float = 0.12) -> EnergyReading:
    meter.start()
    time.sleep(seconds)
    return meter.stop()


def test_the_battery_meter_integrates_current_times_voltage_and_reports_kgsl(tmp_path):
    # Discharging at 1.5 A (negative: the kernel ABI's sign; some vendors report it positive) at 3.9 V.
    root = _phone(tmp_path, "-1500000", "3900000")
    reading = _window(open_battery_meter(root))
    assert reading.measured and reading.samples >= 3
    # 5.85 W over the samples' span, which is the window less the last sample's read.
    assert reading.joules == pytest.approx(5.85 * reading.seconds, rel=0.15)
    assert "battery current_now x voltage_now" in reading.source and "whole phone" in reading.source
    assert any("kgsl: GPU busy 63% at 680 MHz" in note for note in reading.notes)
    assert any("shorter than the 1 s" in note for note in reading.notes)  # a 0.12 s window is flagged


def test_the_battery_meter_follows_a_changing_draw(tmp_path):
    """The integral sees the draw change in the window: 2 W, then 8 W."""
    root = _phone(tmp_path, "500000", "4000000", kgsl=False)
    meter = open_battery_meter(root)
    meter.start()
    time.sleep(0.1)
    (root / BATTERY / "current_now").write_text("2000000\n")
    time.sleep(0.1)
    reading = meter.stop()
    assert reading.measured and not any("kgsl" in n for n in reading.notes)
    mean_watts = reading.joules / reading.seconds
    assert 2.5 < mean_watts < 7.5, mean_watts


@pytest.mark.parametrize(("current", "voltage", "status", "reason"), [
    ("1500000", "3900000", "Charging", "battery is Charging.*charger's current"),
    ("1500000", "3900000", "Full", "battery is Full"),
    ("1500", "3900000", "Discharging", "no phone's draw.*does not report µA and µV"),  # a driver reporting mA
    ("n/a", "3900000", "Discharging", "current_now: expected a number, read 'n/a'"),
])
def test_the_battery_meter_measures_nothing_it_cannot_trust(tmp_path, current, voltage, status, reason):
    reading = _window(open_battery_meter(_phone(tmp_path, current, voltage, status)), 0.05)
    assert reading.joules is None and reading.source == "not measured"
    assert re.search(reason, reading.reason), reading.reason


def test_no_battery_files_is_a_reason_naming_them(tmp_path):
    meter = open_battery_meter(tmp_path)
    assert isinstance(meter, Unmeasured) and "power_supply/battery/current_now" in meter.reason
    reading = _window(meter, 0.01)
    assert reading.joules is None and "no battery current and voltage" in reading.reason


def test_an_adreno_device_is_read_from_the_phones_battery(tmp_path):
    root = _phone(tmp_path, "-1000000", "4000000")
    adreno = DeviceIdentity("QUALCOMM Adreno(TM) 740", "QUALCOMM")
    reading = _window(open_meter(adreno, sysfs_root=root))
    assert reading.measured and reading.joules == pytest.approx(4.0 * reading.seconds, rel=0.15)


def test_integrate_is_the_trapezoid_rule():
    assert integrate([(0.0, 2.0), (1.0, 4.0), (3.0, 4.0)]) == pytest.approx(3.0 + 8.0)
    assert integrate([(5.0, 9.0)]) == 0.0 and integrate([]) == 0.0


# ---- NVML through a stand-in of pynvml --------------------------------------------------------------


class _NVMLError(Exception):
    pass


class _FakeNvml:
    """The pynvml calls the meter makes, over a list of GPUs: (name, (domain, bus, device), energy
    counter in mJ or None where the GPU has none, power in mW)."""

    NVMLError = _NVMLError

    def __init__(self, gpus: list[tuple[str, tuple[int, int, int], int | None, int]], init_error: str | None = None):
        self.gpus, self.init_error = gpus, init_error
        self.counter_reads = 0
        self.open = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise _NVMLError(self.init_error)
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.gpus[handle][0].encode()  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        domain, bus, device = self.gpus[handle][1]
        return SimpleNamespace(domain=domain, bus=bus, device=device)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        counter = self.gpus[handle][2]
        if counter is None:
            raise _NVMLError("Not Supported")
        self.counter_reads += 1
        return counter + 3500 * (self.counter_reads - 1)  # 3.5 J between two reads

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self.gpus[handle][3]


#: Two GPUs of one model (same name) at different PCI addresses.
TWIN_GPUS = [("NVIDIA Data Center GPU", (0, 0x17, 0), 1_000_000, 300_000),
             ("NVIDIA Data Center GPU", (0, 0x2A, 0), 9_000_000, 700_000)]


def test_nvml_reads_the_energy_counter_of_the_gpu_at_the_opencl_devices_pci_address():
    nvml = _FakeNvml(TWIN_GPUS)
    meter = open_nvml_meter(nvml, (0, 0x2A, 0), "NVIDIA Data Center GPU")
    assert isinstance(meter, NvmlMeter) and meter.handle == 1  # the second GPU: its PCI bus, not its name
    reading = _window(meter, 0.01)
    assert reading.joules == pytest.approx(3.5) and reading.samples == 0
    assert reading.source == "NVML total energy counter of NVIDIA Data Center GPU at 0000:2a:00"
    assert nvml.open == 0  # NVML shut down again


def test_nvml_samples_and_integrates_power_where_there_is_no_counter():
    nvml = _FakeNvml([("Tesla P100", (0, 3, 0), None, 250_000)])  # Pascal: no energy counter
    reading = _window(open_nvml_meter(nvml, None, "Tesla P100"))
    assert reading.measured and reading.samples >= 3 and "sampled every 20 ms" in reading.source
    assert reading.joules == pytest.approx(250.0 * reading.seconds, rel=0.15)
    assert "matched to NVML by name: Tesla P100" in reading.notes


@pytest.mark.parametrize(("nvml", "pci", "name", "reason"), [
    (_FakeNvml([], init_error="NVML Shared Library Not Found"), None, "x",
     r"NVML cannot start \(NVML Shared Library Not Found\)"),
    (_FakeNvml(TWIN_GPUS), (0, 0x99, 0), "NVIDIA Data Center GPU",
     r"no NVML GPU match PCI 0000:99:00 \(NVML has: NVIDIA Data Center GPU at 0000:17:00; NVIDIA Data Center GPU at 0000:2a:00\)"),
    (_FakeNvml(TWIN_GPUS), None, "NVIDIA Data Center GPU", r"2 NVML GPUs match name 'NVIDIA Data Center GPU'"),
    (_FakeNvml(TWIN_GPUS), None, "pthread-AMD EPYC", r"no NVML GPU match name 'pthread-AMD EPYC'"),
])
def test_an_unmatched_or_unreadable_gpu_is_a_reason_not_a_number(nvml, pci, name, reason):
    meter = open_meter(DeviceIdentity(name, "vendor", pci), nvml=nvml)
    assert isinstance(meter, Unmeasured)
    assert re.search(reason, meter.reason) and meter.reason.startswith(f"{name}: ")
    assert nvml.open == 0


def test_the_real_nvml_bindings_say_why_nvml_cannot_start_here():
    """nvidia-ml-py (the test extra's) without an NVIDIA driver: NVML's own error is the reason."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        refused = str(error)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts on this machine (an NVIDIA driver is installed): nothing refuses here")
    meter = open_meter(DeviceIdentity("NVIDIA Data Center GPU", "NVIDIA Corporation", (0, 0x17, 0)), nvml=pynvml)
    assert isinstance(meter, Unmeasured)
    assert meter.reason == f"NVIDIA Data Center GPU: NVML cannot start ({refused}): no NVIDIA driver here, so no GPU energy counter"
    reading = _window(meter, 0.01)
    assert reading.joules is None and reading.describe() == f"not measured: {meter.reason}"


def test_a_window_with_remote_launches_reads_no_energy_of_this_machine():
    """A TrainingStep on a step server reports its launches with the remote device's times: this
    machine's counter did not see them."""
    here = EnergyReading(12.0, "NVML total energy counter of NVIDIA Data Center GPU at 0000:17:00", None, 1.5)
    assert window_energy(here, 0) is here
    remote = window_energy(here, 40)
    assert remote.joules is None and remote.seconds == 1.5
    assert remote.reason.startswith("40 launches of the window ran on a remote device")


def test_the_energy_line_gives_joules_per_step_or_the_reason():
    reading = EnergyReading(12.0, "NVML total energy counter of NVIDIA Data Center GPU at 0000:17:00", None, 1.5)
    assert energy_line(reading, 60) == ("energy: 12 J over 1.500 s (NVML total energy counter of NVIDIA Data Center GPU at "
                                        "0000:17:00); 0.2 J per step (60 steps)")
    assert energy_line(reading, 0).endswith("per step: no TrainingStep call in the window")
    assert energy_line(EnergyReading(None, "not measured", "no counter"), 3) == "energy: not measured: no counter"


@pytest.mark.device
def test_the_profile_reports_energy_as_not_measured_here_with_the_reason():
    """No power counter on this machine's OpenCL devices (CPU runtimes, no NVIDIA driver): the
    profile's energy is None, with a reason naming what could not be read, in its table too."""
    import torch
    import torch.nn.functional as F

    import torch_adreno

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    with torch_adreno.TrainingStep(model, lambda m, a, b: F.cross_entropy(m(a), b), opt) as step:
        step(x, y)
        with torch_adreno.profile() as prof:
            step(x, y)
            step(x, y)
    assert len(prof.steps) == 2 and prof.kernel_launches > 0
    assert prof.energy_joules is None and prof.energy_per_step_joules is None
    assert prof.energy_source == "not measured"
    assert "NVML" in prof.energy_reason or "nvidia-ml-py" in prof.energy_reason
    assert prof.energy.seconds > 0
    assert f"energy: not measured: {prof.energy_reason}" in prof.table().splitlines()
    with torch_adreno.profile(energy=False) as off:
        pass
    assert off.energy_joules is None and off.energy_reason == "profile(energy=False)"


# ---- projected energy per step ------------------------------------------------------------------


def test_projected_energy_is_bytes_and_flops_at_the_targets_figures():
    adreno740 = get_target("adreno740")
    costs = energy_costs(adreno740)
    assert costs.memory == "LPDDR5X" and costs.pj_per_byte == DRAM_PJ_PER_BYTE["LPDDR5X"][0] == pytest.approx(35.84)
    assert costs.pj_per_flop["fp32"] == pytest.approx(7.5 / 3.7) and costs.pj_per_flop["fp16"] == pytest.approx(7.5 / 7.4)
    assert all(costs.sources[k] for k in ("memory", "pj_per_byte", "pj_per_flop_fp32", "pj_per_flop_fp16"))
    # 1 MB of kernel traffic, 10 kB copied (read and written: 20 kB of DRAM), 1 GFLOP.
    step = project_energy(costs, 1e6, 1e4, 1e9)
    assert step.dram_joules == pytest.approx(35.84e-6) and step.copy_joules == pytest.approx(2 * 1e4 * 35.84e-12)
    assert step.arithmetic_joules == pytest.approx(1e9 * 7.5 / 3.7 * 1e-12)
    assert step.total_joules == pytest.approx(step.dram_joules + step.copy_joules + step.arithmetic_joules)
    assert project_energy(costs, 1e6, 1e4, 1e9, "fp16").arithmetic_joules == pytest.approx(step.arithmetic_joules / 2)
    # Every named target has figures, each with a source; a derived profile keeps its base's.
    for name in ("adreno640", "adreno650", "adreno660", "adreno730", "adreno750", "adreno830"):
        assert energy_costs(get_target(name)).pj_per_byte > 0
    assert set(GPU_PJ_PER_FLOP) == {get_target(n).gpu for n in ("adreno640", "adreno650", "adreno660", "adreno730",
                                                                 "adreno740", "adreno750", "adreno830")}
    derived = energy_costs(derive_target("adreno740", "my_phone", "its clinfo", max_alloc_bytes=256 << 20))
    assert derived.target == "my_phone" and (derived.pj_per_byte, derived.pj_per_flop) == (costs.pj_per_byte,
                                                                                           costs.pj_per_flop)


def test_bad_energy_inputs_are_refused():
    costs = energy_costs(get_target("adreno740"))
    with pytest.raises(ValueError, match="arithmetic must be one of fp32, fp16, got 'bf16'"):
        project_energy(costs, 1, 1, 1, "bf16")
    with pytest.raises(ValueError, match=">= 0"):
        project_energy(costs, -1, 0, 0)
    remote = target_of_device("phone", REFERENCE_PROFILE)
    with pytest.raises(ValueError, match="no energy figures for target 'phone'"):
        energy_costs(remote)


def test_project_adds_each_targets_energy_per_step_to_a_recorded_step(capsys, tmp_path):
    """The reference GPU's recorded GPT-2 LoRA step (kinds' sums of bytes and FLOPs, its copies) projected:
    the energy per step is those sums at each target's figures."""
    records = Path(__file__).parents[1] / "data" / "workloads_reference_gpu.jsonl"
    recorded = next(r for r in map(json.loads, records.read_text().splitlines())
                if r["workload"] == "gpt2_lora" and r["peer"] == "ours")
    out_file = tmp_path / "projection.jsonl"
    assert main(["project", "--records", str(records), "--model", "gpt2_lora", "--target", "adreno640", "adreno750",
                 "--jsonl", str(out_file)]) == 0
    out = capsys.readouterr().out
    rows = {r["target"]: r for r in map(json.loads, out_file.read_text().splitlines())}
    kernel_bytes = sum(round(k["mb"] * 1e6 / k["calls"]) * k["calls"] for k in recorded["by_kind"].values())
    flops = sum(round(k["gflop"] * 1e9 / k["calls"]) * k["calls"] for k in recorded["by_kind"].values())
    copied = recorded["h2d_bytes"] + recorded["d2h_bytes"]
    for name, row in rows.items():
        costs = energy_costs(get_target(name))
        dram_mj = kernel_bytes * costs.pj_per_byte * 1e-9
        copy_mj = 2 * copied * costs.pj_per_byte * 1e-9
        arithmetic_mj = flops * costs.pj_per_flop["fp32"] * 1e-9
        assert row["energy_dram_mj"] == pytest.approx(dram_mj) and row["energy_copy_mj"] == pytest.approx(copy_mj)
        assert row["energy_arithmetic_mj"] == pytest.approx(arithmetic_mj)
        assert row["energy_mj"] == pytest.approx(dram_mj + copy_mj + arithmetic_mj)
        assert row["energy_mj_per_token"] == pytest.approx(row["energy_mj"] / 1024)
        assert math.isclose(row["energy_mj_fp16_arithmetic"], dram_mj + copy_mj + arithmetic_mj / 2)
        assert row["energy_memory"] == costs.memory and row["energy_sources"] == costs.sources
    assert rows["adreno640"]["energy_memory"] == "LPDDR4X" and rows["adreno750"]["energy_memory"] == "LPDDR5X"
    assert f"| {rows['adreno750']['energy_mj']:.3g} (" in out
    assert "Energy (projected, not measured)" in out and "adreno640: LPDDR4X 64 pJ/byte" in out
