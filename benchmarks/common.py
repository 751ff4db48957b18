"""Shared by the benchmark scripts: run context and JSON-lines output.

Results go to ``benchmarks/results/<device>/<benchmark>.jsonl``: one folder per device (``h200``,
``pocl``, ``intel-cpu``, ...; :func:`device_folder`), chosen from the records themselves when a
script's output path holds the :data:`DEVICE` placeholder (every script's default).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
from pathlib import Path
from typing import Any

import torch

from torch_adreno.config import OPTIONS
from torch_adreno.runtime import get_runtime

RESULTS = Path(__file__).parent / "results"
#: A path component that :func:`append_jsonl` replaces with the records' :func:`device_folder`.
DEVICE = "<device>"

#: The device facts the stages plan an NVIDIA H200 with (its OpenCL driver's report): GPU code
#: paths, 132 compute units (GEMM splits), work-group and local-memory limits, 141 GB of memory
#: (the fused head's "auto" threshold). For ``--plan-as h200``.
PLANS = {"h200": {"is_gpu": True, "compute_units": 132, "max_work_group_size": 1024,
                  "max_work_item_sizes": (1024, 1024, 64), "preferred_work_group_multiple": 32,
                  "local_mem_bytes": 48 * 1024, "global_mem_bytes": 141 * 10**9}}


def plan_as(device: str | int | None, name: str | None) -> None:
    """Have the stages plan every graph compiled from now on in this process for the device ``name``
    of :data:`PLANS` while the kernels run on ``device``: kernel bytes, launches and splits are then
    that device's plan (times are not). The kernels must still fit the present device's limits,
    which the planned ones do on a CPU OpenCL device (work-groups up to 4096, local memory as
    cache). None: plan for the present device."""
    if name is None:
        return
    runtime = get_runtime(device)
    runtime.profile = dataclasses.replace(runtime.profile, **PLANS[name])  # type: ignore[arg-type]


def device_arg(text: str | None) -> str | int | None:
    """A --device value as the backend's ``device`` option takes it (an index or a name substring)."""
    return OPTIONS["device"].parse(text)


def run_context(device: str | int | None) -> dict[str, Any]:
    profile = get_runtime(device).profile
    return {"date": datetime.date.today().isoformat(), "device": profile.name, "platform": profile.platform,
            "driver": profile.driver, "torch": torch.__version__, "host": platform.node(),
            "host_threads": torch.get_num_threads()}


def device_folder(platform_name: str, device_name: str) -> str:
    """The results folder of an OpenCL device: ``pocl`` (PoCL), ``intel-cpu`` (Intel's CPU runtime, on
    whichever x86-64 CPU), the GPU's model for NVIDIA (``h200``), ``adreno740`` for an Adreno, else
    the device's name in lower case with dashes."""
    plat, name = platform_name.lower(), device_name.lower()
    if "portable computing language" in plat:
        return "pocl"
    if plat.startswith("intel") and "graphics" not in plat and "gpu" not in name:
        return "intel-cpu"
    adreno = re.search(r"adreno\D*(\d+)", name)
    if adreno:
        return f"adreno{adreno.group(1)}"
    if "nvidia" in plat:
        name = name.replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown-device"


def results_file(path: Path, records: list[dict[str, Any]]) -> Path:
    """``path`` with a :data:`DEVICE` component replaced by the records' device folder."""
    if DEVICE not in path.parts:
        return path
    first = records[0] if records else {}
    if not first.get("platform") or not first.get("device"):
        raise ValueError(f"{path}: the records name no device and platform (run_context), so the device folder "
                         "is unknown; pass --out")
    folder = device_folder(str(first["platform"]), str(first["device"]))
    return Path(*(folder if part == DEVICE else part for part in path.parts))


def append_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """Append ``records`` as JSON lines to ``path`` (see :func:`results_file`); returns the file written."""
    path = results_file(path, records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path
