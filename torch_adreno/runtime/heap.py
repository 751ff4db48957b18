"""Long-lived device memory as regions of a few large buffers (slabs).

A replayed step binds every kernel argument once, yet a driver still pays per argument at each
enqueue (``docs/design/replay.md`` has NVIDIA's OpenCL driver's figure). With the replay's own
memory in one arena, the persistent tensors (parameters, buffers, optimizer state) are most of a
step's remaining arguments, most of all in the optimizer update. Their device copies (copy mode),
and the replays' arenas there, are therefore regions of shared slabs: a replay's kernels address everything that lives in one
slab through that one argument at constant offsets (:func:`torch_adreno.kernels.arena_params.place_in_arena`).

A region is an OpenCL sub-buffer, so the rest of the runtime (graph calls, copies, images) uses it
as any buffer. Invariants:

- regions alive at the same time never share a byte; every region starts at a multiple of
  :attr:`DeviceHeap.alignment` (the device's sub-buffer alignment, and the arena rewrite's);
- a region returns to its slab only once no Python object references its sub-buffer (the
  region's record is an attribute of the sub-buffer object, freed with it), so whoever may still
  enqueue work on a region (a replay, a graph call's bindings, an image) keeps it by holding the
  buffer. Work already enqueued on the runtime's in-order queue precedes any later use of the
  bytes; a replay's own queue is drained by its blocking loss read, and a replay holds its regions;
- a slab whose regions are all free is released;
- slabs belong to one group (a :class:`~torch_adreno.TrainingStep`'s tensors and replays, say):
  a region is taken from its group's slabs only. NVIDIA's OpenCL driver makes every enqueue binding
  a buffer dearer with each live sub-buffer of that buffer's parent, so a replay's slab must hold
  its own step's tensors, not every model's and every batch's of the process;
- no slab is larger than the largest single allocation allowed: the device's
  (``CL_DEVICE_MAX_MEM_ALLOC_SIZE``), or a :class:`HeapGroup`'s own limit (a TrainingStep compiled
  for a target takes the target's, so that its slabs would allocate on the target too); a region
  larger than that is refused (:class:`~torch_adreno.errors.DeviceMemoryError`), never a larger slab.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from torch_adreno.errors import DeviceMemoryError
from torch_adreno.kernels.arena_params import OFFSET_ALIGNMENT

#: Bytes of a new slab (a larger request gets a slab of its own size). Large enough that a model's
#: persistent tensors and its replay's arena usually share one, small enough for a phone's budget.
SLAB_BYTES = 64 << 20
#: Where a sub-buffer keeps its region's record (pyopencl's buffers take attributes, not weak references).
_REGION_ATTRIBUTE = "_torch_adreno_heap_region"


@dataclass
class _Slab:
    buffer: cl.Buffer
    nbytes: int
    #: Free ranges (offset, bytes), sorted by offset, adjacent ones merged.
    free: list[tuple[int, int]] = field(default_factory=list)

    def take(self, nbytes: int) -> int | None:
        """The offset of ``nbytes`` taken from the first free range that holds them, or None."""
        for index, (offset, size) in enumerate(self.free):
            if size >= nbytes:
                if size == nbytes:
                    del self.free[index]
                else:
                    self.free[index] = (offset + nbytes, size - nbytes)
                return offset
        return None

    def give_back(self, offset: int, nbytes: int) -> None:
        index = bisect.bisect(self.free, (offset, nbytes))
        self.free.insert(index, (offset, nbytes))
        # Merge with the next range, then with the previous one.
        if index + 1 < len(self.free) and offset + nbytes == self.free[index + 1][0]:
            self.free[index] = (offset, nbytes + self.free[index + 1][1])
            del self.free[index + 1]
        if index and self.free[index - 1][0] + self.free[index - 1][1] == offset:
            self.free[index - 1] = (self.free[index - 1][0], self.free[index - 1][1] + self.free[index][1])
            del self.free[index]

    @property
    def empty(self) -> bool:
        return self.free == [(0, self.nbytes)]


@dataclass(frozen=True, eq=False)
class HeapGroup:
    """A group of slabs (compared by identity) whose slabs and regions are at most
    ``max_allocation_bytes`` (None: the device's limit only); ``owner`` names it in messages."""

    max_allocation_bytes: int | None = None
    owner: str = "a heap group"


class _Region:
    """The record of one region, held by its sub-buffer only: its finalizer gives the bytes back."""

    __slots__ = ("heap", "nbytes", "offset", "slab")

    def __init__(self, heap: DeviceHeap, slab: _Slab, offset: int, nbytes: int) -> None:
        self.heap, self.slab, self.offset, self.nbytes = heap, slab, offset, nbytes

    def __del__(self) -> None:
        # Only recorded here (a finalizer can run in the middle of an allocation): the next
        # allocation, or :meth:`DeviceHeap.collect`, returns the bytes.
        self.heap._freed.append((self.slab, self.offset, self.nbytes))


class DeviceHeap:
    """Regions of slabs of one OpenCL context (see the module docstring)."""

    def __init__(self, context: cl.Context, base_alignment: int, max_allocation: int) -> None:
        self.context = context
        self.alignment = max(256, OFFSET_ALIGNMENT, base_alignment)
        self.max_allocation = max_allocation
        self._slabs: dict[Hashable, list[_Slab]] = {}
        self._freed: list[tuple[_Slab, int, int]] = []
        self._lock = threading.Lock()

    def max_allocation_of(self, group: Hashable) -> int:
        """The largest slab (and region) ``group`` may have."""
        limit = group.max_allocation_bytes if isinstance(group, HeapGroup) else None
        return self.max_allocation if limit is None else min(limit, self.max_allocation)

    def allocate(self, nbytes: int, group: Hashable = None) -> cl.Buffer:
        """A new region of at least ``nbytes`` (one byte for none) in a slab of ``group``, as a
        sub-buffer; :class:`DeviceMemoryError` where ``nbytes`` exceed the group's allocation limit."""
        size = -(-max(nbytes, 1) // self.alignment) * self.alignment
        limit = self.max_allocation_of(group)
        if size > limit:
            owner = group.owner if isinstance(group, HeapGroup) else "the device"
            raise DeviceMemoryError(
                f"a device heap region of {nbytes:,} bytes exceeds the largest single allocation of {owner} "
                f"({limit:,} bytes): one region is one allocation")
        with self._lock:
            self._collect()
            slabs = self._slabs.setdefault(group, [])
            for slab in slabs:
                offset = slab.take(size)
                if offset is not None:
                    return self._region(slab, offset, size, nbytes)
            slab_bytes = max(size, min(SLAB_BYTES, limit))
            slab = _Slab(cl.Buffer(self.context, cl.mem_flags.READ_WRITE, slab_bytes), slab_bytes,
                         [(0, slab_bytes)])
            slabs.append(slab)
            offset = slab.take(size)
            assert offset == 0
            return self._region(slab, offset, size, nbytes)

    def _region(self, slab: _Slab, offset: int, size: int, nbytes: int) -> cl.Buffer:
        buffer = slab.buffer.get_sub_region(offset, max(nbytes, 1))
        setattr(buffer, _REGION_ATTRIBUTE, _Region(self, slab, offset, size))
        return buffer

    def collect(self) -> None:
        """Return the regions freed since the last allocation to their slabs now."""
        with self._lock:
            self._collect()

    def _collect(self) -> None:
        while self._freed:
            slab, offset, size = self._freed.pop()
            slab.give_back(offset, size)
            if slab.empty:
                for group, slabs in list(self._slabs.items()):
                    if any(s is slab for s in slabs):
                        self._slabs[group] = [s for s in slabs if s is not slab]
                        if not self._slabs[group]:
                            del self._slabs[group]

    @property
    def reserved_bytes(self) -> int:
        """Device bytes the slabs hold (free or not)."""
        self.collect()
        return sum(slab.nbytes for slabs in self._slabs.values() for slab in slabs)

    @property
    def used_bytes(self) -> int:
        """Bytes of the regions not yet returned (each rounded up to the alignment)."""
        self.collect()
        return sum(slab.nbytes - sum(size for _, size in slab.free) for slabs in self._slabs.values() for slab in slabs)


def placement(buffer: Any) -> tuple[cl.Buffer, int] | None:
    """Where a region's bytes are: (its slab's buffer, byte offset); None for any other buffer."""
    region = getattr(buffer, _REGION_ATTRIBUTE, None)
    if region is None:
        return None
    return region.slab.buffer, region.offset


_heaps: dict[int, tuple[Any, DeviceHeap]] = {}


def device_heap(runtime: Any) -> DeviceHeap:
    """The heap of ``runtime`` (a :class:`~torch_adreno.runtime.device.DeviceRuntime`)."""
    held = _heaps.get(id(runtime))
    if held is None or held[0] is not runtime:
        device = runtime.device
        held = _heaps[id(runtime)] = (runtime, DeviceHeap(runtime.context, device.mem_base_addr_align // 8,
                                                          device.max_mem_alloc_size))
    return held[1]


__all__ = ["SLAB_BYTES", "DeviceHeap", "HeapGroup", "device_heap", "placement"]
