"""Memory planning: FusedGraph -> MemoryPlan, where every buffer of a graph lives on the device.

* Graph inputs are bound at call time (parameters stay resident between calls).
* Outputs that stay on the device for a later graph (saved activations) escape the call, so each
  call gets fresh storage for them.
* Everything else (intermediates, outputs copied back to the host) lives in arenas allocated once
  per compiled graph: aligned sub-ranges of device buffers no larger than the device's maximum
  single allocation.

Invariant (tested): two arena buffers whose lifetimes overlap never share bytes. This plan gives
every arena buffer its own range (no reuse), the baseline against which reuse is measured.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from torch_adreno import ir
from torch_adreno.errors import DeviceMemoryError
from torch_adreno.fusion import FusedGraph
from torch_adreno.target import DeviceProfile


class StorageKind(enum.Enum):
    INPUT = "input"
    PER_CALL = "per_call"
    ARENA = "arena"


@dataclass(frozen=True)
class Allocation:
    buffer: str
    kind: StorageKind
    nbytes: int
    arena: int = -1
    offset: int = 0
    first_use: int = -1
    last_use: int = -1


@dataclass
class MemoryPlan:
    """Where each buffer lives. ``arena_bytes[i]`` is the size of arena ``i``."""

    allocations: dict[str, Allocation]
    arena_bytes: list[int]
    alignment: int

    @property
    def planned_arena_bytes(self) -> int:
        return sum(self.arena_bytes)

    @property
    def per_call_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations.values() if a.kind is StorageKind.PER_CALL)

    def describe(self) -> str:
        lines = [f"memory plan: {len(self.arena_bytes)} arena(s), {self.planned_arena_bytes} bytes; "
                 f"{self.per_call_bytes} bytes per call"]
        for a in sorted(self.allocations.values(), key=lambda a: (a.kind.value, a.arena, a.offset)):
            where = f"arena{a.arena}+{a.offset}" if a.kind is StorageKind.ARENA else a.kind.value
            lines.append(f"  {a.buffer}: {a.nbytes} B at {where}, live [{a.first_use}, {a.last_use}]")
        return "\n".join(lines)


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def live_ranges(fused: FusedGraph) -> dict[str, tuple[int, int]]:
    """First and last kernel index touching each buffer (outputs live to the end)."""
    ranges: dict[str, tuple[int, int]] = {}
    end = len(fused.groups)
    for i, group in enumerate(fused.groups):
        for name in [*group.reads, *group.writes]:
            first, _ = ranges.get(name, (i, i))
            ranges[name] = (first, i)
    for name in fused.graph.output_buffers():
        first, _ = ranges.get(name, (end, end))
        ranges[name] = (first, end)
    return ranges


def plan_memory(fused: FusedGraph, profile: DeviceProfile) -> MemoryPlan:
    graph = fused.graph
    alignment = max(profile.base_addr_align_bytes, 4)
    inputs = graph.input_buffers()
    escaping = {o.buffer for o in graph.outputs if o.buffer is not None and o.role is ir.OutputRole.DEVICE}
    ranges = live_ranges(fused)
    allocations: dict[str, Allocation] = {}
    arena_bytes: list[int] = []
    exists = inputs | fused.stored_buffers()
    for name, buf in graph.buffers.items():
        if name not in exists:
            continue  # fused away: computed in registers, never stored
        first, last = ranges.get(name, (-1, -1))
        nbytes = max(buf.nbytes, 1)
        if name in inputs:
            allocations[name] = Allocation(name, StorageKind.INPUT, nbytes, first_use=first, last_use=last)
        elif name in escaping:
            allocations[name] = Allocation(name, StorageKind.PER_CALL, nbytes, first_use=first, last_use=last)
        else:
            if nbytes > profile.max_alloc_bytes:
                raise DeviceMemoryError(
                    f"buffer {name} needs {nbytes} bytes, more than the device's largest single "
                    f"allocation ({profile.max_alloc_bytes} bytes); use a smaller batch"
                )
            arena = next((i for i, used in enumerate(arena_bytes)
                          if _align(used, alignment) + nbytes <= profile.max_alloc_bytes), None)
            if arena is None:
                arena_bytes.append(0)
                arena = len(arena_bytes) - 1
            offset = _align(arena_bytes[arena], alignment)
            arena_bytes[arena] = offset + nbytes
            allocations[name] = Allocation(name, StorageKind.ARENA, nbytes, arena, offset, first, last)
    return MemoryPlan(allocations, arena_bytes, alignment)
