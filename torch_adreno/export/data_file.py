"""The batches a run of an exported step takes, as one safetensors file (what ``torch-adreno-step
train --data`` reads, and ``python -m torch_adreno export --data-out`` writes).

Layout: one tensor per batch input of the step, named as the input (``batch_0``, ``batch_1``, ...),
holding that input's batches stacked over steps: ``[steps, *input shape]``, in the input's dtype.
Step ``i`` of a run takes row ``i % steps`` of each. Metadata: ``format`` = :data:`FORMAT`,
``steps`` = the number of rows. Imports numpy and safetensors only (no PyTorch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["FORMAT", "load_batches", "save_batches"]

FORMAT = "torch_adreno.batches"


def save_batches(path: str | Path, batches: Sequence[Sequence[np.ndarray]],
                 names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Write ``batches`` (one tuple of arrays per step, in the step's batch input order) to
    ``path``; ``names``: the inputs' names (default ``batch_0``, ``batch_1``, ...). Returns the
    stacked arrays by name."""
    from safetensors.numpy import save_file

    if not batches:
        raise ValueError("no batches to write: pass at least one step's batch")
    width = len(batches[0])
    names = list(names) if names is not None else [f"batch_{i}" for i in range(width)]
    if len(names) != width or any(len(batch) != width for batch in batches):
        raise ValueError(f"every batch must hold {len(names)} arrays ({', '.join(names)})")
    stacked = {}
    for position, name in enumerate(names):
        arrays = [np.asarray(batch[position]) for batch in batches]
        if len({(a.shape, a.dtype) for a in arrays}) != 1:
            raise ValueError(f"{name}: the steps' batches differ in shape or dtype; an exported step takes one geometry")
        stacked[name] = np.ascontiguousarray(np.stack(arrays))
    save_file(stacked, str(path), metadata={"format": FORMAT, "steps": str(len(batches))})
    return stacked


def load_batches(path: str | Path) -> dict[str, np.ndarray]:
    """The stacked batches of a file :func:`save_batches` wrote, by input name."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as file:
        metadata = file.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{path} is not a batches file (metadata format {metadata.get('format')!r}, "
                             f"expected {FORMAT!r}): write it with `python -m torch_adreno export --data-out`")
        return {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (safe_open is not a mapping)
