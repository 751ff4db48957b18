"""The one interval packer of the memory plans: values with lifetimes, packed into slots.

Both plans use it: a compiled graph's (:func:`torch_adreno.memory.plan.plan_memory`, lifetimes in
kernels) and a replayed training step's (:func:`torch_adreno.replay.memory.plan_step_memory`,
lifetimes in the step's operations). Largest value first (ties: by rank, by default the first use,
then key); each
goes into a preset slot (a donated input's bytes) where one is large enough and free for its whole
lifetime (the smallest such), else into the first packed slot that is (slots are made largest
first, so that is the largest fitting one), else into a new slot of its size. (First fit, the
graph plan's rule all along; the step plan used the smallest fitting slot until both shared this
packer: over the four reference models' steps the difference is within 0.1% either way, and first
fit gave the smaller total.)

Invariants of the packing: two values whose lifetimes ``[first, last]`` overlap never share a
slot; a slot is at least as large as every value placed in it; every value starts at its slot's first byte (no two
views of one allocation ever overlap partially: some drivers fault on overlapping sub-buffers).

Where the packed slots must live in buffers no larger than a device's largest allocation
(``CL_DEVICE_MAX_MEM_ALLOC_SIZE``: a replayed step's arena), :func:`split_into_buffers` lays them
out in as few such buffers as first fit makes, no slot straddling two.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Interval:
    """A value to place: ``nbytes`` live from operation ``first`` to ``last`` (both included)."""

    key: Hashable
    nbytes: int
    first: int
    last: int
    #: Among values of one size, lower ranks are placed first (default: the first use).
    rank: int | None = None


@dataclass
class PresetSlot:
    """Storage that exists before packing (a donated input): ``size`` bytes, busy over ``busy``."""

    key: str
    size: int
    busy: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Packing:
    """Per value, its slot: a packed slot's index, or the key of the preset slot it went into;
    and the packed slots' sizes."""

    slot_of: dict[Hashable, int | str]
    sizes: tuple[int, ...]

    def packed_slot(self, key: Hashable) -> int:
        """The packed slot of a value that went into none of the presets."""
        slot = self.slot_of[key]
        if not isinstance(slot, int):
            raise ValueError(f"{key!r} went into preset slot {slot!r}, not a packed one")
        return slot


def _free(busy: list[tuple[int, int]], first: int, last: int) -> bool:
    return all(last < start or end < first for start, end in busy)


def pack_intervals(values: Sequence[Interval], presets: Sequence[PresetSlot] = ()) -> Packing:
    """Pack ``values`` (see the module docstring). ``presets`` are updated with the lifetimes
    placed in them. Values already placed in a preset by the caller (an element-wise overwrite of
    a donor) must be in its ``busy`` list and left out of ``values``."""
    slot_of: dict[Hashable, int | str] = {}
    sizes: list[int] = []
    busy: list[list[tuple[int, int]]] = []
    for value in sorted(values, key=lambda v: (-v.nbytes, v.first if v.rank is None else v.rank, str(v.key))):
        fitting = [p for p in presets if p.size >= value.nbytes and _free(p.busy, value.first, value.last)]
        if fitting:
            preset = min(fitting, key=lambda p: (p.size, str(p.key)))
            preset.busy.append((value.first, value.last))
            slot_of[value.key] = preset.key
            continue
        free = [s for s in range(len(sizes)) if sizes[s] >= value.nbytes and _free(busy[s], value.first, value.last)]
        if free:
            slot = free[0]
        else:
            slot = len(sizes)
            sizes.append(value.nbytes)
            busy.append([])
        busy[slot].append((value.first, value.last))
        slot_of[value.key] = slot
    return Packing(slot_of, tuple(sizes))


@dataclass(frozen=True)
class BufferSplit:
    """Where :func:`split_into_buffers` put each block: ``placed[i]`` is block ``i``'s (buffer,
    byte offset); ``sizes`` are the buffers' bytes."""

    placed: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]


class AllocationLimitError(ValueError):
    """A block larger than the buffers it must go into (a single value above the largest allocation)."""


def split_into_buffers(blocks: Sequence[int], capacity: int, alignment: int) -> BufferSplit:
    """Lay out contiguous ``blocks`` (bytes each: a packed slot, or a group of values that must share
    one buffer) in as few buffers of at most ``capacity`` bytes as first fit in the given order
    makes: each block goes at the end of the first buffer it still fits in, else into a new one.

    Invariants: no block straddles two buffers; every block starts at a multiple of ``alignment``
    and takes its size rounded up to it (a buffer's size is a multiple too, and at most
    ``capacity`` rounded down to it); blocks of one buffer never share a byte. When everything fits
    in one buffer, the layout is the blocks one after another in order (what a single buffer holds).
    Slots come from :func:`pack_intervals` largest first, so first fit in their order is first fit
    decreasing: at most 11/9 of the fewest buffers possible, plus one (Johnson's bound for bin packing).
    A block larger than the capacity raises :class:`AllocationLimitError`."""
    usable = capacity // alignment * alignment
    ends: list[int] = []
    placed: list[tuple[int, int]] = []
    for position, nbytes in enumerate(blocks):
        size = -(-max(nbytes, 1) // alignment) * alignment
        if size > usable:
            raise AllocationLimitError(f"block {position} of {nbytes} bytes does not fit in a buffer of "
                                       f"{capacity} bytes (aligned to {alignment})")
        buffer = next((b for b, end in enumerate(ends) if end + size <= usable), len(ends))
        if buffer == len(ends):
            ends.append(0)
        placed.append((buffer, ends[buffer]))
        ends[buffer] += size
    return BufferSplit(tuple(placed), tuple(ends))
