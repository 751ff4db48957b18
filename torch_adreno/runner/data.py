"""The data files both runners read (``python -m torch_adreno.runner --data`` and
``torch-adreno-step train --data``), and the batches a run takes from one: the native runtime
follows this module byte for byte (``native/cli/batches.c``), so one file gives one run in both.

Formats, told apart by their first bytes (not their names): safetensors (what ``python -m
torch_adreno export --data-out`` writes) and ``.npz`` (``numpy.savez``; the native runtime reads
uncompressed archives only, not ``numpy.savez_compressed``). A file of another kind is refused.

Arrays: one per batch input of the step, named as the input (``batch_0``, ``batch_1``, ...) or, all
of them, ``x``, ``y``, ``batch_2``, ...; each of the input's dtype, and all in one of two layouts:

- stacked batches, ``[S, *input shape]``: step ``i`` takes row ``i % S`` (what ``--data-out`` writes);
- examples, ``[N, *input shape[1:]]`` (a data set such as the digits' ``x`` and ``y``): batches of
  ``B`` (the input's first size) rows, ``N // B`` of them an epoch (full batches only), each epoch
  in a fresh order: a Fisher-Yates shuffle of ``0 .. N-1`` (for ``i`` from ``N-1`` down to 1,
  swap ``i`` with ``next() % (i + 1)``) drawn from one splitmix64 stream seeded with ``seed``
  across epochs.

Imports numpy (and safetensors for that format) only.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Batches", "DataFileError", "open_batches", "read_arrays"]

FORMATS = "safetensors (python -m torch_adreno export --data-out writes one) or .npz (numpy.savez)"
MASK = (1 << 64) - 1


class DataFileError(ValueError):
    """A data file the runners cannot read, or one that does not fit the step; the message says why."""


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the data file at ``path``, by name (see the module docstring for the formats)."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            head = file.read(9)
    except OSError as err:
        raise DataFileError(f"cannot read the data file {path}: {err.strerror or err}") from None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except zipfile.BadZipFile as err:
            raise DataFileError(f"damaged file: {path}: {err}") from None
        except ValueError as err:
            raise DataFileError(f"{path}: an array of this .npz cannot be read without pickle ({err}): save plain "
                                "numeric arrays with numpy.savez") from None
    if len(head) == 9 and head[8:9] == b"{":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return load_file(str(path))
        except SafetensorError as err:
            raise DataFileError(f"{path} is not a valid safetensors file: {err}") from None
    raise DataFileError(f"{path} is neither a safetensors file nor an .npz archive; the runners read data as "
                        f"{FORMATS}")


def _splitmix64(state: int) -> tuple[int, int]:
    """(the next state, the output) of splitmix64."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


@dataclass
class Batches:
    """The batches of a data file for one step's batch inputs (see the module docstring)."""

    arrays: list[np.ndarray]
    #: True: stacked batches ([S, *shape]); False: examples ([N, *shape[1:]]).
    stacked: bool
    batch_size: int
    seed: int = 0

    @property
    def rows(self) -> int:
        """S stacked batches, or N examples (1 for a step without batch inputs)."""
        return len(self.arrays[0]) if self.arrays else 1

    @property
    def per_epoch(self) -> int:
        return self.rows if self.stacked else self.rows // self.batch_size

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        """The batches of steps 0, 1, 2, ... without end."""
        if self.stacked:
            step = 0
            while True:
                yield tuple(a[step % self.rows] for a in self.arrays)
                step += 1
        state = self.seed & MASK
        while True:
            order = list(range(self.rows))
            for i in range(self.rows - 1, 0, -1):
                state, draw = _splitmix64(state)
                j = draw % (i + 1)
                order[i], order[j] = order[j], order[i]
            for start in range(0, self.per_epoch * self.batch_size, self.batch_size):
                index = np.array(order[start:start + self.batch_size], dtype=np.int64)
                yield tuple(a[index] for a in self.arrays)

    def examples(self) -> tuple[np.ndarray, ...]:
        """Every example of the file (stacked batches flattened into rows), for an accuracy."""
        if not self.stacked:
            return tuple(self.arrays)
        return tuple(a.reshape(-1, *a.shape[2:]) for a in self.arrays)


def _describe(spec: dict[str, Any]) -> str:
    return f"{spec['input']} {spec['dtype']}{list(spec['shape'])}"


def open_batches(path: str | Path, specs: Sequence[dict[str, Any]], seed: int = 0,
                 arrays: dict[str, np.ndarray] | None = None) -> Batches:
    """The batches of the data file at ``path`` for batch inputs ``specs`` (the plan's ``batch``
    entries: input, dtype, shape); ``arrays``: the file's arrays when already read."""
    arrays = read_arrays(path) if arrays is None else arrays
    takes = ", ".join(_describe(s) for s in specs)
    names = [s["input"] for s in specs]
    short = ["x", "y", *(f"batch_{i}" for i in range(2, len(specs)))][:len(specs)]
    keys = names if all(n in arrays for n in names) else short
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise DataFileError(f"{path} has no array {', '.join(missing)} (it has {', '.join(sorted(arrays)) or 'none'}); "
                            f"the step takes {takes}, named so or x, y")
    chosen, layouts = [], set()
    for key, spec in zip(keys, specs, strict=True):
        array, shape = arrays[key], list(spec["shape"])
        if array.dtype != np.dtype(spec["dtype"]):
            raise DataFileError(f"{path}: array {key} is {array.dtype}; the step takes {_describe(spec)}: convert it "
                                f"(numpy: .astype(np.{spec['dtype']}))")
        if array.ndim == len(shape) + 1 and list(array.shape[1:]) == shape and len(array) >= 1:
            layouts.add("stacked")
        elif shape and array.ndim == len(shape) and list(array.shape[1:]) == shape[1:] and len(array) >= shape[0]:
            layouts.add("examples")
        else:
            raise DataFileError(f"{path}: array {key} has shape {list(array.shape)}; for {_describe(spec)} it holds "
                                f"batches stacked over steps, [steps, {', '.join(map(str, shape))}], or at least "
                                f"{shape[0] if shape else 1} examples, [N{''.join(f', {s}' for s in shape[1:])}]")
        chosen.append(array)
    if layouts == {"examples"} and len({s["shape"][0] for s in specs}) > 1:
        raise DataFileError(f"{path} holds examples, but the step's inputs differ in batch size ({takes}): stack "
                            "its batches over steps instead, [steps, *input shape]")
    if len(layouts) > 1:
        raise DataFileError(f"{path}: some arrays stack batches over steps and others hold examples; use one layout")
    if len({len(a) for a in chosen}) > 1:
        raise DataFileError(f"{path}: the arrays {', '.join(keys)} hold {', '.join(str(len(a)) for a in chosen)} rows: "
                            "they must hold as many")
    batch_size = int(specs[0]["shape"][0]) if specs and specs[0]["shape"] else 1
    return Batches(chosen, layouts == {"stacked"} or not specs, batch_size, seed)
