"""The memory verifier: proves that a memory plan never destroys a value that is still to be read.

A plan is checked against what actually runs: the launches in order, each with the buffers it
reads and writes (:attr:`KernelSource.writes`), every buffer resolved to its storage (an arena
slot, a donated input's bytes, an input's own memory, storage of its own) and, when it is known,
which inputs of a call share memory (two saved views of one buffer). The check replays the
launches over those storages, tracking which value each storage holds:

* every read must find the value its producer wrote (or the caller's input) still in its bytes;
* a write may only evict values with no read left, none the caller still holds (its inputs, the
  graph's outputs), unless the plan declares the write an element-wise in-place update of a value
  the same launch reads for the last time.

The first violation raises :class:`MemoryPlanError` naming the launch, the storage and the two
values. :func:`verify_program` checks one graph's plan; :func:`verify_accesses` is the engine
(the replay checks its whole-step plan with it). Both run on every compiled graph and every
captured step when the ``verify_memory`` option is on (the test suite turns it on).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from torch_adreno.errors import AdrenoError
from torch_adreno.kernels import HostStep, KernelProgram
from torch_adreno.memory.plan import MemoryPlan, StorageKind


class MemoryPlanError(AdrenoError):
    """A memory plan overwrites a value that is still to be read (a torch_adreno bug: please
    report the message; ``options={'memory_reuse': False}`` avoids it meanwhile)."""


@dataclass(frozen=True)
class Access:
    """One launch (or copy): its name for messages, the values it reads and those it writes."""

    label: str
    reads: tuple[Hashable, ...]
    writes: tuple[Hashable, ...]
    #: value written -> the value read by this same access whose bytes it takes over element by
    #: element (declared by the plan: legal only where that is the value's last read).
    in_place: Mapping[Hashable, Hashable] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Where a value lives: a storage key and the byte range ``[start, stop)`` in it."""

    storage: Hashable
    start: int
    stop: int

    def overlaps(self, other: Placement) -> bool:
        return self.storage == other.storage and self.start < other.stop and other.start < self.stop


def verify_accesses(accesses: Sequence[Access], placement: Callable[[Hashable], Placement],
                    initial: Sequence[Hashable], kept: frozenset[Hashable] | set[Hashable],
                    where: str) -> None:
    """Raise :class:`MemoryPlanError` unless every read of ``accesses`` sees the value last written
    for it. ``initial``: values present before the first access (inputs); ``kept``: values that
    must survive the last access (outputs, inputs the caller still holds). ``where`` names the
    graph or step in messages."""
    last_read: dict[Hashable, int] = {}
    for index, access in enumerate(accesses):
        for value in access.reads:
            last_read[value] = index
    resident: dict[Hashable, dict[Hashable, Placement]] = {}
    evicted: dict[Hashable, tuple[Hashable, str]] = {}

    def put(value: Hashable) -> None:
        at = placement(value)
        resident.setdefault(at.storage, {})[value] = at
        evicted.pop(value, None)

    for value in initial:
        put(value)
    for index, access in enumerate(accesses):
        for value in access.reads:
            at = placement(value)
            if value not in resident.get(at.storage, {}):
                by, label = evicted.get(value, (None, "before it was written"))
                cause = f"{label} wrote {by} over it" if by is not None else "nothing wrote it " + label
                raise MemoryPlanError(f"{where}: {access.label} reads {value} from {at.storage}, but {cause}")
        for value in access.writes:
            at = placement(value)
            for other, other_at in list(resident.get(at.storage, {}).items()):
                if other == value or not at.overlaps(other_at):
                    continue
                still_read = last_read.get(other, -1) > index or other in kept
                read_here = other in access.reads
                if read_here and access.in_place.get(value) == other and not last_read.get(other, -1) > index \
                        and other not in kept:
                    pass  # declared element-wise in place over its last read
                elif still_read or read_here:
                    later = next((a.label for a in accesses[index + 1:] if other in a.reads), None)
                    why = (f"read later by {later}" if later is not None
                           else "needed after the last launch" if other in kept else "read by the same launch")
                    raise MemoryPlanError(
                        f"{where}: {access.label} writes {value} into {at.storage} "
                        f"[{at.start}, {at.stop}) over {other} [{other_at.start}, {other_at.stop}), which is {why}")
                del resident[at.storage][other]
                evicted[other] = (value, access.label)
            put(value)
    for value in kept:
        at = placement(value)
        if value not in resident.get(at.storage, {}):
            by, label = evicted.get(value, (None, "never"))
            raise MemoryPlanError(f"{where}: {value} must outlive the last launch, but {label} wrote {by} over it")


