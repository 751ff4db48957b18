"""Runtime: device discovery, program builds, residency of host tensors, and the Executable."""

from __future__ import annotations

from torch_adreno.runtime.device import DeviceRuntime, get_runtime, list_devices, select_device
from torch_adreno.runtime.device_tensor import DeviceTensor
from torch_adreno.runtime.executable import Executable
from torch_adreno.runtime.residency import Residency

__all__ = [
    "DeviceRuntime", "DeviceTensor", "Executable", "Residency", "get_residency", "get_runtime", "list_devices",
    "select_device",
]

_residencies: dict[int, Residency] = {}


def get_residency(runtime: DeviceRuntime) -> Residency:
    """The residency table of a device runtime (one per device, shared by all graphs)."""
    res = _residencies.get(id(runtime))
    if res is None:
        res = _residencies[id(runtime)] = Residency(runtime)
    return res
