"""A kernel rewritten to reach some of its buffers through arena arguments and offset arguments.

A replayed training step (:mod:`torch_adreno.replay.step`) binds every kernel argument once, but
the driver still pays for each argument at every enqueue, whether the buffers are distinct, one, or
sub-buffers of one (NVIDIA's OpenCL driver's figure: ``docs/design/replay.md``). A replay knows where all the memory made during the step lives (one memory plan for the
whole step, at fixed byte offsets of one buffer), and where the persistent tensors live (regions
of the device heap's slabs, :mod:`torch_adreno.runtime.heap`), so its kernels can take each such
buffer once and find their operands at offsets from it: with the step's own memory in one arena and
its parameters and optimizer state in one slab, a launch takes about one buffer argument.

:func:`place_in_arena` replaces parameter records and keeps the kernel's text: the moved buffers'
records become operands located in an arena (they leave ``KERNEL_PARAMS``; the arenas take the
first places, then one ``int`` offset argument per moved buffer), and ``KERNEL_LOCALS``, rendered
from the same records, declares each at the top of the body as a local pointer of the same type,
qualifiers and C name. Helpers the kernel calls with its buffers (the GEMM template's load and
store functions) are called with the locals, unchanged. ``restrict`` stays valid: operands of one
launch are placed in disjoint byte ranges (the step's memory by lifetimes that overlap at that
launch, heap regions by the heap's own invariant), and an operand bound to two parameters was
declared without it (``Param.aliased``).

The offsets are arguments, set once with the other arguments (:func:`offset_values`), not
constants of the text: a model's repeated blocks place their kernels' operands at different
offsets, and kernels alike but for those offsets are then one program function
(:meth:`~torch_adreno.kernels.program.KernelSource.content`), built once (12 GPT-2 blocks: ~40
functions instead of ~400). An offset argument counts ``OFFSET_ALIGNMENT`` bytes, so that an
``int`` (4 bytes, half a 64-bit pointer: a placed kernel never needs more argument bytes than
the compiled one but for its arenas) reaches 32 GiB into an arena.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from torch_adreno import ir
from torch_adreno.kernels.params import (
    BOUND_BUFFER_ROLES,
    ArenaLocation,
    KernelParam,
    Role,
    arena_record,
)
from torch_adreno.kernels.program import KernelSource, kernel_opening

#: The first arena's parameter: the replay binds the buffer holding the step's memory here, the
#: first argument (further arenas, :mod:`torch_adreno.runtime.heap`'s slabs, follow it).
ARENA_PARAM = "step_arena"
#: Its name in :attr:`KernelSource.params` (no IR buffer has such a name).
ARENA_BUFFER = "<step arena>"

#: Offsets are byte counts in the arena; every one a multiple of this (so of every element size),
#: the unit of an offset argument.
OFFSET_ALIGNMENT = 16
#: The largest byte offset an offset argument (an ``int`` of :data:`OFFSET_ALIGNMENT` units) holds.
MAX_OFFSET = (2**31 - 1) * OFFSET_ALIGNMENT
#: An offset argument's C name: its operand's with this suffix.
OFFSET_SUFFIX = "_arena_offset"


class ArenaRewriteError(ValueError):
    """An arena placement that cannot be made (an argument that is not a buffer, a bad offset)."""


def arena_param(base: int) -> str:
    """The parameter name of arena ``base`` (0: the first argument)."""
    return ARENA_PARAM if base == 0 else f"{ARENA_PARAM}{base}"


def arena_buffer(base: int) -> str:
    """Arena ``base``'s name in :attr:`KernelSource.params`."""
    return ARENA_BUFFER if base == 0 else f"<step arena {base}>"


def arena_records(count: int) -> tuple[KernelParam, ...]:
    """The parameter records of arenas ``0..count-1``, the first arguments of a placed kernel."""
    return tuple(arena_record(arena_buffer(base), arena_param(base)) for base in range(count))