def program_accesses(program: KernelProgram) -> list[Access]:
    """The launches of ``program`` in order, with what each reads and writes; a mutated input's
    new value copied into the input after the last launch (where it is not written in place)."""
    plan = program.plan
    accesses: list[Access] = []
    for step in program.steps:
        if isinstance(step, HostStep):
            reads = tuple(dict.fromkeys(v.buffer for v in step.node.inputs))
            accesses.append(Access(f"host op {step.node.target}", reads, tuple(step.node.outputs)))
            continue
        writes = tuple(step.writes)
        reads = tuple(r for r in dict.fromkeys(step.reads) if r not in writes)
        in_place = {}
        for value in writes:
            alloc = plan.allocations.get(value)
            if alloc is None:
                continue
            if alloc.in_place_of is not None:
                in_place[value] = alloc.in_place_of
            elif alloc.kind is StorageKind.DONATED and alloc.donor in reads:
                in_place[value] = alloc.donor
        accesses.append(Access(f"kernel {step.name}", reads, writes, in_place))
    for target, value in program.graph.mutations.items():
        if plan.allocations[value].kind is not StorageKind.INPUT_ALIAS:
            accesses.append(Access(f"the copy of {value} into input {target}", (value,), (target,)))
    return accesses


def program_placement(plan: MemoryPlan, input_storage: Mapping[str, Hashable],
                      scratch_donors: frozenset[str] | set[str] = frozenset()) -> Callable[[Hashable], Placement]:
    """Where each buffer of a plan lives; inputs live in ``input_storage[name]`` (shared keys:
    inputs bound to the same memory), else each in memory of its own. Buffers planned in the bytes
    of a donor in ``scratch_donors`` live in a scratch block instead (the runtime's choice for a
    saved tensor that came as a host tensor)."""

    def place(name: Hashable) -> Placement:
        assert isinstance(name, str)
        alloc = plan.allocations[name]
        if alloc.kind is StorageKind.ARENA:
            return Placement(f"arena slot {alloc.arena}", alloc.offset, alloc.offset + alloc.nbytes)
        if alloc.kind is StorageKind.DONATED:
            assert alloc.donor is not None
            if alloc.donor in scratch_donors:
                return Placement(f"scratch for {alloc.donor}", alloc.offset, alloc.offset + alloc.nbytes)
            return Placement(input_storage.get(alloc.donor, f"input {alloc.donor}"), alloc.offset,
                             alloc.offset + alloc.nbytes)
        if alloc.kind is StorageKind.INPUT_ALIAS:
            assert alloc.in_place_of is not None
            return Placement(input_storage.get(alloc.in_place_of, f"input {alloc.in_place_of}"), 0, alloc.nbytes)
        if alloc.kind is StorageKind.INPUT:
            return Placement(input_storage.get(name, f"input {name}"), 0, alloc.nbytes)
        return Placement(f"storage of {name}", 0, alloc.nbytes)

    return place


def verify_program(program: KernelProgram, input_storage: Mapping[str, Hashable] | None = None,
                   scratch_donors: frozenset[str] | set[str] = frozenset()) -> None:
    """Check ``program``'s memory plan (see the module docstring). ``input_storage``: a key per
    input of the memory it is bound to (inputs with equal keys share it); by default each input
    has memory of its own, except the saved views the plan knows share a donated input's bytes."""
    plan, graph = program.plan, program.graph
    if input_storage is None:
        input_storage = {}
        for donor, aliases in plan.donor_aliases.items():
            for name in (donor, *aliases):
                input_storage[name] = f"input {donor}"
    inputs = [name for name in graph.inputs if name is not None and name in plan.allocations]
    donors = {a.donor for a in plan.allocations.values() if a.donor is not None}
    consumed = donors | {alias for donor in donors for alias in plan.donor_aliases.get(donor, ())}
    # The caller's inputs survive the call (except donated saved tensors and the views of their
    # bytes), and so do the outputs and the new values of updated inputs, in the inputs' storage.
    kept = {name for name in inputs if name not in consumed and name not in graph.mutations}
    kept |= {o.buffer for o in graph.outputs if o.buffer is not None and o.buffer in plan.allocations}
    for target, value in graph.mutations.items():
        kept.add(value if plan.allocations[value].kind is StorageKind.INPUT_ALIAS else target)
    verify_accesses(program_accesses(program), program_placement(plan, input_storage, scratch_donors), inputs, kept,
                    f"graph {graph.name}")


__all__ = ["Access", "MemoryPlanError", "Placement", "program_accesses", "program_placement",
           "verify_accesses", "verify_program"]
