"""Where the memory made during a recorded training step lives when it is replayed.

:func:`plan_step_memory` lays out every internal identity of a recording (arena slots, saved
activations, gradients, scratch, the loss) by one plan spanning the whole step: a saved
activation's bytes are free after its last backward read, a gradient's after the optimizer's.
:class:`ArenaLayout` puts that plan's slots, the step's seeds and (when copied) its batch at fixed
byte offsets of the replay's arena (:mod:`torch_adreno.replay.step`): one buffer, or
several where it would exceed the largest single allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_adreno.errors import DeviceMemoryError
from torch_adreno.kernels.arena_params import OFFSET_ALIGNMENT
from torch_adreno.memory.footprint import (
    FIT_ADVICE,
    DeviceFootprint,
    MemoryLimits,
    check_allocations,
)
from torch_adreno.memory.intervals import (
    AllocationLimitError,
    Interval,
    pack_intervals,
    split_into_buffers,
)
from torch_adreno.memory.verify import Access, MemoryPlanError, Placement, verify_accesses
from torch_adreno.replay.capture import (
    BATCH,
    INTERNAL,
    PERSISTENT,
    SEED,
    RecordedFill,
    RecordedLaunch,
    StepRecorder,
)


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


def plan_step_memory(recorder: StepRecorder, keep_to_end: set[int], shared: bool = True) -> StepMemoryPlan:
    """Lifetimes of the step's internal identities over its operations, packed into slots by the
    memory stage's packer (:func:`~torch_adreno.memory.intervals.pack_intervals`), as a compiled
    graph's buffers are. ``shared`` False: each identity a slot of its own (a reference that no
    reuse of memory can disturb)."""
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
    if not shared:
        slot_of = {i: slot for slot, i in enumerate(internal)}
        sizes = [recorder.identities[i].nbytes for i in internal]
    arenas = {i for i in internal if recorder.identities[i].arena}
    escaping = [i for i in internal if i not in arenas]
    peak = max((sum(recorder.identities[i].nbytes for i in escaping
                    if lifetimes[i][0] <= t <= lifetimes[i][1]) for t in range(end + 1)), default=0)
    return StepMemoryPlan(slot_of, tuple(sizes), lifetimes, sum(recorder.identities[i].nbytes for i in internal),
                          sum(recorder.identities[i].nbytes for i in arenas) + peak)


@dataclass(frozen=True)
class ArenaLayout:
    """Where a replay keeps the memory it owns: its arena, one buffer or several, each slot of the
    step's memory plan, each seed and (when the batch is copied) each batch argument at a fixed
    byte offset of one of them.

    The arena is one buffer when it fits the largest single allocation (``max_buffer_bytes``), else
    as few buffers of at most that as first fit makes (:func:`~torch_adreno.memory.intervals.split_into_buffers`),
    the kernels then taking each as an argument of its own. Invariants: a slot, seed or batch
    argument never straddles two buffers, and the seeds and copied batch arguments are in one
    buffer, one after another (a staged upload writes them in one write); offsets are multiples of
    ``alignment`` (the device's sub-buffer alignment and
    :data:`~torch_adreno.kernels.arena_params.OFFSET_ALIGNMENT`); identities in one slot share its
    buffer and offset (their lifetimes do not overlap), any others never share a byte."""

    #: Per identity, its byte offset in its buffer.
    offset_of: dict[int, int]
    #: Bytes of all the arena's buffers.
    nbytes: int
    alignment: int
    #: Per identity, its buffer's number (absent: buffer 0).
    part_of: dict[int, int] = field(default_factory=dict)
    #: Bytes of each buffer (empty: one buffer of ``nbytes``).
    part_bytes: tuple[int, ...] = ()
    #: The buffer holding the seeds and the copied batch.
    inputs_part: int = 0

    @property
    def parts(self) -> tuple[int, ...]:
        """Bytes of each of the arena's buffers."""
        return self.part_bytes or (self.nbytes,)

    def where(self, index: int) -> tuple[int, int]:
        """Identity ``index``'s (buffer number, byte offset there)."""
        return self.part_of.get(index, 0), self.offset_of[index]

    @staticmethod
    def of(recorder: StepRecorder, memory: StepMemoryPlan, batch_copied: bool, base_alignment: int,
           max_buffer_bytes: int | None = None) -> ArenaLayout:
        """The layout of ``memory``'s slots and the recording's seeds and (``batch_copied``) batch,
        in buffers of at most ``max_buffer_bytes`` (None: one buffer); an
        :class:`~torch_adreno.memory.intervals.AllocationLimitError` where a slot, or the seeds and
        batch together, are larger than that."""
        alignment = max(256, OFFSET_ALIGNMENT, base_alignment)
        inputs = [i for i in recorder.identities if i.kind is SEED or (i.kind is BATCH and batch_copied)]
        input_offsets = []
        input_bytes = 0
        for identity in inputs:  # one block, one after another
            input_offsets.append(input_bytes)
            input_bytes += -(-max(identity.nbytes, 1) // alignment) * alignment
        blocks = [*memory.slot_bytes, *([input_bytes] if inputs else [])]
        total = sum(-(-max(n, 1) // alignment) * alignment for n in blocks)
        split = split_into_buffers(blocks, total if max_buffer_bytes is None else max_buffer_bytes, alignment)
        offset_of = {index: split.placed[slot][1] for index, slot in memory.slot_of.items()}
        part_of = {index: split.placed[slot][0] for index, slot in memory.slot_of.items()}
        inputs_part = 0
        if inputs:
            inputs_part, start = split.placed[-1]
            for identity, at in zip(inputs, input_offsets, strict=True):
                offset_of[identity.index], part_of[identity.index] = start + at, inputs_part
        return ArenaLayout(offset_of, sum(split.sizes), alignment, part_of, split.sizes, inputs_part)


def arena_layout(recorder: StepRecorder, memory: StepMemoryPlan, batch_copied: bool, base_alignment: int,
                 limits: MemoryLimits) -> ArenaLayout:
    """:meth:`ArenaLayout.of` in buffers of at most ``limits``' largest allocation; a
    :class:`~torch_adreno.errors.DeviceMemoryError` naming the identities where one slot (or the
    batch with the seeds) alone is larger."""
    try:
        return ArenaLayout.of(recorder, memory, batch_copied, base_alignment, limits.max_allocation_bytes)
    except AllocationLimitError:
        pass
    too_large = [i for i in recorder.identities if i.nbytes > limits.max_allocation_bytes
                 and (i.index in memory.slot_of or i.kind is BATCH)]
    named = ", ".join(f"{i.label} ({i.nbytes:,} bytes)" for i in too_large[:3]) or \
        "the batch's copy with the seeds, together"
    raise DeviceMemoryError(
        f"{described_step(recorder)}: {named} exceed the largest single allocation of {limits.owner} "
        f"({limits.max_allocation_bytes:,} bytes), and a tensor is one buffer. To fit: {FIT_ADVICE}")


def step_footprint(recorder: StepRecorder, layout: ArenaLayout, image_bytes: Sequence[int], limits: MemoryLimits,
                   name_of: Callable[[Any, str], str]) -> DeviceFootprint:
    """What a replay of ``recorder`` in ``layout`` holds on the device (images of the sizes
    ``image_bytes``), held to ``limits``: each persistent tensor checked against the largest
    allocation first (:func:`~torch_adreno.memory.footprint.check_allocations`, naming it by
    ``name_of(tensor, label)``), then the whole (:meth:`DeviceFootprint.check`); a
    :class:`~torch_adreno.errors.DeviceMemoryError` where it does not fit. A persistent tensor
    counts once, with the bytes of its buffer, however many buffers a capture bound it through.

    Only buffer sizes are read, never a tensor: a capture runs while host copies are out of date,
    and a torch call on one would synchronize it (``host_sync``'s mode is armed then)."""
    persistent: dict[int, int] = {}
    for identity in recorder.identities:
        if identity.kind is PERSISTENT:
            key = -identity.index - 1 if identity.tensor is None else id(identity.tensor)
            persistent[key] = max(persistent.get(key, 0), identity.nbytes)
    check_allocations([(name_of(i.tensor, i.label) if i.tensor is not None else i.label, i.nbytes)
                       for i in recorder.identities
                       if i.kind is PERSISTENT and i.nbytes > limits.max_allocation_bytes], limits, described_step(recorder))
    graph_arenas = sum(max(n, 1) for program in recorder.programs.values() for n in program.plan.arena_bytes)
    largest = max([*layout.parts, *image_bytes, *persistent.values()], default=0)
    footprint = DeviceFootprint(sum(persistent.values()), layout.parts, sum(image_bytes), graph_arenas, largest, limits)
    footprint.check(described_step(recorder))
    return footprint


def step_fills(recorder: StepRecorder, memory: StepMemoryPlan) -> dict[int, list[RecordedFill]]:
    """The recording's fills by the operation they precede, each checked to write only its own
    identity's bytes while that identity lives: an internal identity the plan places, at an
    operation of its lifetime, inside its bytes. The plan gives identities whose lifetimes overlap
    bytes of their own, so such a fill destroys no other identity's value; within the identity,
    the graph's plan made the bytes free (proved with ``verify_memory``:
    :func:`torch_adreno.kernels.verify.program_accesses`). A fill that breaks this is a
    :class:`~torch_adreno.memory.verify.MemoryPlanError` (a torch_adreno bug)."""
    by_position: dict[int, list[RecordedFill]] = {}
    for fill in recorder.fills:
        identity = recorder.identities[fill.identity]
        first, last = memory.lifetimes.get(fill.identity, (-1, -1))
        if identity.kind is not INTERNAL or fill.identity not in memory.slot_of or not first <= fill.before <= last \
                or fill.offset < 0 or fill.offset + fill.nbytes > identity.nbytes:
            raise MemoryPlanError(
                f"{described_step(recorder)}: a fill of {fill.nbytes} bytes at {fill.offset} of {identity.label} "
                f"({identity.kind}, {identity.nbytes} bytes, used by operations {first} to {last}) before operation "
                f"{fill.before} would write outside its bytes or lifetime (a torch_adreno bug: please report it; "
                "fill_uninitialized_memory=False avoids it meanwhile)")
        by_position.setdefault(fill.before, []).append(fill)
    return by_position


def described_step(recorder: StepRecorder) -> str:
    """The step in messages: its batch's shapes."""
    shapes = ", ".join(str(list(t.shape)) for t in recorder.batch if hasattr(t, "shape"))
    return f"the training step on a batch of {shapes}" if shapes else "the training step"


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
            part, at = layout.where(index)
            name = "the replay's arena" if len(layout.parts) == 1 else f"the replay's arena (buffer {part})"
            return Placement(name, at, at + identity.nbytes)
        return Placement(f"{identity.kind} memory of {identity.label}", 0, identity.nbytes)

    outside = [i.index for i in recorder.identities if i.kind is not INTERNAL]
    verify_accesses(accesses, place, outside, set(outside) | keep_to_end, "the captured training step")