def place_in_arena(kernel: KernelSource, offsets: Mapping[int, int],
                   bases: Mapping[int, int] | None = None) -> KernelSource:
    """``kernel`` with the buffer arguments at the positions in ``offsets`` (indices into
    ``kernel.params``) read from byte ``offsets[position]`` of an arena buffer: arena
    ``bases[position]`` (default 0). The arenas are the first arguments, numbered from 0 (every
    number up to the largest used), then an offset argument per moved buffer in position order
    (whose values are :func:`offset_values`), then the other arguments in their order. Offsets
    must be multiples of :data:`OFFSET_ALIGNMENT`, at most :data:`MAX_OFFSET`. The result depends
    on the offsets' positions and arenas only, never on their values."""
    if not offsets:
        return kernel
    offset_values(kernel, offsets)  # (checked)
    base_of = {position: (bases or {}).get(position, 0) for position in offsets}
    count = max(base_of.values()) + 1
    for position in offsets:
        if not 0 <= position < len(kernel.params):
            raise ArenaRewriteError(f"kernel {kernel.name}: no buffer argument {position}")
    if set(base_of.values()) != set(range(count)):
        raise ArenaRewriteError(f"kernel {kernel.name}: arenas {sorted(set(base_of.values()))} are not numbered 0..n-1")
    # Positions count the bound buffer arguments (``kernel.params``), not the index check
    # arguments or images that follow them.
    bound = [i for i, r in enumerate(kernel.arguments) if r.is_argument and r.role in BOUND_BUFFER_ROLES]
    arguments = list(kernel.arguments)
    offset_records = []
    for position in sorted(offsets):
        at = bound[position]
        record = arguments[at]
        if record.role is not Role.BUFFER:
            raise ArenaRewriteError(f"kernel {kernel.name}: argument {position} is not a buffer: {record.declaration()!r}")
        offset = KernelParam(f"<offset of {record.key}>", record.c_name + OFFSET_SUFFIX, Role.ARENA_OFFSET,
                             ir.DType.I32, address_space="__private")
        offset_records.append(offset)
        arguments[at] = replace(record, located=ArenaLocation(arena_param(base_of[position]), offset.c_name,
                                                              OFFSET_ALIGNMENT))
    return replace(kernel, arguments=(*arena_records(count), *offset_records, *arguments))


def offset_values(kernel: KernelSource, offsets: Mapping[int, int]) -> tuple[int, ...]:
    """The values of the offset arguments of ``place_in_arena(kernel, offsets, ...)``, in their
    order (each byte offset in units of :data:`OFFSET_ALIGNMENT`); bad offsets raise
    :class:`ArenaRewriteError` naming the kernel."""
    for offset in offsets.values():
        if offset % OFFSET_ALIGNMENT:
            raise ArenaRewriteError(f"kernel {kernel.name}: offset {offset} is not a multiple of {OFFSET_ALIGNMENT}")
        if not 0 <= offset <= MAX_OFFSET:
            raise ArenaRewriteError(f"kernel {kernel.name}: offset {offset} is outside 0..{MAX_OFFSET} (an offset "
                                    f"argument's range); the option replay_arena_kernels=False binds the kernels as compiled")
    return tuple(offsets[position] // OFFSET_ALIGNMENT for position in sorted(offsets))


#: Work-items per work-group of a :func:`copy_ranges` kernel.
COPY_GROUP = 64


def copy_ranges(name: str, copies: list[tuple[int, int, int, int, int]], labels: list[str]) -> KernelSource:
    """One kernel doing several device copies between arenas, each ``(destination arena, byte
    offset, source arena, byte offset, bytes)`` (arenas numbered from 0, every number up to the
    largest used; offsets multiples of :data:`OFFSET_ALIGNMENT`; no copy's destination overlaps
    another's source). A replay enqueues it instead of a run of copies a graph call makes (the
    running statistics a batch norm writes back): one enqueue instead of one per copy. ``labels``
    name each copy (``graph.destination <- graph.source``) in the kernel's comments."""
    if not copies:
        raise ArenaRewriteError(f"kernel {name}: no copies")
    count = max(max(c[0], c[2]) for c in copies) + 1
    used = {c[0] for c in copies} | {c[2] for c in copies}
    if used != set(range(count)):
        raise ArenaRewriteError(f"kernel {name}: arenas {sorted(used)} are not numbered 0..n-1")
    lines = [*kernel_opening(), "    const size_t i = get_global_id(0);"]
    widest = 0
    for (destination, at, source, start, nbytes), label in zip(copies, labels, strict=True):
        if at % OFFSET_ALIGNMENT or start % OFFSET_ALIGNMENT:
            raise ArenaRewriteError(f"kernel {name}: copy {label} is not at offsets that are multiples of {OFFSET_ALIGNMENT}")
        unit, ctype = next((u, t) for u, t in ((16, "uint4"), (4, "uint"), (1, "uchar")) if nbytes % u == 0)
        widest = max(widest, nbytes // unit)
        lines += [f"    // {label} ({nbytes} bytes)",
                  f"    if (i < {nbytes // unit}UL) ((__global {ctype}*)({arena_param(destination)} + {at}UL))[i] = "
                  f"((__global const {ctype}*)({arena_param(source)} + {start}UL))[i];"]
    lines.append("}")
    total = sum(c[4] for c in copies)
    return KernelSource(name=name, symbol=name, kind="copies", text="\n".join(lines) + "\n", build_options=(),
                        arguments=arena_records(count),
                        global_size=(-(-max(widest, 1) // COPY_GROUP) * COPY_GROUP,), local_size=(COPY_GROUP,),
                        origins=(), bytes_read=total, bytes_written=total, macros=())
