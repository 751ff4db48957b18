"""The table of host tensors' device buffers (copies, or host memory shared in place), and the
binding of a graph input to one: reuse while current, else share or upload.

Invariants:
  * An entry is keyed by its tensor's ``id`` (parameters and buffers in :attr:`CopyTable.pinned`
    for the tensor's lifetime, other inputs among the :data:`TRANSIENT_SLOTS` most recently used
    in :attr:`CopyTable.transient`), or, for a downloaded graph output, by the address of its host
    memory (:attr:`CopyTable.adopted`): autograd hands a gradient on as an alias of the tensor we
    returned (same memory and version counter, another object), so identity cannot find it.
  * An entry holds its tensor (or memory owner) weakly; it leaves its table, its buffer released,
    when that dies, unless it was replaced meanwhile.
  * An entry is current while its tensor's version is the one recorded (or one more, when the
    caller says it bumped the version without changing the values).
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
from torch_adreno.runtime.heap import device_heap
from torch_adreno.runtime.host_memory import Transfers, host_array, shared_buffer, sync_shared, version_of

TRANSIENT_SLOTS = 16


@dataclass
class CopyEntry:
    #: The tensor (or, for adopted outputs, the NumPy array owning the host memory).
    ref: weakref.ref[Any]
    version: int | None
    data_ptr: int
    nbytes: int
    buffer: cl.Buffer
    shared: bool
    #: For shared entries: a view keeping the host memory alive until the buffer over it is released.
    memory: np.ndarray | None = None
    #: For adopted outputs: the pool block holding the device copy (back to the pool with the entry).
    block: Any = None

    def release(self) -> None:
        """Release the OpenCL buffer before the host memory under it may go (drivers that pin
        host memory must not find it freed). Called once the tensor has died; every call that
        used the buffer has waited for its kernels by then."""
        if self.shared:
            self.buffer.release()
        self.memory = None
        self.block = None


class CopyTable:
    """Device buffers of host tensors, for one device runtime; uploads go through ``transfers``."""

    def __init__(self, runtime: DeviceRuntime, transfers: Transfers) -> None:
        self.runtime = runtime
        self.transfers = transfers
        self.pinned: dict[int, CopyEntry] = {}
        self.transient: OrderedDict[int, CopyEntry] = OrderedDict()
        # Device copies of downloaded outputs, by the address of their host memory; each lives
        # while its host memory does.
        self.adopted: dict[int, CopyEntry] = {}

    def __len__(self) -> int:
        return len(self.pinned) + len(self.transient) + len(self.adopted)

    def resident_bytes(self) -> int:
        """Device bytes held as copies (shared buffers occupy host memory only)."""
        entries = [*self.pinned.values(), *self.transient.values(), *self.adopted.values()]
        return sum(e.nbytes for e in entries if not e.shared)

    def lookup(self, key: int) -> CopyEntry | None:
        return self.pinned.get(key) or self.transient.get(key)

    def bind(self, tensor: torch.Tensor, entry: CopyEntry | None, version: int | None, nbytes: int, *,
             shared: bool, pinned: bool, graph: str, buffer: str, version_bumped: bool, heap_copies: bool,
             heap_group: Any) -> cl.Buffer:
        """The buffer for ``tensor`` (``entry``: :meth:`lookup`'s): ``entry``'s while current, an
        adopted copy of its memory while current, else its memory shared (``shared``) or a new or
        reused device buffer with an upload enqueued; a heap region of ``heap_group`` for a pinned
        copy while ``heap_copies``. Counted on the bus; remembered unless there is no version."""
        key = id(tensor)
        same_object = (entry is not None and entry.ref() is tensor and entry.data_ptr == tensor.data_ptr()
                       and entry.nbytes == nbytes and entry.shared == shared)
        current = entry is not None and version is not None and entry.version is not None and (
            entry.version == version or (version_bumped and entry.version + 1 == version))
        if same_object and entry is not None and current:
            entry.version = version
            if key in self.transient:
                self.transient.move_to_end(key)
            return entry.buffer
        if not shared and not (same_object and entry is not None):
            adopted = self._adopted_copy(tensor, nbytes, version, version_bumped)
            if adopted is not None:
                return adopted
        reason = "parameter" if pinned else "input"
        if shared:
            device_buffer = entry.buffer if same_object and entry is not None else shared_buffer(self.runtime, tensor)
            if same_object:
                sync_shared(self.runtime, device_buffer, nbytes, write=True)
            # On a discrete GPU, host memory used in place still crosses the bus: count it as copied.
            BUS.transfer(graph, "h2d", nbytes, buffer, reason, copied=not self.runtime.profile.unified_memory)
        else:
            if same_object and entry is not None:
                device_buffer = entry.buffer
            elif heap_copies and pinned:
                # A region of the device heap, in the slabs of the current group (a TrainingStep's):
                # its replay reaches every parameter in one slab through one kernel argument.
                # (Batches stay buffers of their own: each live sub-buffer of a slab adds to the
                # cost of enqueueing a kernel bound to it, on NVIDIA's driver.)
                device_buffer = device_heap(self.runtime).allocate(nbytes, heap_group)
            else:
                device_buffer = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
            event = self.transfers.upload(device_buffer, host_array(tensor)) if nbytes else None
            BUS.transfer(graph, "h2d", nbytes, buffer, reason, event=event)
        if version is not None:
            self.remember(tensor, key, version, nbytes, device_buffer, shared, pinned)
        return device_buffer

    def adopt(self, tensor: torch.Tensor, owner: np.ndarray, block: Any) -> None:
        """Remember ``block`` (a pool block) as the device copy of ``tensor``'s memory, owned by
        ``owner``, at its current version (see :meth:`Residency.adopt`)."""
        version = version_of(tensor)
        if version is None or not tensor.is_contiguous():
            return
        key = tensor.data_ptr()
        owner_ref = weakref.ref(owner, self._make_finalizer(key, "adopted"))
        self.adopted[key] = CopyEntry(owner_ref, version, key, tensor.numel() * tensor.element_size(),
                                      block.buffer, False, None, block)

    def adopted_entry(self, tensor: torch.Tensor) -> CopyEntry | None:
        """The adopted entry over ``tensor``'s memory (contiguous tensors only), current or not."""
        return self.adopted.get(tensor.data_ptr()) if tensor.is_contiguous() else None

    def _adopted_copy(self, tensor: torch.Tensor, nbytes: int, version: int | None,
                      version_bumped: bool) -> cl.Buffer | None:
        """The device copy of ``tensor``'s memory made by :meth:`adopt`, if still current; a stale
        one is dropped (the tensor gets an entry of its own when it is uploaded)."""
        entry = self.adopted.get(tensor.data_ptr())
        if entry is None:
            return None
        if entry.ref() is not None and entry.nbytes == nbytes and tensor.is_contiguous() \
                and version is not None and entry.version is not None \
                and (entry.version == version or (version_bumped and entry.version + 1 == version)):
            return entry.buffer
        del self.adopted[tensor.data_ptr()]
        entry.release()
        return None

    def remember(self, tensor: torch.Tensor, key: int, version: int, nbytes: int, device_buffer: cl.Buffer,
                 shared: bool, pinned: bool) -> None:
        """Enter ``device_buffer`` as ``tensor``'s current copy at ``version``; a tensor once
        pinned stays pinned, and the least recently used transient entry beyond the slots goes."""
        was_pinned = key in self.pinned
        self.pinned.pop(key, None)
        self.transient.pop(key, None)
        new = CopyEntry(weakref.ref(tensor, self._make_finalizer(key)), version, tensor.data_ptr(), nbytes,
                        device_buffer, shared, host_array(tensor) if shared else None)
        if pinned or was_pinned:
            self.pinned[key] = new
        else:
            self.transient[key] = new
            while len(self.transient) > TRANSIENT_SLOTS:
                self.transient.popitem(last=False)  # still alive: its memory outlives the buffer

    def _make_finalizer(self, key: int, *tables: str) -> Any:
        """A weakref callback dropping ``key``'s entry from the named tables (default: the
        tensor-keyed ones; also ``adopted``) and releasing it, unless the entry was replaced
        meanwhile."""
        owner = weakref.ref(self)
        names = tables or ("pinned", "transient")

        def forget(ref: weakref.ref[Any]) -> None:
            copies = owner()
            if copies is None:
                return
            for table in (getattr(copies, name) for name in names):
                entry = table.get(key)
                if entry is not None and entry.ref is ref:
                    del table[key]
                    entry.release()

        return forget

    def forget(self, key: int) -> None:
        """Drop ``key``'s tensor-keyed entry (the next binding uploads again)."""
        self.pinned.pop(key, None)
        self.transient.pop(key, None)

    def clear(self) -> None:
        self.pinned.clear()
        self.transient.clear()
        self.adopted.clear()
