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

import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from torch_adreno.runtime.copies import TRANSIENT_SLOTS, CopyTable
from torch_adreno.runtime.deferral import Deferral
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.host_memory import (
    Transfers,
    host_array,
    poison,
    shared_buffer,
    sync_shared,
    version_of,
)

# (The host-memory helpers are imported from here by the executable and the replay.)
__all__ = ["TRANSIENT_SLOTS", "Residency", "host_array", "poison", "shared_buffer", "sync_shared", "version_of"]


# Every residency, so that one reading a host tensor another deferred can make it current first.
_ALL_RESIDENCIES: list[weakref.ref[Residency]] = []


def _over_memory_of(device_buffer: Any, tensor: torch.Tensor) -> bool:
    """Whether ``device_buffer`` was made over ``tensor``'s own host memory (``USE_HOST_PTR``)."""
    host = getattr(device_buffer, "hostbuf", None)
    return host is not None and tensor.numel() > 0 and np.asarray(host).ctypes.data == tensor.data_ptr()


@dataclass(frozen=True)
class StepContext:
    """What a :class:`~torch_adreno.TrainingStep`'s graph calls are told about the step they are part
    of (:meth:`Residency.in_step`): its heap group, whether its parameter copies are heap regions
    (its ``heap_copies`` option), and whether it keeps values on the device (``defers``: False
    where host code runs between its graphs and reads their outputs and the parameters)."""

    heap_group: Any = None
    heap_copies: bool = True
    defers: bool = True


#: The residency and step the graph calls of this context belong to (None: no step).
_IN_STEP: ContextVar[tuple[Residency, StepContext] | None] = ContextVar("torch_adreno_in_step", default=None)


