"""Shared by the benchmark scripts: run context and JSON-lines output."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

import torch

from torch_adreno.config import OPTIONS
from torch_adreno.runtime import get_runtime

RESULTS = Path(__file__).parent / "results"


def device_arg(text: str | None) -> str | int | None:
    """A --device value as the backend's ``device`` option takes it (an index or a name substring)."""
    return OPTIONS["device"].parse(text)


def run_context(device: str | int | None) -> dict[str, Any]:
    profile = get_runtime(device).profile
    return {"date": datetime.date.today().isoformat(), "device": profile.name, "platform": profile.platform,
            "driver": profile.driver, "torch": torch.__version__, "host": platform.node(),
            "host_threads": torch.get_num_threads()}


def append_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
