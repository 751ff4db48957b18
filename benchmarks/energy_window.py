"""Joules per training step of a peer, over a timed window, with the profiler's readers.

A peer's step runs back to back for at least ``seconds`` and ``steps`` (defaults: 1 s and 60
steps: NVML's energy counter moves every 20-100 ms and recent GPUs average their power over about a
second, so shorter windows read the smoothing, not the steps) between one start and one stop of a
meter (:mod:`torch_adreno.profiler.energy`): the GPU's NVML counter for the CUDA peers (the GPU
``torch.cuda`` runs on, found by its PCI address) and for ours (the GPU the OpenCL device is, found
the same way), so the peers are read from the same counter. A peer whose device has no counter this
process reads (the host's CPU, a CPU OpenCL runtime, no NVIDIA driver) gets None and the reason,
and its steps are not run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from torch_adreno.profiler.energy import (
    NVML_MISSING,
    Meter,
    Unmeasured,
    import_nvml,
    open_device_meter,
    open_nvml_meter,
)

MIN_SECONDS = 1.0
MIN_STEPS = 60


def cuda_meter() -> Meter:
    """The meter of the GPU torch.cuda runs on (its PCI address where this torch reports it, else its
    name); Unmeasured without CUDA or NVML."""
    if not torch.cuda.is_available():
        return Unmeasured("the peer runs on the host's CPU (no CUDA here): only GPU counters are read "
                          "(NVML, a phone's battery)")
    nvml = import_nvml()
    if nvml is None:
        return Unmeasured(NVML_MISSING)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    pci = None
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        pci = (int(props.pci_domain_id), int(props.pci_bus_id), int(props.pci_device_id))
    return open_nvml_meter(nvml, pci, props.name)


def ours_meter(device: str | int | None) -> Meter:
    """The meter of the OpenCL device ours runs on."""
    return open_device_meter(device)


def energy_per_step(step: Callable[[], Any], sync: Callable[[], None], meter: Meter, seconds: float = MIN_SECONDS,
                    steps: int = MIN_STEPS) -> dict[str, Any]:
    """``step`` run back to back for at least ``seconds`` and ``steps`` inside one window of ``meter``
    (``sync`` before the window opens and before it closes); the record's energy fields."""
    if isinstance(meter, Unmeasured):
        reading = meter.stop()
        return {"energy_j_per_step": None, "energy_not_measured": reading.reason, "energy_source": reading.source}
    sync()
    meter.start()
    start, ran = time.perf_counter(), 0
    while ran < steps or time.perf_counter() - start < seconds:
        step()
        ran += 1
    sync()
    reading = meter.stop()
    return {
        "energy_j_per_step": reading.joules / ran if reading.joules is not None else None,
        "energy_joules": reading.joules, "energy_steps": ran, "energy_window_s": reading.seconds,
        "energy_window_step_ms": reading.seconds / ran * 1e3, "energy_source": reading.source,
        "energy_samples": reading.samples, "energy_notes": list(reading.notes),
        **({"energy_not_measured": reading.reason} if reading.joules is None else {}),
    }
