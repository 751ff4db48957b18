"""Host tensors on the device: shared in place where memory is unified, else uploaded and kept.

Zero-copy (unified-memory devices: phones, PoCL): a host tensor's own memory becomes the OpenCL
buffer (``CL_MEM_USE_HOST_PTR``); kernels read and write it in place and nothing is copied. A
map/unmap pair after the host changed the tensor (and after the device wrote it) is the
coherence step OpenCL requires; on such devices it moves no data.

Copies (discrete GPUs, or ``zero_copy=False``): a tensor is uploaded once and again only when its
version counter moved (PyTorch bumps ``_version`` on every in-place change: an optimizer step
invalidates a parameter's copy). Parameters and buffers (static inputs) stay resident for the
tensor's lifetime; other inputs (batches) live in a small most-recently-used set, enough for the
backward to reuse what the forward uploaded. Contract: changes that bypass the version counter
(writing through ``.data``, a NumPy view, C code) are not seen; call :meth:`invalidate`.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.runtime import amp_versions
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.heap import device_heap
from torch_adreno.runtime.host_memory import host_array, poison, shared_buffer, sync_shared, version_of

TRANSIENT_SLOTS = 16

# (The host-memory helpers are imported from here by the executable and the replay.)
__all__ = ["TRANSIENT_SLOTS", "Residency", "host_array", "poison", "shared_buffer", "sync_shared", "version_of"]

# Copies are trusted by version: GradScaler's unscale must bump the versions it changes.
amp_versions.install()

# Every residency, so that one reading a host tensor another deferred can make it current first.
_ALL_RESIDENCIES: list[weakref.ref[Residency]] = []


@dataclass
class _Entry:
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


@dataclass
class _Deferred:
    """A host tensor whose current value is only on the device (see :attr:`Residency.deferring`)."""

    ref: weakref.ref[torch.Tensor]
    buffer: Any
    #: The tensor's version when the value was deferred: any other version means the host changed it.
    version: int | None

    def alive(self, tensor: torch.Tensor) -> bool:
        return self.ref() is tensor

    def release(self) -> None:
        """Nothing to release: the buffer belongs to the tensor's residency entry."""