class Residency:
    """Device views (shared) or copies of host tensors, for one device runtime.

    A façade over three parts sharing one queue: the copy table and the binding of inputs
    (:class:`~torch_adreno.runtime.copies.CopyTable`), the records of host copies deferred by a
    training step (:class:`~torch_adreno.runtime.deferral.Deferral`), and the copies in flight
    (:class:`~torch_adreno.runtime.host_memory.Transfers`). Invariants: a graph of this residency
    binding a tensor with a live deferral record binds the deferred device copy (a host change
    since raises), and one of another residency synchronizes that residency first; every graph
    call ends with :meth:`finish_transfers`, after which no copy reads or writes host memory.
    """

    def __init__(self, runtime: DeviceRuntime, zero_copy: bool) -> None:
        self.runtime = runtime
        self.zero_copy = zero_copy
        # Copies enqueued without waiting, with the host memory they read or write: it must stay
        # as it is (and alive) until :meth:`finish_transfers`, which every graph call ends with.
        self._transfers = Transfers(runtime)
        self._copies = CopyTable(runtime, self._transfers)
        self._deferral = Deferral(runtime, self._transfers)
        #: How many times :meth:`synchronize` ran (a replayed step re-defers its updates after one).
        self.synchronizations = 0
        _ALL_RESIDENCIES[:] = [ref for ref in _ALL_RESIDENCIES if ref() is not None]
        _ALL_RESIDENCIES.append(weakref.ref(self))

    @contextlib.contextmanager
    def in_step(self, step: StepContext) -> Iterator[None]:
        """Graph calls of this residency in this thread (and its context) run as part of ``step``
        until the block ends: see :class:`StepContext`."""
        token = _IN_STEP.set((self, step))
        try:
            yield
        finally:
            _IN_STEP.reset(token)

    def _step(self) -> StepContext | None:
        current = _IN_STEP.get()
        return current[1] if current is not None and current[0] is self else None

    @property
    def deferring(self) -> bool:
        """Inside a TrainingStep's step (:meth:`in_step`): updated inputs are not written back and
        gradients are not downloaded; the device copies are the current values until
        :meth:`synchronize`."""
        step = self._step()
        return step is not None and step.defers

    @property
    def heap_group(self) -> Any:
        """The device heap group new parameter copies are placed in: the step's, so that its
        replay's slab holds its own tensors only (None outside a step)."""
        step = self._step()
        return None if step is None else step.heap_group

    @property
    def heap_copies(self) -> bool:
        """Whether parameter copies made now are heap regions (False: buffers of their own)."""
        step = self._step()
        return True if step is None else step.heap_copies

    def add_namer(self, namer: Callable[[torch.Tensor], str | None]) -> None:
        """Register a bound method naming tensors (``0.weight``) for error messages; held weakly."""
        self._deferral.add_namer(namer)

    def name_of(self, tensor: torch.Tensor, fallback: str) -> str:
        """``tensor``'s name from the registered namers, else ``fallback``."""
        return self._deferral.name_of(tensor, fallback)

    def finish_transfers(self) -> None:
        """Wait for the copies :meth:`buffer_for` and :meth:`write_back` started. Not waiting for
        each one lets the host go on enqueueing while the device copies (a blocking copy on an
        in-order queue also waits for every kernel before it)."""
        self._transfers.wait()
        # Marked only now: an upload of the same memory may have been in flight until the wait.
        self._deferral.mark_out_of_date()

    def __len__(self) -> int:
        return len(self._copies)

    def resident_bytes(self) -> int:
        """Device bytes held as copies (shared buffers occupy host memory only)."""
        return self._copies.resident_bytes()

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
        deferred = self._deferral.live(tensor, key)
        if deferred is not None:
            self._deferral.check_unchanged(tensor, deferred, version, version_bumped, graph, buffer)
        nbytes = tensor.numel() * tensor.element_size()
        entry = self._copies.lookup(key)
        if deferred is not None and (entry is None or entry.buffer is not deferred.buffer) and version is not None:
            # Deferred, then dropped from the table (evicted): the deferred copy is the current value.
            self._copies.remember(tensor, key, version, nbytes, deferred.buffer, False, pinned)
            return deferred.buffer
        return self._copies.bind(tensor, entry, version, nbytes, shared=self.zero_copy and tensor.is_contiguous(),
                                 pinned=pinned, graph=graph, buffer=buffer, version_bumped=version_bumped,
                                 heap_copies=self.heap_copies, heap_group=self.heap_group)

    def refresh(self, tensor: torch.Tensor, device_buffer: Any, queue: cl.CommandQueue, graph: str) -> Any:
        """The host changed ``tensor``, a step input bound to ``device_buffer`` (its buffer in this
        table): make the device see the new value, on ``queue`` and ordered before what is enqueued
        there next. Returns the host memory the copy reads (keep it alive until the queue is
        drained), or None where nothing was copied (host memory shared in place: made coherent)."""
        nbytes = tensor.numel() * tensor.element_size()
        entry = self._copies.lookup(id(tensor))
        if entry is not None and entry.ref() is tensor and entry.buffer is device_buffer:
            entry.version = version_of(tensor)
        if entry is not None and entry.shared and entry.buffer is device_buffer:
            sync_shared(self.runtime, device_buffer, nbytes, write=True)
            return None
        source = host_array(tensor)
        cl.enqueue_copy(queue, device_buffer, source, is_blocking=False)
        BUS.transfer(graph, "h2d", nbytes, self.name_of(tensor, "a step input"), "input")
        return source

    def _synchronize_elsewhere_deferred(self, tensor: torch.Tensor, key: int) -> None:
        """A graph of this residency reads ``tensor``, whose current value another residency holds
        deferred (a zero-copy graph evaluating a model between copy-mode steps): copy it to the
        host first, or this graph would read the out-of-date host copy."""
        for ref in _ALL_RESIDENCIES:
            other = ref()
            if other is not None and other is not self and other._deferral.stale \
                    and other._deferral.live(tensor, key) is not None:
                other.synchronize()

    def write_back(self, tensor: torch.Tensor, device_buffer: Any, graph: str, buffer: str) -> None:
        """The device updated ``tensor`` (an optimizer step): make the host copy right again (once
        :meth:`finish_transfers` returned), or while :attr:`deferring`, at :meth:`synchronize`."""
        nbytes = tensor.numel() * tensor.element_size()
        entry = self._copies.lookup(id(tensor))
        if entry is not None and entry.ref() is tensor and entry.buffer is device_buffer:
            # Host and device hold the same values again (once the copy below is done): a graph
            # reading the tensor next uses the device copy without uploading it.
            entry.version = version_of(tensor)
        if entry is not None and entry.shared and entry.buffer is device_buffer:
            sync_shared(self.runtime, device_buffer, nbytes, write=False)
            return
        adopted = self._copies.adopted_entry(tensor)
        if adopted is not None and adopted.buffer is device_buffer and adopted.ref() is not None:
            # A graph output updated in place on the device (gradients clipped inside a step): the
            # device copy stays the current one.
            adopted.version = version_of(tensor)
            if self.deferring:
                return  # its host copy was never filled in while deferring (see Executable)
        if not self.deferring:
            self._deferral.written_back(tensor)  # written back below: the host copy is current again
        if self.deferring and entry is not None and entry.ref() is tensor and entry.buffer is device_buffer \
                and tensor.is_contiguous():
            self._deferral.defer_after_transfers(tensor, device_buffer)  # marked at finish_transfers
            return
        if nbytes:
            if not tensor.is_contiguous():
                raise RuntimeError(f"{graph}: cannot write the new value of non-contiguous input {buffer} back")
            self._transfers.download(host_array(tensor), device_buffer)
        BUS.transfer(graph, "d2h", nbytes, buffer, "mutation")

    def synchronize(self) -> int:
        """Copy every deferred value to its host tensor; returns the bytes copied. A tensor the host
        changed meanwhile gets the device's values too (the host changed an out-of-date copy, so its
        change is discarded), reported in a RuntimeError raised once all are copied."""
        self.synchronizations += 1
        return self._deferral.synchronize(self._copies)

    def defer(self, tensor: torch.Tensor, device_buffer: cl.Buffer) -> None:
        """A replayed step updated ``tensor`` on the device (through ``device_buffer``, the buffer
        this table holds for it): its host copy is current again only at the next
        :meth:`synchronize`. A copy is recorded as deferred and marked out of date; host memory used
        in place is made coherent for the host then. The step has finished when this is called."""
        entry = self._copies.lookup(id(tensor))
        if (entry is not None and entry.shared and entry.buffer is device_buffer) or _over_memory_of(device_buffer, tensor):
            # (Also where the table dropped its entry since: marking the copy out of date would
            # write the mark into the memory the device computes in.)
            self._deferral.defer_shared(tensor, device_buffer, tensor.numel() * tensor.element_size())
            return
        self._deferral.defer(tensor, device_buffer)

    def deferred_versions(self) -> dict[int, int | None]:
        """The current version of each deferred tensor, by key (see :meth:`accept_versions`)."""
        return self._deferral.deferred_versions()

    def accept_versions(self, before: dict[int, int | None]) -> None:
        """After a step failed midway: take the current version of each deferred tensor the host had
        not changed before the step (its record matched ``before``), since the only changes during
        the step are the caller's own bumps (AOTAutograd bumps inputs it updates before the call).
        Host edits made before the step stay conflicts."""
        self._deferral.accept_versions(before)

    def is_deferred(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s current value was deferred to the device (and the host left as is)."""
        return self._deferral.is_deferred(tensor)

    def deferred_keys(self) -> Any:
        """The ids of the deferred tensors (a live view: ``id(t) in residency.deferred_keys()``)."""
        return self._deferral.stale.keys()

    @property
    def has_deferred(self) -> bool:
        """Whether a host copy may be out of date (:attr:`deferred_tensors` > 0, cheaply: a record
        whose tensor died since counts until the next sync point drops it)."""
        return bool(self._deferral.stale)

    @property
    def deferred_tensors(self) -> int:
        return self._deferral.deferred_tensors()

    def adopt(self, tensor: torch.Tensor, owner: np.ndarray, block: Any) -> None:
        """``tensor`` (over ``owner``'s memory) is a new host copy of what ``block`` holds on the
        device (a downloaded graph output): remember the device copy, so that a graph reading this
        memory next, unchanged, through the tensor or an alias of it, uploads nothing. The block
        stays out of the pool until the memory is freed or changed."""
        self._copies.adopt(tensor, owner, block)

    def invalidate(self, tensor: torch.Tensor) -> None:
        self._copies.forget(id(tensor))

    def clear(self) -> None:
        self._copies.clear()
