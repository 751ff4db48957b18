"""Energy over a window, read from the counters the device exposes: NVML on NVIDIA GPUs, the
battery's power-supply files under ``/sys`` on an Android phone.

A *meter* is started when a window opens and stopped when it closes; :meth:`Meter.stop` returns an
:class:`EnergyReading`: joules, or None with the reason nothing was measured. Nothing here ever
makes a number up: a counter that cannot be read, a device that cannot be matched, a phone on its
charger, are each a reading of None with a sentence saying so.

- **NVML** (``nvidia-ml-py``): the GPU's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  mJ since the driver loaded; Volta and newer) read at start and stop; where it is not supported,
  the board's power (``nvmlDeviceGetPowerUsage``, mW) sampled every :data:`SAMPLE_SECONDS` on a
  background thread and integrated over the window. The GPU is the one whose PCI domain, bus and
  device number the OpenCL device reports (``cl_nv_device_attribute_query``), else the one NVML
  device of the same name. NVML's counter moves every 20-100 ms and recent GPUs average their power
  over about a second, so windows under :data:`STEADY_SECONDS` are flagged.
- **Android** (sysfs, as documented in the kernel's ``Documentation/ABI/testing/sysfs-class-power``):
  ``power_supply/battery/current_now`` (µA) x ``voltage_now`` (µV) sampled every
  :data:`SAMPLE_SECONDS` and integrated: the whole phone's draw from its battery, not the GPU's.
  The sign of ``current_now`` differs between vendors, so its magnitude is used and ``status``
  decides: a charging or full battery measures nothing. Qualcomm's kgsl driver adds context, not
  energy: ``kgsl-3d0/gpu_busy_percentage`` and ``kgsl-3d0/gpuclk`` (Hz), averaged over the window.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyopencl as cl

#: Seconds between power samples (NVML without an energy counter, Android's battery).
SAMPLE_SECONDS = 0.02
#: Windows shorter than this are flagged: NVML's counter and averaged power lag by up to a second.
STEADY_SECONDS = 1.0
#: Phone power outside this range (W) means the files are not in the documented units.
PLAUSIBLE_PHONE_WATTS = (0.05, 40.0)

#: cl_nv_device_attribute_query: the GPU's PCI bus, slot (device << 3 | function) and domain.
CL_DEVICE_PCI_BUS_ID_NV, CL_DEVICE_PCI_SLOT_ID_NV, CL_DEVICE_PCI_DOMAIN_ID_NV = 0x4008, 0x4009, 0x400A

BATTERY = Path("sys/class/power_supply/battery")
KGSL = Path("sys/class/kgsl/kgsl-3d0")


@dataclass(frozen=True)
class EnergyReading:
    """Energy over one window: ``joules`` (None when not measured, ``reason`` then says why),
    ``source`` (what was read), ``seconds`` the window lasted, ``samples`` read (0 for a counter
    read at both ends) and ``notes`` (caveats, kgsl's GPU load)."""

    joules: float | None
    source: str
    reason: str | None = None
    seconds: float = 0.0
    samples: int = 0
    notes: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        return self.joules is not None

    def describe(self) -> str:
        if self.joules is None:
            return f"not measured: {self.reason}"
        how = f"{self.source}" + (f", {self.samples} samples" if self.samples else "")
        return f"{self.joules:.4g} J over {self.seconds:.3f} s ({how})" + "".join(f"; {n}" for n in self.notes)


def not_measured(reason: str, seconds: float = 0.0) -> EnergyReading:
    return EnergyReading(None, "not measured", reason, seconds)


class Meter(Protocol):
    """Reads energy over a window: :meth:`start`, then :meth:`stop` once."""

    def start(self) -> None: ...
    def stop(self) -> EnergyReading: ...


class Unmeasured:
    """A meter that reads nothing, for a reason known when it was opened."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self._start = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()

    def stop(self) -> EnergyReading:
        return not_measured(self.reason, time.perf_counter() - self._start)


def integrate(samples: Sequence[tuple[float, float]]) -> float:
    """Joules of ``(seconds, watts)`` samples in time order, by the trapezoid rule."""
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(samples))


class _Sampler:
    """Calls ``read`` (watts) every :data:`SAMPLE_SECONDS` on a daemon thread from
    :meth:`start` to :meth:`stop`, once at each end too; keeps ``(seconds, watts)`` samples and the
    first error ``read`` raised (sampling stops there)."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self.samples: list[tuple[float, float]] = []
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        if self.error is None:
            try:
                self.samples.append((time.perf_counter(), self._read()))
            except Exception as error:  # reported by the meter as the reason nothing was measured
                self.error = error

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="torch_adreno power samples", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


def _short_window_note(seconds: float) -> tuple[str, ...]:
    if seconds >= STEADY_SECONDS:
        return ()
    return (f"a {seconds:.3f} s window is shorter than the {STEADY_SECONDS:.0f} s the counters need to settle: "
            "measure more steps",)


# ---- NVML ----------------------------------------------------------------------------------------


class NvmlMeter:
    """One NVIDIA GPU's energy over a window, by its total energy counter where NVML has one,
    else by its power sampled and integrated. ``nvml`` is the ``pynvml`` module (NVML initialised:
    :meth:`stop` shuts it down)."""

    def __init__(self, nvml: Any, handle: Any, label: str, notes: tuple[str, ...] = ()) -> None:
        self.nvml, self.handle, self.label, self.notes = nvml, handle, label, notes
        self._counter_mj: int | None = None
        self._sampler: _Sampler | None = None
        self._start = 0.0

    def _watts(self) -> float:
        return float(self.nvml.nvmlDeviceGetPowerUsage(self.handle)) / 1e3

    def start(self) -> None:
        self._start = time.perf_counter()
        try:
            self._counter_mj = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError:  # no counter before Volta: sample the power instead
            self._sampler = _Sampler(self._watts)
            self._sampler.start()

    def stop(self) -> EnergyReading:
        try:
            if self._sampler is None:
                end_mj = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
                seconds = time.perf_counter() - self._start
                joules = (end_mj - (self._counter_mj or 0)) / 1e3
                return EnergyReading(joules, f"NVML total energy counter of {self.label}", None, seconds, 0,
                                     self.notes + _short_window_note(seconds))
            self._sampler.stop()
            seconds = time.perf_counter() - self._start
            if self._sampler.error is not None:
                return not_measured(f"NVML power of {self.label} could not be read: {self._sampler.error}", seconds)
            samples = self._sampler.samples
            return EnergyReading(integrate(samples), f"NVML power of {self.label} sampled every "
                                 f"{SAMPLE_SECONDS * 1e3:.0f} ms", None, seconds, len(samples),
                                 self.notes + _short_window_note(seconds))
        finally:
            self.nvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pci_of(nvml: Any, handle: Any) -> tuple[int, int, int]:
    info = nvml.nvmlDeviceGetPciInfo(handle)
    return int(info.domain), int(info.bus), int(info.device)


def open_nvml_meter(nvml: Any, pci: tuple[int, int, int] | None, name: str) -> Meter:
    """A meter of the NVML GPU at PCI ``(domain, bus, device)``, or, without ``pci``, of the one
    NVML GPU named ``name``; :class:`Unmeasured` with the reason when NVML cannot start or no (or
    more than one) GPU matches. ``nvml``: the ``pynvml`` module."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return Unmeasured(f"NVML cannot start ({error}): no NVIDIA driver here, so no GPU energy counter")
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        listed = [(h, _pci_of(nvml, h), _text(nvml.nvmlDeviceGetName(h)).strip()) for h in handles]
        if pci is not None:
            found = [entry for entry in listed if entry[1] == pci]
            how = "PCI {:04x}:{:02x}:{:02x}".format(*pci)
        else:
            found = [entry for entry in listed if entry[2].lower() == name.strip().lower()]
            how = f"name {name!r} (the device reports no PCI address)"
        if len(found) != 1:
            have = "; ".join("{} at {:04x}:{:02x}:{:02x}".format(n, *p) for _, p, n in listed) or "none"
            nvml.nvmlShutdown()
            return Unmeasured(f"{'no' if not found else len(found)} NVML GPU{'s' if found else ''} match {how} "
                              f"(NVML has: {have})")
        handle, (domain, bus, device), gpu = found[0]
        notes = () if pci is not None else (f"matched to NVML by name: {gpu}",)
        return NvmlMeter(nvml, handle, f"{gpu} at {domain:04x}:{bus:02x}:{device:02x}", notes)
    except nvml.NVMLError as error:
        nvml.nvmlShutdown()
        return Unmeasured(f"NVML could not list its GPUs: {error}")


def import_nvml() -> Any:
    """The ``pynvml`` module, or None where ``nvidia-ml-py`` is not installed."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return pynvml


NVML_MISSING = "nvidia-ml-py is not installed (pip install nvidia-ml-py): NVML, the NVIDIA GPU's counters, cannot be read"


# ---- Android: the battery and kgsl ---------------------------------------------------------------


def _read_number(path: Path) -> float:
    """The first number in a sysfs file ("63 %" reads 63); ValueError naming the file otherwise."""
    text = path.read_text().strip()
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        raise ValueError(f"{path}: expected a number, read {text!r}") from None


class BatteryMeter:
    """A phone's draw from its battery over a window (``current_now`` x ``voltage_now``, sampled and
    integrated), with the kgsl GPU's mean load and clock as notes. ``root``: where ``/`` is (a test
    passes a directory laid out like a phone's sysfs)."""

    def __init__(self, root: Path) -> None:
        self.battery = root / BATTERY
        self.kgsl = root / KGSL
        self._sampler = _Sampler(self._watts)
        self._gpu: list[tuple[float, float]] = []
        self._status = ""
        self._start = 0.0

    def _watts(self) -> float:
        micro_amps = _read_number(self.battery / "current_now")
        micro_volts = _read_number(self.battery / "voltage_now")
        if self.kgsl.is_dir():
            busy, clock = self.kgsl / "gpu_busy_percentage", self.kgsl / "gpuclk"
            if busy.exists() and clock.exists():
                self._gpu.append((_read_number(busy), _read_number(clock)))
        return abs(micro_amps) * micro_volts * 1e-12

    def _read_status(self) -> str:
        status = self.battery / "status"
        return status.read_text().strip() if status.exists() else "Unknown"

    def start(self) -> None:
        self._status = self._read_status()
        self._start = time.perf_counter()
        self._sampler.start()

    def stop(self) -> EnergyReading:
        self._sampler.stop()
        seconds = time.perf_counter() - self._start
        statuses = {self._status, self._read_status()}
        if self._sampler.error is not None:
            return not_measured(f"the battery's power could not be read: {self._sampler.error}", seconds)
        if statuses & {"Charging", "Full"}:
            return not_measured(f"the battery is {'/'.join(sorted(statuses))}: current_now is the charger's current, "
                                "not the phone's draw; unplug the phone (adb over Wi-Fi) to measure", seconds)
        samples = self._sampler.samples
        joules = integrate(samples)
        watts = joules / (samples[-1][0] - samples[0][0]) if len(samples) > 1 and samples[-1][0] > samples[0][0] \
            else (samples[0][1] if samples else 0.0)
        low, high = PLAUSIBLE_PHONE_WATTS
        if not low <= watts <= high:
            return not_measured(f"{watts:.4g} W from current_now x voltage_now is no phone's draw ({low}-{high} W): "
                                f"this driver does not report µA and µV ({self.battery})", seconds)
        notes = _short_window_note(seconds)
        if self._gpu:
            busy = sum(b for b, _ in self._gpu) / len(self._gpu)
            clock = sum(c for _, c in self._gpu) / len(self._gpu)
            notes += (f"kgsl: GPU busy {busy:.0f}% at {clock / 1e6:.0f} MHz (means of {len(self._gpu)} samples)",)
        return EnergyReading(joules, f"battery current_now x voltage_now ({self.battery}), the whole phone's draw, "
                             f"sampled every {SAMPLE_SECONDS * 1e3:.0f} ms", None, seconds, len(samples), notes)


def open_battery_meter(root: Path = Path("/")) -> Meter:
    """The battery meter of the phone whose sysfs is at ``root``; :class:`Unmeasured` naming the
    missing files where there is no battery with current and voltage."""
    battery = root / BATTERY
    missing = [name for name in ("current_now", "voltage_now") if not (battery / name).exists()]
    if missing:
        return Unmeasured(f"no {', '.join(str(battery / m) for m in missing)}: this kernel exposes no battery "
                          "current and voltage to read the phone's power from")
    return BatteryMeter(root)


# ---- the meter of an OpenCL device ---------------------------------------------------------------


@dataclass(frozen=True)
class DeviceIdentity:
    """What picks an OpenCL device's power counter: its name, vendor, and PCI address where the
    driver reports one (NVIDIA's)."""

    name: str
    vendor: str
    pci: tuple[int, int, int] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def is_adreno(self) -> bool:
        return "adreno" in self.name.lower() or "qualcomm" in self.vendor.lower()


def identity_of(device: Any) -> DeviceIdentity:
    """The identity of a ``pyopencl.Device``: NVIDIA's PCI attributes are read where present."""
    pci = None
    try:
        bus = int(device.get_info(CL_DEVICE_PCI_BUS_ID_NV))
        slot = int(device.get_info(CL_DEVICE_PCI_SLOT_ID_NV))
        try:
            domain = int(device.get_info(CL_DEVICE_PCI_DOMAIN_ID_NV))
        except cl.Error:  # drivers before the domain attribute: domain 0, the only one on most machines
            domain = 0
        pci = (domain, bus, slot >> 3)
    except cl.Error:  # not an NVIDIA device: the driver refuses the attribute (INVALID_VALUE)
        pci = None
    return DeviceIdentity(device.name.strip(), device.vendor.strip(), pci)


def open_meter(identity: DeviceIdentity, nvml: Any = None, sysfs_root: Path = Path("/")) -> Meter:
    """The meter of the device ``identity`` names: the phone's battery for an Adreno, else the NVML
    GPU it is (``nvml``: the ``pynvml`` module; None imports it). Unmeasured, with the reason,
    where neither reads."""
    if identity.is_adreno:
        meter = open_battery_meter(sysfs_root)
    else:
        nvml = nvml if nvml is not None else import_nvml()
        meter = Unmeasured(NVML_MISSING) if nvml is None else open_nvml_meter(nvml, identity.pci, identity.name)
    if isinstance(meter, Unmeasured):
        meter.reason = f"{identity.name}: {meter.reason}"
    return meter


def open_device_meter(device: str | int | None) -> Meter:
    """The meter of the OpenCL device ``device`` selects (as the ``device`` option takes it); a
    remote device, or none, is :class:`Unmeasured` (no counter of this process reads it)."""
    from torch_adreno.errors import AdrenoError
    from torch_adreno.runtime.device import select_device

    try:
        opencl_device = select_device(device).device  # the device only: no context of its own
    except AdrenoError as error:
        return Unmeasured(f"no OpenCL device of this process to read: {error}")
    return open_meter(identity_of(opencl_device))


def window_energy(reading: EnergyReading, remote_launches: int) -> EnergyReading:
    """A profile window's reading: none where launches in it ran on a remote device (a step server),
    whose power the meter of this machine's device does not see."""
    if remote_launches and reading.joules is not None:
        return not_measured(f"{remote_launches} launches of the window ran on a remote device (a step server): its "
                            f"power is not read here ({reading.source} read this machine's device)", reading.seconds)
    return reading


class EnergyTotals:
    """The energy attributes of a profile: ``energy`` (its window's :class:`EnergyReading`) and
    ``steps`` (its TrainingStep records) are the profile's."""

    energy: EnergyReading
    steps: list[Any]

    @property
    def energy_joules(self) -> float | None:
        """The device's energy over the window, J; None when not measured (:attr:`energy_reason`)."""
        return self.energy.joules

    @property
    def energy_source(self) -> str:
        """What the energy was read from, or "not measured"."""
        return self.energy.source

    @property
    def energy_per_step_joules(self) -> float | None:
        """The window's energy over the TrainingStep calls in it; None when not measured or without
        steps (:attr:`energy_reason` says which)."""
        if self.energy.joules is None or not self.steps:
            return None
        return self.energy.joules / len(self.steps)

    @property
    def energy_reason(self) -> str | None:
        """Why :attr:`energy_per_step_joules` is None (energy not measured, or no step in the
        window); None when it is a number."""
        if self.energy.joules is None:
            return self.energy.reason
        if not self.steps:
            return ("no TrainingStep call in the window: energy per step needs steps (energy_joules covers the "
                    "whole window)")
        return None
