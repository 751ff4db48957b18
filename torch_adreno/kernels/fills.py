"""Where a graph's memory is filled before its first write (the ``fill_uninitialized_memory`` option).

A CPU OpenCL runtime hands out fresh buffers zeroed, and a reused slot holds the last call's
values: a kernel reading memory that nothing wrote in this call (a producer that writes only part
of its output, a missing launch, a plan that reuses bytes too early) reads plausible numbers, and
nothing shows it. With the option on, every region a call makes is filled with
:data:`~torch_adreno.runner.format.FILL_PATTERN` (NaN for every float dtype, an out-of-range index
for every integer one) right before the first launch that touches it, so such a read turns into
NaN or an index error.

What is filled: each storage root of the plan (a buffer not planned in place of another), in the
storage a call binds it to: an arena slot (every buffer the slot holds in turn, each before its
own first launch: a slot reused within one call is refilled for each new buffer), a per-call
block, a host output, and a buffer placed in a donated input's bytes. Not filled: inputs, the new
value of a mutated input written in the input's own storage, a buffer planned in place of another
(it continues that buffer's bytes element by element), and a buffer placed in a donated input's
bytes by the very launch that reads the donor for the last time (an element-wise overwrite).

Invariant: a fill is placed before the first executed step (a non-empty launch, or a host op)
that touches the buffer, never earlier: the plan gives a slot to one buffer at a time, so the
bytes filled hold no value still to be read (the memory verifier proves it when
``verify_memory`` is on: :func:`torch_adreno.kernels.verify.program_accesses`). A fill
writes only where the buffer's writer writes afterwards, so a correct graph computes the same bits
with or without fills; a read of bytes the writer skipped (a partial write) sees the pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_adreno.kernels.program import HostStep, KernelProgram, Step
from torch_adreno.memory import StorageKind

__all__ = ["FillRegion", "fill_schedule", "step_buffers", "step_runs"]

#: The storage a call makes, and so fills (inputs and input aliases are the caller's memory).
FILLED_KINDS = frozenset({StorageKind.ARENA, StorageKind.PER_CALL, StorageKind.HOST, StorageKind.DONATED})


@dataclass(frozen=True)
class FillRegion:
    """``nbytes`` of the storage a call binds to ``buffer``, from byte ``offset`` of it."""

    buffer: str
    offset: int
    nbytes: int


def step_runs(step: Step) -> bool:
    """Whether the runtime executes ``step``: a host op, or a launch of at least one work-item."""
    return isinstance(step, HostStep) or 0 not in step.global_size


def step_buffers(step: Step) -> tuple[str, ...]:
    """Every buffer ``step`` touches (reads or writes), in its argument order."""
    if isinstance(step, HostStep):
        return (*(view.buffer for view in step.node.inputs), *step.node.outputs)
    return tuple(step.params)


def _reads(step: Step) -> set[str]:
    if isinstance(step, HostStep):
        return {view.buffer for view in step.node.inputs}
    return set(step.reads) - set(step.writes)


def fill_schedule(program: KernelProgram) -> tuple[tuple[FillRegion, ...], ...]:
    """Per step of ``program.steps`` (same positions), the regions to fill right before it (see the
    module docstring); empty for most steps."""
    plan, graph = program.plan, program.graph
    first: dict[str, int] = {}
    for index, step in enumerate(program.steps):
        if step_runs(step):
            for name in step_buffers(step):
                first.setdefault(name, index)
    before: list[list[FillRegion]] = [[] for _ in program.steps]
    for name, alloc in plan.allocations.items():
        if alloc.kind not in FILLED_KINDS or alloc.in_place_of is not None or name not in first:
            continue
        step = program.steps[first[name]]
        if alloc.kind is StorageKind.DONATED and alloc.donor in _reads(step):
            continue  # written element by element over the donor's last read
        nbytes = graph.buffers[name].nbytes
        if nbytes:
            before[first[name]].append(FillRegion(name, alloc.offset, nbytes))
    return tuple(tuple(regions) for regions in before)
