"""Residency of host tensors on the device: upload once, again only when the host changed them.

A host tensor's device copy is reused while the tensor is the same object with the same storage
pointer and the same version counter (PyTorch bumps ``_version`` on every in-place change, which
is how an optimizer step invalidates a parameter's copy). Parameters and buffers (static inputs)
stay resident for the tensor's lifetime; other inputs (batches) are kept in a small
most-recently-used set, enough for the backward to reuse what the forward uploaded.

Contract: changes that bypass the version counter (writing through ``.data``, through a NumPy
view of the tensor, or from C code) are invisible; call :func:`invalidate` after such a change.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS

TRANSIENT_SLOTS = 16


@dataclass
class _Entry:
    ref: weakref.ref[torch.Tensor]
    version: int
    data_ptr: int
    nbytes: int
    buffer: cl.Buffer


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous NumPy view (or copy) of a CPU tensor's elements, in storage dtype."""
    t = tensor.detach()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.contiguous().numpy()


def version_of(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor._version)
    except RuntimeError:  # inference tensors carry no version counter
        return None


class Residency:
    """Device copies of host tensors for one device runtime."""

    def __init__(self, runtime: DeviceRuntime) -> None:
        self.runtime = runtime
        self._pinned: dict[int, _Entry] = {}
        self._transient: OrderedDict[int, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pinned) + len(self._transient)

    def resident_bytes(self) -> int:
        return sum(e.nbytes for e in [*self._pinned.values(), *self._transient.values()])

    def _lookup(self, key: int) -> _Entry | None:
        return self._pinned.get(key) or self._transient.get(key)

    def buffer_for(self, tensor: torch.Tensor, *, pinned: bool, graph: str, buffer: str) -> cl.Buffer:
        """The device copy of ``tensor``, uploading it if absent or stale (counted)."""
        if tensor.device.type != "cpu":
            raise TypeError(
                f"input {buffer} of {graph} is on {tensor.device}; the adreno backend takes CPU tensors "
                "and keeps its own device copies"
            )
        key = id(tensor)
        version = version_of(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        entry = self._lookup(key)
        if (entry is not None and entry.ref() is tensor and version is not None and entry.version == version
                and entry.data_ptr == tensor.data_ptr() and entry.nbytes == nbytes):
            if key in self._transient:
                self._transient.move_to_end(key)
            return entry.buffer
        if entry is not None and entry.ref() is tensor and entry.nbytes == nbytes:
            device_buffer = entry.buffer
        else:
            device_buffer = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        if nbytes:
            cl.enqueue_copy(self.runtime.queue, device_buffer, host_array(tensor), is_blocking=True)
        BUS.transfer(graph, "h2d", nbytes, buffer, "parameter" if pinned else "input")
        if version is None:
            return device_buffer
        self._forget(key)
        new = _Entry(weakref.ref(tensor, self._make_finalizer(key)), version, tensor.data_ptr(), nbytes, device_buffer)
        if pinned or key in self._pinned:
            self._pinned[key] = new
        else:
            self._transient[key] = new
            while len(self._transient) > TRANSIENT_SLOTS:
                self._transient.popitem(last=False)
        return device_buffer

    def _make_finalizer(self, key: int) -> Any:
        owner = weakref.ref(self)

        def forget(ref: weakref.ref[torch.Tensor]) -> None:
            residency = owner()
            if residency is None:
                return
            for table in (residency._pinned, residency._transient):
                entry = table.get(key)
                if entry is not None and entry.ref is ref:
                    del table[key]

        return forget

    def _forget(self, key: int) -> None:
        self._pinned.pop(key, None)
        self._transient.pop(key, None)

    def invalidate(self, tensor: torch.Tensor) -> None:
        self._forget(id(tensor))

    def clear(self) -> None:
        self._pinned.clear()
        self._transient.clear()
