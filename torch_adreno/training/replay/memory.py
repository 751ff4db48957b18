"""Where the memory made during a recorded training step lives when it is replayed.

:func:`plan_step_memory` lays out every internal identity of a recording (arena slots, saved
activations, gradients, scratch, the loss) by one plan spanning the whole step: a saved
activation's bytes are free after its last backward read, a gradient's after the optimizer's.
:class:`ArenaLayout` puts that plan's slots, the step's seeds and (when copied) its batch at fixed
byte offsets of one buffer, the replay's arena (:mod:`torch_adreno.training.replay.step`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_adreno.kernels.arena_params import OFFSET_ALIGNMENT
from torch_adreno.memory.intervals import Interval, pack_intervals
from torch_adreno.memory.verify import Access, Placement, verify_accesses
from torch_adreno.training.replay.capture import BATCH, INTERNAL, SEED, RecordedLaunch, StepRecorder


@dataclass(frozen=True)
class StepMemoryPlan:
    """Where the memory made during a step lives in a replay.

    Invariant: two internal identities whose lifetimes (first to last operation that touches them,
    the loss to the end of the step) overlap never share a slot; a slot is as large as the largest
    identity placed in it."""

    slot_of: dict[int, int]
    slot_bytes: tuple[int, ...]
    lifetimes: dict[int, tuple[int, int]]
    #: Bytes of every internal identity, each its own memory (no sharing at all).
    unshared_bytes: int
    #: Device bytes the step holds without a replay: every graph's arenas (allocated for the graph's
    #: lifetime) plus the peak of what escapes a graph call (saved activations, gradients, loss).
    full_path_bytes: int

    @property
    def planned_bytes(self) -> int:
        return sum(self.slot_bytes)


def plan_step_memory(recorder: StepRecorder, keep_to_end: set[int]) -> StepMemoryPlan:
    """Lifetimes of the step's internal identities over its operations, packed into slots by the
    memory stage's packer (:func:`~torch_adreno.memory.intervals.pack_intervals`), as a compiled
    graph's buffers are."""
    lifetimes: dict[int, tuple[int, int]] = {}
    end = len(recorder.operations)
    for position, op in enumerate(recorder.operations):
        used = op.args if isinstance(op, RecordedLaunch) else (op.destination, op.source)
        for index in used:
            first, _ = lifetimes.get(index, (position, position))
            lifetimes[index] = (first, position)
    for index in keep_to_end:
        first, _ = lifetimes.get(index, (0, end))
        lifetimes[index] = (first, end)
    internal = [i for i in lifetimes if recorder.identities[i].kind is INTERNAL]
    # (Ties among equal sizes by identity number: the order the step's plan has always used.)
    packing = pack_intervals([Interval(i, recorder.identities[i].nbytes, *lifetimes[i], rank=i) for i in internal])
    slot_of = {i: packing.packed_slot(i) for i in internal}
    sizes = list(packing.sizes)
    arenas = {i for i in internal if recorder.identities[i].arena}
    escaping = [i for i in internal if i not in arenas]
    peak = max((sum(recorder.identities[i].nbytes for i in escaping
                    if lifetimes[i][0] <= t <= lifetimes[i][1]) for t in range(end + 1)), default=0)
    return StepMemoryPlan(slot_of, tuple(sizes), lifetimes, sum(recorder.identities[i].nbytes for i in internal),
                          sum(recorder.identities[i].nbytes for i in arenas) + peak)


@dataclass(frozen=True)
class ArenaLayout:
    """Where a replay keeps the memory it owns: one buffer, each slot of the step's memory plan,
    each seed and (when the batch is copied) each batch argument at a fixed byte offset.

    Invariants: offsets are multiples of ``alignment`` (the device's sub-buffer alignment and
    :data:`~torch_adreno.kernels.arena_params.OFFSET_ALIGNMENT`); identities in one slot share its
    offset (their lifetimes do not overlap), any others never share a byte."""

    offset_of: dict[int, int]
    nbytes: int
    alignment: int

    @staticmethod
    def of(recorder: StepRecorder, memory: StepMemoryPlan, batch_copied: bool, base_alignment: int) -> ArenaLayout:
        alignment = max(256, OFFSET_ALIGNMENT, base_alignment)
        end = 0

        def place(nbytes: int) -> int:
            nonlocal end
            at = end
            end += -(-max(nbytes, 1) // alignment) * alignment
            return at

        slot_offsets = [place(n) for n in memory.slot_bytes]
        offset_of = {index: slot_offsets[slot] for index, slot in memory.slot_of.items()}
        for identity in recorder.identities:
            if identity.kind is SEED or (identity.kind is BATCH and batch_copied):
                offset_of[identity.index] = place(identity.nbytes)
        return ArenaLayout(offset_of, end, alignment)


def verify_step_memory(recorder: StepRecorder, layout: ArenaLayout, keep_to_end: set[int]) -> None:
    """Prove that the replay's layout of ``recorder``'s memory destroys no value still to be read
    (:func:`torch_adreno.memory.verify.verify_accesses` over the recorded operations, each
    identity a value, placed where the layout puts it): every read of an identity finds it in its
    bytes, and the persistent tensors and ``keep_to_end`` survive the step. The writes of each
    launch are the recorded kernel's :attr:`~torch_adreno.kernels.KernelSource.writes`."""
    accesses = []
    for op in recorder.operations:
        if isinstance(op, RecordedLaunch):
            by_param = dict(zip(op.source.params, op.args, strict=True))
            writes = tuple(dict.fromkeys(by_param[name] for name in op.source.writes if name in by_param))
            reads = tuple(i for i in dict.fromkeys(by_param[name] for name in op.source.reads if name in by_param)
                          if i not in writes)
            accesses.append(Access(f"{op.graph} kernel {op.source.name}", reads, writes))
        else:
            accesses.append(Access(f"{op.graph} copy into {recorder.identities[op.destination].label}",
                                   (op.source,), (op.destination,)))

    def place(index: object) -> Placement:
        assert isinstance(index, int)
        identity = recorder.identities[index]
        if identity.kind is INTERNAL or index in layout.offset_of:
            at = layout.offset_of[index]
            return Placement("the replay's arena", at, at + identity.nbytes)
        return Placement(f"{identity.kind} memory of {identity.label}", 0, identity.nbytes)

    outside = [i.index for i in recorder.identities if i.kind is not INTERNAL]
    verify_accesses(accesses, place, outside, set(outside) | keep_to_end, "the captured training step")
