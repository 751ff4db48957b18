"""Memory planning: FusedGraph -> MemoryPlan, where every buffer of a graph lives.

* Graph inputs are bound at call time (parameters stay resident between calls).
* Outputs that stay on the device for a later graph (saved activations) escape the call: each call
  gets fresh storage for them (``PER_CALL``), released when the later graph is done with them.
* Outputs the caller reads on the host are written straight into host memory on unified-memory
  devices (``HOST``: phones, PoCL; no copy), else they are copied back: a backward's gradients
  from storage of their own that stays on the device as the copy of the host tensor
  (``PER_CALL``, for the optimizer step that reads them next), other outputs from the arena.
* Everything else lives in slots allocated once per compiled graph (``ARENA``: device buffers,
  each at most the device's largest single allocation).

Reuse: buffers whose lifetimes (first to last kernel touching them) do not overlap share one
device buffer (a slot), assigned greedily largest first; in the backward, a saved activation is
such a slot once read for the last time. In place: a pointwise kernel that reads a buffer for the
last time, element for element where it writes another of the same size, writes into the same
bytes; in a segmented kernel (one launch of independent pointwise kernels) only where no other
segment reads that buffer. Every buffer starts at its slot's first byte: no partially overlapping sub-buffers.

Invariant (tested): two arena buffers live at the same time never overlap, except a buffer and the
in-place result that replaces it element by element.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.errors import DeviceMemoryError
from torch_adreno.fusion import FusedGraph, PointwiseKernel, SegmentedKernel
from torch_adreno.memory.footprint import human_bytes
from torch_adreno.memory.intervals import Interval, PresetSlot, pack_intervals
from torch_adreno.targets import DeviceProfile


class StorageKind(enum.Enum):
    INPUT = "input"
    PER_CALL = "per_call"
    HOST = "host"
    ARENA = "arena"
    #: The new value of a mutated input, written straight into that input's own storage.
    INPUT_ALIAS = "input_alias"
    #: Bytes of a saved activation (an input from the forward) that the backward no longer needs.
    DONATED = "donated"


@dataclass(frozen=True)
class Allocation:
    buffer: str
    kind: StorageKind
    nbytes: int
    arena: int = -1
    offset: int = 0
    first_use: int = -1
    last_use: int = -1
    #: The buffer whose bytes this one takes over in place (same arena range), if any.
    in_place_of: str | None = None
    #: For DONATED storage: the input whose bytes (from ``offset``) this buffer uses.
    donor: str | None = None


@dataclass
class MemoryPlan:
    """Where each buffer lives. ``arena_bytes[i]`` is the size of arena ``i``."""

    allocations: dict[str, Allocation]
    arena_bytes: list[int]
    alignment: int
    reuse: bool
    #: Arena bytes the same buffers would need with no reuse at all (each its own range).
    unshared_bytes: int = 0
    #: Per donated input, the other inputs that are views of its bytes (free after all their reads).
    donor_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def planned_arena_bytes(self) -> int:
        return sum(self.arena_bytes)

    @property
    def per_call_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations.values() if a.kind is StorageKind.PER_CALL)

    @property
    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations.values() if a.kind is StorageKind.HOST)

    @property
    def planned_peak_bytes(self) -> int:
        """Device bytes one call needs beyond its inputs: the arenas plus what escapes the call."""
        return self.planned_arena_bytes + self.per_call_bytes + self.host_bytes

    def storage_root(self, buffer: str) -> str:
        """The buffer whose storage ``buffer`` uses (itself unless it was planned in place)."""
        alloc = self.allocations[buffer]
        while alloc.in_place_of is not None:
            alloc = self.allocations[alloc.in_place_of]
        return alloc.buffer

    def describe(self) -> str:
        lines = [f"memory plan ({'reuse' if self.reuse else 'no reuse'}): {len(self.arena_bytes)} arena(s), "
                 f"{self.planned_arena_bytes} bytes (without sharing: {self.unshared_bytes}); "
                 f"{self.per_call_bytes} bytes per call on the device, {self.host_bytes} written to host memory"]
        for a in sorted(self.allocations.values(), key=lambda a: (a.kind.value, a.arena, a.offset, a.first_use)):
            where = (f"arena{a.arena}+{a.offset}" if a.kind is StorageKind.ARENA
                     else f"{a.donor}+{a.offset} (donated)" if a.kind is StorageKind.DONATED else a.kind.value)
            extra = f", in place of {a.in_place_of}" if a.in_place_of else ""
            lines.append(f"  {a.buffer}: {a.nbytes} B at {where}, live [{a.first_use}, {a.last_use}]{extra}")
        lines.extend(f"  note: {n}" for n in self.notes)
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


def _can_overwrite(fused: FusedGraph, index: int, out: str, src: str, ranges: dict[str, tuple[int, int]]) -> bool:
    """Whether kernel ``index`` may write ``out`` into ``src``'s bytes: a pointwise kernel that reads
    ``src`` for the last time, only at the very element where it writes ``out``. In a segmented
    kernel (independent pointwise kernels in one launch) the rule holds for the segment storing
    ``out``, and no other segment may read ``src``: its work-items run alongside at other elements."""
    group = fused.groups[index]
    spec = group.spec
    if src not in group.reads or ranges[src][1] != index:
        return False
    if isinstance(spec, SegmentedKernel):
        segment = spec.segment_storing(out)
        if segment is None or any(seg is not segment for seg in spec.readers(src)):
            return False
        spec = segment
    if not isinstance(spec, PointwiseKernel):
        return False
    a, b = fused.graph.buffers[src], fused.graph.buffers[out]
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    stores = [s for s in spec.stores if s.buffer == out]
    if len(stores) != 1 or any(s.when is not None for s in spec.stores):
        return False  # (guarded stores read their inputs when they store)
    exprs = [s.value for s in spec.stores] + [e for s in spec.stores for e in s.index]
    return all(tuple(ld.index) == tuple(stores[0].index) for e in exprs for ld in ir.loads(e) if ld.buffer == src)


def _in_place_candidates(fused: FusedGraph, arena: set[str], ranges: dict[str, tuple[int, int]]) -> dict[str, str]:
    """result -> the intermediate whose bytes it takes over (see :func:`_can_overwrite`)."""
    replaced: dict[str, str] = {}
    taken: set[str] = set()
    for index, group in enumerate(fused.groups):
        for out in group.writes:
            if out not in arena or ranges[out][0] != index:
                continue
            for name in group.reads:
                if name in arena and name not in taken and _can_overwrite(fused, index, out, name, ranges):
                    replaced[out] = name
                    taken.add(name)
                    break
    return replaced


def _place(items: list[tuple[str, int, int, int]], donors: list[tuple[str, int, int]],
           in_donor: dict[str, str]) -> tuple[dict[str, tuple[int | str, int]], list[int]]:
    """Assign buffers to storage slots (:func:`~torch_adreno.memory.intervals.pack_intervals`): a
    slot (one device buffer) is shared by buffers whose lifetimes do not overlap; a donated input
    is a preset slot, busy until its last read. Returns name -> (slot index or donor, 0) and the
    slot sizes."""
    presets = {name: PresetSlot(name, size, [(-1, last_use)]) for name, size, last_use in donors}
    placed: dict[str, tuple[int | str, int]] = {}
    for name, _, first, last in items:
        if name in in_donor:  # written in place over the donor's last read
            presets[in_donor[name]].busy.append((first, last))
            placed[name] = (in_donor[name], 0)
    packing = pack_intervals([Interval(name, nbytes, first, last) for name, nbytes, first, last in items
                              if name not in placed], list(presets.values()))
    for key, slot in packing.slot_of.items():
        placed[str(key)] = (slot, 0)
    return placed, list(packing.sizes)


def _donor_free_after(donor: str, aliases: Sequence[str], ranges: dict[str, tuple[int, int]]) -> int:
    """The last kernel that reads ``donor``'s bytes, through it or any input viewing them."""
    return max(ranges[name][1] for name in (donor, *aliases) if name in ranges)


