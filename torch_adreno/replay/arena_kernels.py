"""The kernel objects of a replayed step: each launch rebuilt to reach its operands at offsets of a
few slabs (the arena, the heap's slabs of the persistent tensors), and runs of copies between heap
regions merged into one kernel each.

A driver's enqueue costs time per argument (``docs/design/replay.md`` has NVIDIA's figure); a
kernel rebuilt by :func:`~torch_adreno.kernels.arena_params.place_in_arena` takes each slab once,
and each operand's offset in it as an ``int`` argument. The offsets are arguments so that the
rebuilt kernels of a model's repeated blocks, alike but for where their operands are, are one
program function: built once (12 GPT-2 blocks: ~40 functions of ~430 launches, not ~400).
Invariants: a rebuilt kernel computes what the compiled one did, bit for bit (only where its
operands are found changes); every launch gets a kernel object of its own, with its slabs and
offsets bound here once, so binding its arguments never rebinds another caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from torch_adreno.kernels.arena_params import copy_ranges, offset_values, place_in_arena
from torch_adreno.kernels.program import KernelSource
from torch_adreno.replay.capture import RecordedCopy, RecordedLaunch, StepRecorder
from torch_adreno.runtime.build import build_kernels
from torch_adreno.runtime.device import DeviceRuntime

#: Where an identity's bytes are: (slab, byte offset), or None where they are in no heap region.
Locate = Callable[[int], "tuple[cl.Buffer, int] | None"]


@dataclass
class ReplayKernel:
    """A launch's kernel object. Rebuilt for the arena: ``slabs`` are the slabs it takes first and
    ``offsets`` the values of the offset arguments after them (both bound), ``placed`` the argument
    positions of the compiled kernel found in the slabs; its other arguments, the compiled
    kernel's in their order, start at :attr:`first_argument`. ``slabs`` None: bound as compiled."""

    kernel: cl.Kernel
    slabs: list[cl.Buffer] | None
    placed: set[int]
    offsets: tuple[int, ...] = ()

    @property
    def first_argument(self) -> int:
        """The first argument the caller binds (the compiled kernel's first one not placed)."""
        return len(self.slabs or ()) + len(self.offsets)


@dataclass(frozen=True)
class _Placement:
    """A launch's kernel rebuilt for the arena: its source, slabs, offset values and placed positions."""

    source: KernelSource
    slabs: list[cl.Buffer]
    offsets: tuple[int, ...]
    placed: set[int]


def numbered_slabs(slabs: list[cl.Buffer], arena: Sequence[cl.Buffer]) -> tuple[list[cl.Buffer], dict[int, int]]:
    """The distinct buffers of ``slabs`` in the order a kernel takes them (the arena's buffers first,
    in the arena's order, the others as they come), and each one's argument number by ``id``."""
    rank = {id(base): n for n, base in enumerate(arena)}
    distinct = sorted({id(slab): slab for slab in slabs}.values(), key=lambda slab: rank.get(id(slab), len(rank)))
    return distinct, {id(slab): n for n, slab in enumerate(distinct)}


def _placement(op: RecordedLaunch, locate: Locate, arena: Sequence[cl.Buffer]) -> _Placement | None:
    """``op``'s kernel rebuilt to take the slabs its operands are in (None: it has none in a slab)."""
    located = {position: where for position, index in enumerate(op.args) if (where := locate(index)) is not None}
    if not located:
        return None
    slabs, number = numbered_slabs([slab for slab, _ in located.values()], arena)
    offsets = {position: at for position, (_, at) in located.items()}
    source = place_in_arena(op.source, offsets, {p: number[id(slab)] for p, (slab, _) in located.items()})
    return _Placement(source, slabs, offset_values(op.source, offsets), set(located))


def build_placed(runtime: DeviceRuntime, sources: Sequence[KernelSource]) -> list[cl.Kernel]:
    """A built kernel per source, the sources of equal content (the rebuilt kernels of repeated
    blocks) sharing one program function, each content built once.

    A program holds each symbol (C function name) once. Symbols repeat where a graph runs twice
    in a step, and where two graphs differ only in their number (a symbol drops it): a content's
    first source goes into the first program not holding its symbol yet; the others of that content
    join that program where their symbol is free there (so that its text names their FX nodes, as
    a graph's program does), else take the first one's function."""
    programs: list[dict[str, KernelSource]] = []
    program_of: dict[tuple[str, tuple[str, ...]], tuple[int, KernelSource]] = {}
    chosen: list[tuple[int, KernelSource]] = []
    for source in sources:
        content = source.content()
        if content not in program_of:
            index = next((i for i, program in enumerate(programs) if source.symbol not in program), len(programs))
            if index == len(programs):
                programs.append({})
            program_of[content] = index, source
        index, first = program_of[content]
        joins = source.symbol not in programs[index]
        if joins:
            programs[index][source.symbol] = source
        chosen.append((index, source if joins else first))
    built = [build_kernels(runtime, list(program.values())) for program in programs]
    return [built[index][source.name] for index, source in chosen]