class Residency:
    """Device views (shared) or copies of host tensors, for one device runtime."""

    def __init__(self, runtime: DeviceRuntime, zero_copy: bool) -> None:
        self.runtime = runtime
        self.zero_copy = zero_copy
        self._pinned: dict[int, _Entry] = {}
        self._transient: OrderedDict[int, _Entry] = OrderedDict()
        # Copies enqueued without waiting, with the host memory they read or write: it must stay
        # as it is (and alive) until :meth:`finish_transfers`, which every graph call ends with.
        self._in_flight: list[tuple[cl.Event, Any]] = []
        # Device copies of downloaded outputs, by the address of their host memory: autograd hands
        # a gradient on as an alias of the tensor we returned (same memory and version counter,
        # another object), so identity cannot find them. Each lives while its host memory does.
        self._adopted: dict[int, _Entry] = {}
        #: While set (by :class:`torch_adreno.TrainingStep`, for the duration of one step), updated
        #: inputs are not written back and gradients are not downloaded: the device copies are the
        #: current values until :meth:`synchronize`.
        self.deferring = False
        # Host tensors whose current values are on the device only, by id.
        self._stale: dict[int, _Deferred] = {}
        # Deferred tensors to mark as out of date once the copies in flight have read their memory.
        self._to_mark: list[int] = []
        # Host-pointer buffers a replayed step wrote, made coherent for the host at the next sync
        # point rather than after every step (see :meth:`defer`), by buffer handle.
        self._unsynced_shared: dict[int, tuple[weakref.ref[torch.Tensor], cl.Buffer, int]] = {}
        #: The device heap group new parameter copies are placed in (set by a TrainingStep around its
        #: own graph calls, so that its replay's slab holds its own tensors only).
        self.heap_group: Any = None
        #: Whether parameter copies made now are heap regions (False: buffers of their own); set with
        #: :attr:`heap_group` by a TrainingStep from its ``heap_copies`` option.
        self.heap_copies = True
        #: How many times :meth:`synchronize` ran (a replayed step re-defers its updates after one).
        self.synchronizations = 0
        _ALL_RESIDENCIES[:] = [ref for ref in _ALL_RESIDENCIES if ref() is not None]
        _ALL_RESIDENCIES.append(weakref.ref(self))
        # Who can name a tensor in the user's words (TrainingSteps), asked only for error messages.
        self._namers: list[weakref.WeakMethod[Callable[[torch.Tensor], str | None]]] = []

    def add_namer(self, namer: Callable[[torch.Tensor], str | None]) -> None:
        """Register a bound method naming tensors (``0.weight``) for error messages; held weakly."""
        self._namers = [ref for ref in self._namers if ref() is not None]
        self._namers.append(weakref.WeakMethod(namer))

    def name_of(self, tensor: torch.Tensor, fallback: str) -> str:
        """``tensor``'s name from the registered namers, else ``fallback``."""
        for ref in self._namers:
            namer = ref()
            name = namer(tensor) if namer is not None else None
            if name is not None:
                return name
        return fallback

    def finish_transfers(self) -> None:
        """Wait for the copies :meth:`buffer_for` and :meth:`write_back` started. Not waiting for
        each one lets the host go on enqueueing while the device copies (a blocking copy on an
        in-order queue also waits for every kernel before it)."""
        if self._in_flight:
            cl.wait_for_events([event for event, _ in self._in_flight])
            self._in_flight.clear()
        # Marked only now: an upload of the same memory may have been in flight until the wait.
        for key in self._to_mark:
            deferred = self._stale.get(key)
            tensor = deferred.ref() if deferred is not None else None
            if tensor is not None and deferred is not None and deferred.version == version_of(tensor):
                poison(tensor)
        self._to_mark.clear()

    def __len__(self) -> int:
        return len(self._pinned) + len(self._transient) + len(self._adopted)

    def resident_bytes(self) -> int:
        """Device bytes held as copies (shared buffers occupy host memory only)."""
        entries = [*self._pinned.values(), *self._transient.values(), *self._adopted.values()]
        return sum(e.nbytes for e in entries if not e.shared)

    def _lookup(self, key: int) -> _Entry | None:
        return self._pinned.get(key) or self._transient.get(key)

    def buffer_for(self, tensor: torch.Tensor, *, pinned: bool, graph: str, buffer: str,
                   version_bumped: bool = False) -> cl.Buffer:
        """The device buffer for ``tensor``: its shared memory, or an up-to-date copy (counted).

        ``version_bumped``: the caller bumped the version counter by exactly one just now without
        changing the values (AOTAutograd does, before a graph that updates the tensor in place);
        a copy made at the version before is still current. Any other change bumps it further."""
        if tensor.device.type != "cpu":
            raise TypeError(
                f"input {buffer} of {graph} is on {tensor.device}; the adreno backend takes CPU tensors "
                "and keeps its own device copies"
            )
        key = id(tensor)
        self._synchronize_elsewhere_deferred(tensor, key)
        version = version_of(tensor)
        stale = self._stale.get(key)
        if stale is not None and stale.alive(tensor) and stale.version is not None and version is not None \
                and version != stale.version and not (version_bumped and version == stale.version + 1):
            raise RuntimeError(
                f"{self.name_of(tensor, f'input {buffer} of {graph}')} was changed on the host while its current "
                "value was on the device only (a TrainingStep defers host copies): call step.synchronize() before changing "
                "parameters or optimizer state on the host"
            )
        nbytes = tensor.numel() * tensor.element_size()
        shared = self.zero_copy and tensor.is_contiguous()
        entry = self._lookup(key)
        if stale is not None and stale.alive(tensor) and (entry is None or entry.buffer is not stale.buffer) \
                and version is not None:
            # Deferred, then dropped from the table (evicted): the deferred copy is the current value.
            self._remember(tensor, key, version, nbytes, stale.buffer, False, pinned)
            return stale.buffer
        same_object = (entry is not None and entry.ref() is tensor and entry.data_ptr == tensor.data_ptr()
                       and entry.nbytes == nbytes and entry.shared == shared)
        current = entry is not None and version is not None and entry.version is not None and (
            entry.version == version or (version_bumped and entry.version + 1 == version))
        if same_object and entry is not None and current:
            entry.version = version
            if key in self._transient:
                self._transient.move_to_end(key)
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
            elif self.heap_copies and pinned:
                # A region of the device heap, in the slabs of the current group (a TrainingStep's):
                # its replay reaches every parameter in one slab through one kernel argument.
                # (Batches stay buffers of their own: each live sub-buffer of a slab adds to the
                # cost of enqueueing a kernel bound to it, on NVIDIA's driver.)
                device_buffer = device_heap(self.runtime).allocate(nbytes, self.heap_group)
            else:
                device_buffer = cl.Buffer(self.runtime.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
            event = None
            if nbytes:
                source = host_array(tensor)
                event = cl.enqueue_copy(self.runtime.queue, device_buffer, source, is_blocking=False)
                self._in_flight.append((event, source))
            BUS.transfer(graph, "h2d", nbytes, buffer, reason, event=event)
        if version is not None:
            self._remember(tensor, key, version, nbytes, device_buffer, shared, pinned)
        return device_buffer

    def _synchronize_elsewhere_deferred(self, tensor: torch.Tensor, key: int) -> None:
        """A graph of this residency reads ``tensor``, whose current value another residency holds
        deferred (a zero-copy graph evaluating a model between copy-mode steps): copy it to the
        host first, or this graph would read the out-of-date host copy."""
        for ref in _ALL_RESIDENCIES:
            other = ref()
            if other is not None and other is not self and other._stale:
                deferred = other._stale.get(key)
                if deferred is not None and deferred.alive(tensor):
                    other.synchronize()

    def write_back(self, tensor: torch.Tensor, device_buffer: Any, graph: str, buffer: str) -> None:
        """The device updated ``tensor`` (an optimizer step): make the host copy right again (once
        :meth:`finish_transfers` returned), or while :attr:`deferring`, at :meth:`synchronize`."""
        nbytes = tensor.numel() * tensor.element_size()
        entry = self._lookup(id(tensor))
        if entry is not None and entry.ref() is tensor and entry.buffer is device_buffer:
            # Host and device hold the same values again (once the copy below is done): a graph
            # reading the tensor next uses the device copy without uploading it.
            entry.version = version_of(tensor)
        if entry is not None and entry.shared and entry.buffer is device_buffer:
            sync_shared(self.runtime, device_buffer, nbytes, write=False)
            return
        adopted = self._adopted.get(tensor.data_ptr()) if tensor.is_contiguous() else None
        if adopted is not None and adopted.buffer is device_buffer and adopted.ref() is not None:
            # A graph output updated in place on the device (gradients clipped inside a step): the
            # device copy stays the current one.
            adopted.version = version_of(tensor)
            if self.deferring:
                return  # its host copy was never filled in while deferring (see Executable)
        if not self.deferring:
            self._stale.pop(id(tensor), None)  # written back below: the host copy is current again
        if self.deferring and entry is not None and entry.ref() is tensor and entry.buffer is device_buffer \
                and tensor.is_contiguous():
            key = id(tensor)
            self._stale[key] = _Deferred(weakref.ref(tensor, self._make_finalizer(key, "_stale")), device_buffer,
                                         version_of(tensor))
            self._to_mark.append(key)  # at finish_transfers, which every graph call ends with
            return
        if nbytes:
            if not tensor.is_contiguous():
                raise RuntimeError(f"{graph}: cannot write the new value of non-contiguous input {buffer} back")
            target = host_array(tensor)
            event = cl.enqueue_copy(self.runtime.queue, target, device_buffer, is_blocking=False)
            self._in_flight.append((event, target))
        BUS.transfer(graph, "d2h", nbytes, buffer, "mutation")

    def synchronize(self) -> int:
        """Copy every deferred value to its host tensor; returns the bytes copied. A tensor the host
        changed meanwhile gets the device's values too (the host changed an out-of-date copy, so its
        change is discarded), reported in a RuntimeError raised once all are copied."""
        copied = 0
        conflicts: list[str] = []
        self.synchronizations += 1
        for ref, buffer, nbytes in self._unsynced_shared.values():
            tensor = ref()
            entry = self._lookup(id(tensor)) if tensor is not None else None
            # A dead tensor's buffer was released with its entry: nothing is left to make coherent.
            if entry is not None and entry.buffer is buffer:
                sync_shared(self.runtime, buffer, nbytes, write=False)
        self._unsynced_shared.clear()
        for key, deferred in list(self._stale.items()):
            tensor = deferred.ref()
            del self._stale[key]
            if tensor is None:
                continue
            if version_of(tensor) != deferred.version:
                conflicts.append(self.name_of(tensor, f"a tensor of shape {list(tensor.shape)}"))
            target = host_array(tensor)
            event = cl.enqueue_copy(self.runtime.queue, target, deferred.buffer, is_blocking=False)
            self._in_flight.append((event, target))
            BUS.transfer("synchronize", "d2h", target.nbytes, "deferred", "synchronize", event=event)
            copied += target.nbytes
        self.finish_transfers()
        # A sync point: an index out of range in a kernel since the last read of the record raises
        # here (after the copies: the host copies are what the device holds, valid or not).
        self.runtime.index_errors.check(self.runtime.queue)
        if conflicts:
            raise RuntimeError(
                f"{len(conflicts)} parameter or optimizer state tensor(s) ({', '.join(conflicts[:6])}"
                f"{', ...' if len(conflicts) > 6 else ''}) were changed on the host while their current "
                "values were on the device only (a TrainingStep defers host copies): those changes were made to "
                "out-of-date copies and are discarded, the device's values restored; call step.synchronize() "
                "before changing parameters or optimizer state on the host"
            )
        return copied

    def defer(self, tensor: torch.Tensor, device_buffer: cl.Buffer) -> None:
        """A replayed step updated ``tensor`` on the device (through ``device_buffer``, the buffer
        this table holds for it): its host copy is current again only at the next
        :meth:`synchronize`. A copy is recorded as deferred and marked out of date; host memory used
        in place is made coherent for the host then. The step has finished when this is called."""
        entry = self._lookup(id(tensor))
        nbytes = tensor.numel() * tensor.element_size()
        if entry is not None and entry.shared and entry.buffer is device_buffer:
            self._unsynced_shared[device_buffer.int_ptr] = (weakref.ref(tensor), device_buffer, nbytes)
            return
        key = id(tensor)
        self._stale[key] = _Deferred(weakref.ref(tensor, self._make_finalizer(key, "_stale")), device_buffer,
                                     version_of(tensor))
        poison(tensor)

    def deferred_versions(self) -> dict[int, int | None]:
        """The current version of each deferred tensor, by key (see :meth:`accept_versions`)."""
        return {key: version_of(tensor) for key, d in self._stale.items() if (tensor := d.ref()) is not None}

    def accept_versions(self, before: dict[int, int | None]) -> None:
        """After a step failed midway: take the current version of each deferred tensor the host had
        not changed before the step (its record matched ``before``), since the only changes during
        the step are the caller's own bumps (AOTAutograd bumps inputs it updates before the call).
        Host edits made before the step stay conflicts."""
        for key, deferred in self._stale.items():
            tensor = deferred.ref()
            if tensor is not None and key in before and before[key] == deferred.version:
                deferred.version = version_of(tensor)

    def is_deferred(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s current value was deferred to the device (and the host left as is)."""
        stale = self._stale.get(id(tensor))
        return stale is not None and stale.alive(tensor) and stale.version == version_of(tensor)

    def deferred_keys(self) -> Any:
        """The ids of the deferred tensors (a live view: ``id(t) in residency.deferred_keys()``)."""
        return self._stale.keys()

    @property
    def has_deferred(self) -> bool:
        """Whether a host copy may be out of date (:attr:`deferred_tensors` > 0, cheaply: a record
        whose tensor died since counts until the next sync point drops it)."""
        return bool(self._stale)

    @property
    def deferred_tensors(self) -> int:
        return sum(1 for d in self._stale.values() if d.ref() is not None)

    def adopt(self, tensor: torch.Tensor, owner: np.ndarray, block: Any) -> None:
        """``tensor`` (over ``owner``'s memory) is a new host copy of what ``block`` holds on the
        device (a downloaded graph output): remember the device copy, so that a graph reading this
        memory next, unchanged, through the tensor or an alias of it, uploads nothing. The block
        stays out of the pool until the memory is freed or changed."""
        version = version_of(tensor)
        if version is None or not tensor.is_contiguous():
            return
        key = tensor.data_ptr()
        owner_ref = weakref.ref(owner, self._make_finalizer(key, "_adopted"))
        self._adopted[key] = _Entry(owner_ref, version, key, tensor.numel() * tensor.element_size(), block.buffer,
                                    False, None, block)

    def _adopted_copy(self, tensor: torch.Tensor, nbytes: int, version: int | None,
                      version_bumped: bool) -> cl.Buffer | None:
        """The device copy of ``tensor``'s memory made by :meth:`adopt`, if still current; a stale
        one is dropped (the tensor gets an entry of its own when it is uploaded)."""
        entry = self._adopted.get(tensor.data_ptr())
        if entry is None:
            return None
        if entry.ref() is not None and entry.nbytes == nbytes and tensor.is_contiguous() \
                and version is not None and entry.version is not None \
                and (entry.version == version or (version_bumped and entry.version + 1 == version)):
            return entry.buffer
        del self._adopted[tensor.data_ptr()]
        entry.release()
        return None

    def _remember(self, tensor: torch.Tensor, key: int, version: int, nbytes: int, device_buffer: cl.Buffer,
                  shared: bool, pinned: bool) -> None:
        was_pinned = key in self._pinned
        self._pinned.pop(key, None)
        self._transient.pop(key, None)
        new = _Entry(weakref.ref(tensor, self._make_finalizer(key)), version, tensor.data_ptr(), nbytes,
                     device_buffer, shared, host_array(tensor) if shared else None)
        if pinned or was_pinned:
            self._pinned[key] = new
        else:
            self._transient[key] = new
            while len(self._transient) > TRANSIENT_SLOTS:
                self._transient.popitem(last=False)  # still alive: its memory outlives the buffer

    def _make_finalizer(self, key: int, *tables: str) -> Any:
        """A weakref callback dropping ``key``'s entry from the named tables (default: the
        tensor-keyed ones; also ``_adopted`` and ``_stale``) and releasing it, unless the entry was
        replaced meanwhile."""
        owner = weakref.ref(self)
        names = tables or ("_pinned", "_transient")

        def forget(ref: weakref.ref[Any]) -> None:
            residency = owner()
            if residency is None:
                return
            for table in (getattr(residency, name) for name in names):
                entry = table.get(key)
                if entry is not None and entry.ref is ref:
                    del table[key]
                    entry.release()

        return forget

    def _forget(self, key: int) -> None:
        self._pinned.pop(key, None)
        self._transient.pop(key, None)

    def invalidate(self, tensor: torch.Tensor) -> None:
        self._forget(id(tensor))

    def clear(self) -> None:
        self._pinned.clear()
        self._transient.clear()
        self._adopted.clear()