def check_allocation(graph: ir.Graph, name: str, kind: StorageKind, profile: DeviceProfile) -> None:
    """Refuse a buffer above the largest single allocation (``CL_DEVICE_MAX_MEM_ALLOC_SIZE``) of the
    device, or of the target it is compiled for: one buffer is one allocation, which no plan can
    split. Inputs are checked only for a target: on the present device their host memory is the
    driver's to place, on the target it is one buffer. The error names the FX node that makes the
    buffer (or the graph input it is), its bytes, the limit and what would make it fit."""
    buffer = graph.buffers[name]
    if buffer.nbytes <= profile.max_alloc_bytes or (kind is StorageKind.INPUT and not profile.target):
        return
    whose = f"target {profile.target}" if profile.target else "the device"
    producer = graph.producers().get(name)
    if kind is StorageKind.INPUT:
        what = (f"input buffer {name} of {graph.name} (a graph input: a parameter, buffer or batch tensor; "
                "split the parameter into several, or use a smaller batch)")
    elif producer is not None and producer.origins:
        made_by = "; ".join(f"FX node {o.node} ({o.op}{f', module {o.module}' if o.module else ''}"
                            f"{f', at {o.source}' if o.source else ''})" for o in producer.origins[:3])
        what = f"the output of {made_by} in {graph.name} (buffer {name})"
    else:
        what = f"buffer {name} of {graph.name}"
    raise DeviceMemoryError(
        f"{what}, shape {list(buffer.shape)} {buffer.dtype.name}, needs {buffer.nbytes} bytes, more than the "
        f"largest single allocation of {whose} ({profile.max_alloc_bytes} bytes, "
        f"{human_bytes(profile.max_alloc_bytes)}), and one tensor is one buffer. To fit: a smaller batch "
        "(the tensor's first dimension), 16-bit storage (half its bytes: torch.autocast), or splitting the "
        "op into smaller ones (a linear layer over fewer output features each)"
    )