def arena_kernels(runtime: DeviceRuntime, recorder: StepRecorder, locate: Locate, arena: Sequence[cl.Buffer],
                  rewrite: bool) -> list[ReplayKernel]:
    """A kernel object per launch of the recording, in order. With ``rewrite``, a kernel that has
    operands in heap regions is rebuilt to find them at their offsets in the regions' slabs, each
    slab one argument (the arena's buffers, ``arena``, first), each offset an argument after them;
    rebuilt kernels of equal content are one function (:func:`build_placed`). A kernel reading
    images stays as it was compiled (its images are made over buffers, bound through sub-buffers of
    the arena)."""
    launches = [op for op in recorder.operations if isinstance(op, RecordedLaunch)]
    placements = [_placement(op, locate, arena) if rewrite and not op.source.images else None for op in launches]
    built = iter(build_placed(runtime, [p.source for p in placements if p is not None]))
    kernels: list[ReplayKernel] = []
    for op, placement in zip(launches, placements, strict=True):
        if placement is None:
            kernels.append(ReplayKernel(cl.Kernel(op.kernel.program, op.kernel.function_name), None, set()))
            continue
        template = next(built)
        kernel = cl.Kernel(template.program, template.function_name)
        for argument, slab in enumerate(placement.slabs):
            kernel.set_arg(argument, slab)
        for argument, value in enumerate(placement.offsets, start=len(placement.slabs)):
            kernel.set_arg(argument, np.int32(value))
        kernels.append(ReplayKernel(kernel, placement.slabs, placement.placed, placement.offsets))
    return kernels


@dataclass
class MergedCopies:
    """Runs of copies done by one kernel each: by the position of a run's first copy, its kernel
    (bound) and source; the run's other positions map to None. ``slabs``: the buffers the kernels
    take (a kernel argument holds no reference)."""

    by_position: dict[int, tuple[cl.Kernel, KernelSource] | None]
    slabs: list[cl.Buffer]


def merged_copies(runtime: DeviceRuntime, recorder: StepRecorder, locate: Locate,
                  arena: Sequence[cl.Buffer]) -> MergedCopies:
    """Runs of two or more consecutive copies between heap regions (a graph call writing back the
    inputs it updated: batch norm's running statistics), each done by one kernel. A run ends
    before a copy whose bytes overlap a destination of the run, or whose destination overlaps a
    source (the copies of one kernel run in no order)."""
    Placed = tuple[cl.Buffer, int]

    def overlaps(a: Placed, n: int, b: Placed, m: int) -> bool:
        return a[0] is b[0] and a[1] < b[1] + m and b[1] < a[1] + n

    runs: list[list[tuple[int, RecordedCopy, Placed, Placed]]] = [[]]
    for position, op in enumerate(recorder.operations):
        to = locate(op.destination) if isinstance(op, RecordedCopy) else None
        of = locate(op.source) if isinstance(op, RecordedCopy) else None
        if not isinstance(op, RecordedCopy) or to is None or of is None:
            runs.append([])
            continue
        if any(overlaps(to, op.nbytes, d, c.nbytes) or overlaps(to, op.nbytes, f, c.nbytes)
               or overlaps(of, op.nbytes, d, c.nbytes) for _, c, d, f in runs[-1]):
            runs.append([])
        runs[-1].append((position, op, to, of))
    merged: dict[int, tuple[cl.Kernel, KernelSource] | None] = {}
    sources: list[tuple[list[Any], list[cl.Buffer], KernelSource]] = []
    for run in (r for r in runs if len(r) >= 2):
        slabs, number = numbered_slabs([b for _, _, d, f in run for b, _ in (d, f)], arena)
        names = [f"{recorder.identities[c.destination].label} <- {recorder.identities[c.source].label}"
                 for _, c, _, _ in run]
        sources.append((run, slabs, copy_ranges(
            f"replay_copies_{len(sources)}",
            [(number[id(d[0])], d[1], number[id(f[0])], f[1], c.nbytes) for _, c, d, f in run], names)))
    built = build_kernels(runtime, [source for _, _, source in sources])
    taken: list[cl.Buffer] = []
    for run, slabs, source in sources:
        kernel = cl.Kernel(built[source.name].program, built[source.name].function_name)
        for position, slab in enumerate(slabs):
            kernel.set_arg(position, slab)
        taken += [slab for slab in slabs if all(slab is not b for b in taken)]
        merged[run[0][0]] = (kernel, source)
        merged.update(dict.fromkeys((position for position, _, _, _ in run[1:]), None))
    return MergedCopies(merged, taken)
