"""A graph's rendered launches checked against its memory plan (the engine:
:mod:`torch_adreno.memory.verify`): each launch's :attr:`~torch_adreno.kernels.KernelSource.reads`
and ``writes``, every buffer at the storage the plan gives it, inputs where the caller bound them;
with ``fills``, also each fill of :func:`~torch_adreno.kernels.fills.fill_schedule` before
its launch, as a write of a value of its own (:class:`Filled`) that nothing reads: a fill over a
value still to be read is then a :class:`~torch_adreno.memory.verify.MemoryPlanError`,
and a read of bytes nothing but a fill wrote still is one."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from torch_adreno.kernels.fills import fill_schedule
from torch_adreno.kernels.program import HostStep, KernelProgram
from torch_adreno.memory import MemoryPlan, StorageKind
from torch_adreno.memory.verify import Access, Placement, verify_accesses


@dataclass(frozen=True)
class Filled:
    """The fill pattern written into ``buffer``'s bytes before its first launch."""

    buffer: str


def program_accesses(program: KernelProgram, fills: bool = False) -> list[Access]:
    """The launches of ``program`` in order, with what each reads and writes; a mutated input's
    new value copied into the input after the last launch (where it is not written in place);
    with ``fills``, the fills before their launches (see the module docstring)."""
    plan = program.plan
    accesses: list[Access] = []
    schedule = fill_schedule(program) if fills else ()
    for index, step in enumerate(program.steps):
        for region in schedule[index] if fills else ():
            accesses.append(Access(f"the fill of {region.buffer}", (), (Filled(region.buffer),)))
        if isinstance(step, HostStep):
            reads = tuple(dict.fromkeys(v.buffer for v in step.node.inputs))
            accesses.append(Access(f"host op {step.node.target}", reads, tuple(step.node.outputs)))
            continue
        writes = tuple(step.writes)
        reads = tuple(r for r in dict.fromkeys(step.reads) if r not in writes)
        in_place: dict[Hashable, Hashable] = {}
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
        if isinstance(name, Filled):
            return place(name.buffer)
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
                   scratch_donors: frozenset[str] | set[str] = frozenset(), fills: bool = False) -> None:
    """Check ``program``'s memory plan (see the module docstring). ``input_storage``: a key per
    input of the memory it is bound to (inputs with equal keys share it); by default each input
    has memory of its own, except the saved views the plan knows share a donated input's bytes.
    ``fills``: with the fills of ``fill_uninitialized_memory``."""
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
    kept: set[Hashable] = {name for name in inputs if name not in consumed and name not in graph.mutations}
    kept |= {o.buffer for o in graph.outputs if o.buffer is not None and o.buffer in plan.allocations}
    for target, value in graph.mutations.items():
        kept.add(value if plan.allocations[value].kind is StorageKind.INPUT_ALIAS else target)
    verify_accesses(program_accesses(program, fills), program_placement(plan, input_storage, scratch_donors), inputs, kept,
                    f"graph {graph.name}")


__all__ = ["Filled", "program_accesses", "program_placement", "verify_program"]