def plan_memory(fused: FusedGraph, profile: DeviceProfile, reuse: bool = True,
                shared_outputs: bool | None = None, donated: frozenset[str] = frozenset(),
                resident_outputs: bool = False,
                donor_aliases: Mapping[str, Sequence[str]] | None = None) -> MemoryPlan:
    """Plan every buffer of ``fused``. ``shared_outputs``: write outputs the caller reads straight
    into host memory (zero-copy; default: where the device's memory is unified). ``donated``:
    inputs (saved activations) whose bytes may be reused once the graph has read them last.
    ``donor_aliases``: per donated input, the other inputs that are views of its bytes: the bytes
    are free only after the last read of all of them (see :mod:`torch_adreno.frontend.donation`).
    ``resident_outputs`` (where outputs are copied to the host): outputs get storage of their own
    that stays on the device as the copy of the host tensor (a backward's gradients, which a
    compiled optimizer step reads next without uploading them)."""
    graph = fused.graph
    if shared_outputs is None:
        shared_outputs = profile.unified_memory
    alignment = max(profile.base_addr_align_bytes, 4)
    inputs = graph.input_buffers()
    escaping = {o.buffer for o in graph.outputs if o.buffer is not None and o.role is ir.OutputRole.DEVICE}
    to_host = {o.buffer for o in graph.outputs if o.buffer is not None and o.role is ir.OutputRole.HOST}
    ranges = live_ranges(fused)
    exists = inputs | fused.stored_buffers()
    kinds: dict[str, StorageKind] = {}
    for name in graph.buffers:
        if name not in exists:
            continue  # fused away: computed in registers, never stored
        if name in inputs:
            kinds[name] = StorageKind.INPUT
        elif name in escaping:
            kinds[name] = StorageKind.PER_CALL
        elif name in to_host and shared_outputs:
            kinds[name] = StorageKind.HOST
        elif name in to_host and resident_outputs:
            kinds[name] = StorageKind.PER_CALL
        else:
            kinds[name] = StorageKind.ARENA
        check_allocation(graph, name, kinds[name], profile)
    written_by = {w: i for i, g in enumerate(fused.groups) for w in g.writes}
    mutated_in_place: dict[str, str] = {}
    for target, value in graph.mutations.items():
        if reuse and kinds.get(value) is StorageKind.ARENA and value in written_by \
                and _can_overwrite(fused, written_by[value], value, target, ranges):
            kinds[value] = StorageKind.INPUT_ALIAS
            mutated_in_place[value] = target
    arena = {n for n, k in kinds.items() if k is StorageKind.ARENA}
    replaced = _in_place_candidates(fused, arena, ranges) if reuse else {}
    # An in-place result continues its input's range: plan them as one item.
    root_of = {}
    for name in arena:
        root = name
        while root in replaced:
            root = replaced[root]
        root_of[name] = root
    span: dict[str, tuple[int, int, int]] = {}
    for name in arena:
        root = root_of[name]
        first, last = ranges.get(name, (-1, -1))
        nbytes = max(graph.buffers[name].nbytes, 1)
        f0, l0, b0 = span.get(root, (first, last, nbytes))
        span[root] = (min(f0, first), max(l0, last), max(b0, nbytes))
    items = [(root, nbytes, first, last) for root, (first, last, nbytes) in span.items()]
    unshared = sum(_align(max(graph.buffers[n].nbytes, 1), alignment) for n in arena)
    aliases_of = {name: [a for a in (donor_aliases or {}).get(name, ()) if a in inputs] for name in donated}
    donors = [(name, graph.buffers[name].nbytes, _donor_free_after(name, aliases_of[name], ranges))
              for name in sorted(donated & inputs)
              if name in ranges and graph.buffers[name].nbytes > 0
              and not any(a in graph.mutations for a in (name, *aliases_of[name]))] if reuse else []
    in_donor: dict[str, str] = {}
    for donor, size, last_use in donors:
        if last_use != ranges[donor][1] or any(a in fused.groups[last_use].reads for a in aliases_of[donor]):
            continue  # an alias is still read there or later: no element-wise overwrite
        for root, nbytes, first, _ in items:
            if first == last_use and nbytes <= size and root not in in_donor \
                    and _can_overwrite(fused, first, root, donor, ranges):
                in_donor[root] = donor
                break
    placed: dict[str, tuple[int | str, int]] = {}
    arena_bytes: list[int] = []
    if reuse:
        placed, arena_bytes = _place(items, donors, in_donor)
    else:
        for root, nbytes, _first, _last in sorted(items, key=lambda t: (t[2], t[0])):
            placed[root] = (len(arena_bytes), 0)
            arena_bytes.append(_align(nbytes, alignment))
    allocations: dict[str, Allocation] = {}
    for name, kind in kinds.items():
        first, last = ranges.get(name, (-1, -1))
        nbytes = max(graph.buffers[name].nbytes, 1)
        if kind is StorageKind.ARENA:
            where, offset = placed[root_of[name]]
            if isinstance(where, str):
                allocations[name] = Allocation(name, StorageKind.DONATED, nbytes, -1, offset, first, last,
                                               replaced.get(name), donor=where)
            else:
                allocations[name] = Allocation(name, kind, nbytes, where, offset, first, last, replaced.get(name))
        else:
            allocations[name] = Allocation(name, kind, nbytes, first_use=first, last_use=last,
                                           in_place_of=mutated_in_place.get(name))
    used_donors = {a.donor for a in allocations.values() if a.donor is not None}
    plan = MemoryPlan(allocations, arena_bytes, alignment, reuse, unshared,
                      {d: tuple(aliases_of[d]) for d in sorted(used_donors) if aliases_of.get(d)})
    plan.notes.extend(f"{out} overwrites {src} in place" for out, src in replaced.items())
    plan.notes.extend(f"{d} is released after kernel {last}: its bytes serve later buffers"
                      for d, _, last in donors if any(a.donor == d for a in allocations.values()))
    plan.notes.extend(f"{value} updates input {target} in its own storage" for value, target in mutated_in_place.items())
    plan.notes.extend(f"{value} is copied into input {target} after the last kernel"
                      for target, value in graph.mutations.items() if value not in mutated_in_place)
    return plan
