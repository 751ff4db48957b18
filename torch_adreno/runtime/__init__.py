"""Runtime: device discovery, program builds, residency of host tensors, work-group tuning, and the
Executable."""

from __future__ import annotations

from torch_adreno.errors import OptionError
from torch_adreno.runtime.device import DeviceRuntime, get_runtime, list_devices, select_device
from torch_adreno.runtime.device_tensor import DeviceTensor
from torch_adreno.runtime.executable import Executable
from torch_adreno.runtime.residency import Residency
from torch_adreno.runtime.tuning import TuningResult, tune_kernels

__all__ = [
    "DeviceRuntime", "DeviceTensor", "Executable", "Residency", "TuningResult", "get_residency", "get_runtime",
    "list_devices", "select_device", "tune_kernels",
]

_residencies: dict[tuple[int, bool], Residency] = {}


def get_residency(runtime: DeviceRuntime, zero_copy: str | bool = "auto") -> Residency:
    """The residency table of a device runtime and sharing mode (shared by all graphs).

    ``zero_copy="auto"`` shares host memory in place where the device's memory is unified.
    """
    shared = runtime.profile.unified_memory if zero_copy == "auto" else bool(zero_copy)
    if shared and not runtime.profile.unified_memory:
        raise OptionError(
            f"zero_copy=True needs a device with unified memory; {runtime.entry.label} has its own memory, so "
            "host memory used in place would still cross the bus: use zero_copy='auto' or False"
        )
    res = _residencies.get((id(runtime), shared))
    if res is None:
        res = _residencies[(id(runtime), shared)] = Residency(runtime, shared)
    return res
