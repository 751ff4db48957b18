"""Host copies left out of date on purpose: a training step that keeps parameters and optimizer
state on the device defers their host copies to the next sync point (:meth:`Deferral.synchronize`).

Invariants:
  * A record (:class:`DeferredCopy`) holds its tensor weakly and the buffer the copy table holds
    for it, which has the current value; it goes when the tensor dies, or at the sync point.
  * Its version is the tensor's when deferred: another version (beyond a caller's announced bump
    of one) means the host changed an out-of-date copy, a conflict reported in the user's words.
  * A deferred copy's host memory carries a NaN mark (:func:`poison`) once no copy in flight
    reads it: at once for a replay (its step has finished), after the wait for transfers otherwise.
  * Host memory shared in place that a replay wrote is made coherent for the host at the sync
    point, not after every step.
  * :attr:`Deferral.stale` is never replaced, so a view of its keys stays live.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import torch

from torch_adreno.runtime.copies import CopyTable
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS
from torch_adreno.runtime.host_memory import Transfers, host_array, poison, sync_shared, version_of


@dataclass
class DeferredCopy:
    """A host tensor whose current value is only on the device (see :attr:`Residency.deferring`)."""

    ref: weakref.ref[torch.Tensor]
    buffer: Any
    #: The tensor's version when the value was deferred: any other version means the host changed it.
    version: int | None

    def alive(self, tensor: torch.Tensor) -> bool:
        return self.ref() is tensor


class Deferral:
    """The deferred host copies of one residency, by tensor id, and the copies back at sync points
    (through ``transfers``)."""

    def __init__(self, runtime: DeviceRuntime, transfers: Transfers) -> None:
        self.runtime = runtime
        self.transfers = transfers
        # Host tensors whose current values are on the device only, by id.
        self.stale: dict[int, DeferredCopy] = {}
        # Deferred tensors to mark as out of date once the copies in flight have read their memory.
        self._to_mark: list[int] = []
        # Host-pointer buffers a replayed step wrote, by buffer handle.
        self._unsynced_shared: dict[int, tuple[weakref.ref[torch.Tensor], cl.Buffer, int]] = {}
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

    def live(self, tensor: torch.Tensor, key: int) -> DeferredCopy | None:
        """``tensor``'s record (``key``: its id), unless that belongs to a dead tensor of that id."""
        deferred = self.stale.get(key)
        return deferred if deferred is not None and deferred.alive(tensor) else None

    def check_unchanged(self, tensor: torch.Tensor, deferred: DeferredCopy, version: int | None,
                        version_bumped: bool, graph: str, buffer: str) -> None:
        """Raise if the host changed deferred ``tensor`` (now at ``version``): a graph would read
        its out-of-date host copy's change. ``version_bumped``: as for :meth:`Residency.buffer_for`."""
        if deferred.version is not None and version is not None and version != deferred.version \
                and not (version_bumped and version == deferred.version + 1):
            raise RuntimeError(
                f"{self.name_of(tensor, f'input {buffer} of {graph}')} was changed on the host while its current "
                "value was on the device only (a TrainingStep defers host copies): call step.synchronize() before changing "
                "parameters or optimizer state on the host"
            )

    def _record(self, tensor: torch.Tensor, device_buffer: Any) -> int:
        key = id(tensor)
        self.stale[key] = DeferredCopy(weakref.ref(tensor, self._make_finalizer(key)), device_buffer,
                                       version_of(tensor))
        return key

    def defer(self, tensor: torch.Tensor, device_buffer: Any) -> None:
        """Record ``tensor`` as deferred and mark its host copy now (no copy in flight reads it)."""
        self._record(tensor, device_buffer)
        poison(tensor)

    def defer_after_transfers(self, tensor: torch.Tensor, device_buffer: Any) -> None:
        """Record ``tensor`` as deferred; its host copy is marked at :meth:`mark_out_of_date`
        (an upload of its memory may still be in flight)."""
        self._to_mark.append(self._record(tensor, device_buffer))

    def defer_shared(self, tensor: torch.Tensor, device_buffer: cl.Buffer, nbytes: int) -> None:
        """``device_buffer``, over ``tensor``'s own memory, was written: coherent at the sync point."""
        self._unsynced_shared[device_buffer.int_ptr] = (weakref.ref(tensor), device_buffer, nbytes)

    def written_back(self, tensor: torch.Tensor) -> None:
        """``tensor``'s host copy is being made current: it is not deferred any more."""
        self.stale.pop(id(tensor), None)

    def mark_out_of_date(self) -> None:
        """Mark the host copies deferred since the last call whose tensors the host has not changed
        since; called once the copies in flight are done."""
        for key in self._to_mark:
            deferred = self.stale.get(key)
            tensor = deferred.ref() if deferred is not None else None
            if tensor is not None and deferred is not None and deferred.version == version_of(tensor):
                poison(tensor)
        self._to_mark.clear()

    def synchronize(self, copies: CopyTable) -> int:
        """Copy every deferred value to its host tensor and make written shared memory coherent (for
        the buffers ``copies`` still holds); returns the bytes copied. A tensor the host changed
        meanwhile gets the device's values too (the host changed an out-of-date copy, so its change
        is discarded), reported in a RuntimeError raised once all are copied."""
        copied = 0
        conflicts: list[str] = []
        for ref, buffer, nbytes in self._unsynced_shared.values():
            tensor = ref()
            entry = copies.lookup(id(tensor)) if tensor is not None else None
            # A dead tensor's buffer was released with its entry: nothing is left to make coherent.
            # (An entry the table dropped while the tensor lives left the buffer to its holder.)
            if tensor is not None and (entry is None or entry.buffer is buffer):
                sync_shared(self.runtime, buffer, nbytes, write=False)
        self._unsynced_shared.clear()
        for key, deferred in list(self.stale.items()):
            tensor = deferred.ref()
            del self.stale[key]
            if tensor is None:
                continue
            if version_of(tensor) != deferred.version:
                conflicts.append(self.name_of(tensor, f"a tensor of shape {list(tensor.shape)}"))
            target = host_array(tensor)
            event = self.transfers.download(target, deferred.buffer)
            BUS.transfer("synchronize", "d2h", target.nbytes, "deferred", "synchronize", event=event)
            copied += target.nbytes
        self.transfers.wait()
        self.mark_out_of_date()
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

    def deferred_versions(self) -> dict[int, int | None]:
        """The current version of each deferred tensor, by key (see :meth:`accept_versions`)."""
        return {key: version_of(tensor) for key, d in self.stale.items() if (tensor := d.ref()) is not None}

    def accept_versions(self, before: dict[int, int | None]) -> None:
        """Take the current version of each deferred tensor whose record matched ``before``."""
        for key, deferred in self.stale.items():
            tensor = deferred.ref()
            if tensor is not None and key in before and before[key] == deferred.version:
                deferred.version = version_of(tensor)

    def is_deferred(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s current value was deferred to the device (and the host left as is)."""
        stale = self.stale.get(id(tensor))
        return stale is not None and stale.alive(tensor) and stale.version == version_of(tensor)

    def deferred_tensors(self) -> int:
        """How many deferred records' tensors are alive."""
        return sum(1 for d in self.stale.values() if d.ref() is not None)

    def _make_finalizer(self, key: int) -> Any:
        """A weakref callback dropping ``key``'s record, unless it was replaced meanwhile."""
        owner = weakref.ref(self)

        def forget(ref: weakref.ref[Any]) -> None:
            deferral = owner()
            if deferral is not None:
                deferred = deferral.stale.get(key)
                if deferred is not None and deferred.ref is ref:
                    del deferral.stale[key]

        return forget
