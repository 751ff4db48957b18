"""Split-K: GEMMs with few outputs and a long k get the k range cut into slices.

A convolution's weight gradient multiplies over batch x height x width (k = 32,768 in resnet_mini's
first stage) into a few hundred outputs (16 x 144): one or a few output tiles, so one or a few
work-groups walk all of k while the rest of the GPU idles (measured on the H200: 1.5 ms for
151 MFLOP). Cut into S slices, S times as many work-groups each multiply k / S into a slice sum,
and a second, small launch adds the S slice sums and runs the fused epilogue. The slice sums
cost 2 x S x m x n floats of traffic, kept under a quarter of the bytes the operands move.

Stream-K, on a desktop GPU (many compute units, the tiled template's 128 x 128 tiles): a GEMM
of a few waves of tiles loses to wave quantization what splitting cannot win back: GPT-2's
1,024 x 2,304 product is 144 tiles on the H200's 132 compute units, so 12 compute units multiply
a second tile while 120 idle (180 us, where 23.8 waves of the same tile in its head take 87 us
each). The whole waves of tiles stay as they are; only the tiles left over are cut into k slices,
as many as the compute units hold (12 tiles x 11 slices: one more work-group per compute unit,
each 1/11 of a tile), and a second launch adds the slices up (:class:`StreamK`). A GEMM of fewer
tiles than compute units is all remainder: its tiles are cut to fill two work-groups per compute unit.

The rule needs only the device's compute-unit count: enough output tiles (at the template's usual
64 x 64) to give every compute unit four work-groups' worth is all the parallelism splitting could add
(at least :data:`TARGET_TILES`, a phone GPU's few compute units several times over), and slices
shorter than 256 leave too little work per work-group to pay for their partial sums.

Slices also bound a sum's rounding: one work-item's fma chain over all of k drifts from float64
as k grows, where eager's blocked GEMMs sum blocks of a few hundred; slices of at most 256-512
brought a 1x1 convolution's weight gradient over k = 2,048 (MobileNetV2's, 8 x 8 outputs) from
2.6x eager's distance from float64 back under 2x (PoCL).
"""

from __future__ import annotations

import math

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.kernels import GemmKernel, StreamK
from torch_adreno.fusion.schedule import FusionGroup

#: Output tiles (64 x 64, times the batch) below which a GEMM is split, and the most it is split to,
#: on a device of at most 16 compute units; larger ones get four tiles per compute unit (the H200's
#: 132: ResNet-18's first-stage weight gradients, 9 tiles each, were 6.8 TFLOP/s split into 8, and
#: GPT-2's head backward, 96 work-groups of 128 x 64 split in 2, still 1.45 waves at 19.8 TFLOP/s).
TARGET_TILES = 64
TILES_PER_COMPUTE_UNIT = 4
#: The shortest k slice.
MIN_SLICE = 256
#: Slice sums written and read again, at most this fraction of the operand bytes.
MAX_PARTIAL_TRAFFIC = 0.25


def output_tiles(gemm: ir.Gemm) -> int:
    return gemm.batch * math.ceil(gemm.m / 64) * math.ceil(gemm.n / 64)


def _element_bytes(operand: ir.Expr) -> int:
    """Bytes of one element of the buffers an operand loads (float32 where it loads none)."""
    sizes = [ld.dtype.itemsize for ld in ir.loads(operand) if ld.dtype.is_float]
    return max(sizes, default=ir.DType.F32.itemsize)


def target_tiles(compute_units: int | None) -> int:
    """Output tiles a split aims for on a device of ``compute_units`` (None: unknown)."""
    return max(TARGET_TILES, TILES_PER_COMPUTE_UNIT * (compute_units or 0))


def choose_split(gemm: ir.Gemm, target: int = TARGET_TILES) -> int:
    """The number of k slices: doubled while the tiles stay under ``target``, slices stay
    at least :data:`MIN_SLICE` long and the slice sums' traffic under :data:`MAX_PARTIAL_TRAFFIC`
    of the operands', in bytes (the sums are float32 whatever the operands are: beside 16-bit
    operands they weigh twice as much). 1: no split."""
    tiles = output_tiles(gemm)
    operand_bytes = gemm.batch * gemm.k * (gemm.m * _element_bytes(gemm.lhs) + gemm.n * _element_bytes(gemm.rhs))
    partial_bytes = 2 * gemm.batch * gemm.m * gemm.n * ir.DType.F32.itemsize  # written once, read once
    split = 1
    while (tiles * split < target and gemm.k // (2 * split) >= MIN_SLICE
           and (2 * split) * partial_bytes <= MAX_PARTIAL_TRAFFIC * operand_bytes):
        split *= 2
    return split


#: Stream-K's tile (the tiled template's largest, which it then uses).
STREAM_TILE = 128
#: Stream-K only where the tiles number fewer waves than this (past it, the last wave's loss is small).
STREAM_MAX_WAVES = 4
#: Stream-K's shortest k slice.
STREAM_MIN_SLICE = 64
#: Work-groups of 128 x 128 tiles a compute unit runs at once (the H200: 256 work-items of ~128 registers).
STREAM_GROUPS_PER_UNIT = 2


def choose_stream(gemm: ir.Gemm, compute_units: int) -> StreamK | None:
    """The stream-K schedule of ``gemm`` on a device of ``compute_units``, or None where its
    tiles fill the waves well enough (or it is too thin for 128 x 128 tiles, or too short in k).

    Invariants: ``full_tiles`` is a multiple of ``compute_units``; every remaining tile is cut
    into ``split`` >= 2 slices of ``slice_k`` (a multiple of 8, the tile's K step) that cover k."""
    tile = STREAM_TILE
    if gemm.m < tile or gemm.n < tile or compute_units <= 1:
        return None
    tiles_m, tiles_n = math.ceil(gemm.m / tile), math.ceil(gemm.n / tile)
    tiles = gemm.batch * tiles_m * tiles_n
    if tiles >= STREAM_MAX_WAVES * compute_units or tiles % compute_units == 0:
        return None
    full = tiles // compute_units * compute_units
    remainder = tiles - full
    # The leftover tiles share the compute units' second work-group (or, with no whole wave, both).
    slots = compute_units if full else STREAM_GROUPS_PER_UNIT * compute_units
    split = min(slots // remainder, gemm.k // STREAM_MIN_SLICE)
    if split < 2:
        return None
    slice_k = math.ceil(math.ceil(gemm.k / split) / 8) * 8
    split = math.ceil(gemm.k / slice_k)
    return StreamK(tile, tiles_m, tiles_n, full, split, slice_k)


def split_long_gemms(graph: ir.Graph, groups: list[FusionGroup], decisions: list[Decision],
                     compute_units: int | None = None, stream_k: bool = False) -> None:
    """Give every GEMM kernel that :func:`choose_split` splits its slice count and a buffer for the
    slice sums (written and read by the kernel's own two launches only); with ``stream_k``, every
    other GEMM without a fused row sum that :func:`choose_stream` schedules its schedule and a
    slices buffer; record each choice."""
    for group in groups:
        spec = group.spec
        if not isinstance(spec, GemmKernel):
            continue
        g = spec.gemm
        split = choose_split(g, target_tiles(compute_units))
        if split == 1:
            stream = choose_stream(g, compute_units) if stream_k and compute_units and spec.row_sum is None else None
            if stream is not None:
                name = f"{g.name}_slices"
                graph.buffers[name] = ir.Buffer(name, (stream.slice_floats(g.batch),), ir.DType.F32)
                spec.stream, spec.partials = stream, name
                group.writes.append(name)
                remainder = stream.remainder_tiles(g.batch)
                decisions.append(Decision(
                    g.name, g.name, True,
                    f"stream-K: {g.batch * stream.tiles} tiles of {stream.tile}x{stream.tile} on {compute_units} compute "
                    f"units: {stream.full_tiles} in whole waves, the other {remainder} cut into {stream.split} k slices "
                    f"of {stream.slice_k} ({stream.work_groups(g.batch)} work-groups); slices add "
                    f"{2 * stream.slice_floats(g.batch) * 4} bytes"))
            continue
        rows = g.batch * g.m if spec.row_sum is not None else 0
        name = f"{g.name}_slices"
        graph.buffers[name] = ir.Buffer(name, (split * (g.batch * g.m * g.n + rows),), ir.DType.F32)
        spec.split_k, spec.partials = split, name
        group.writes.append(name)
        decisions.append(Decision(
            g.name, g.name, True,
            f"split k={g.k} into {split} slices of {math.ceil(g.k / split)}: {output_tiles(g)} output tile(s) "
            f"of 64x64 would leave most of {compute_units or 'the'} compute units idle; {split * output_tiles(g)} work-groups' worth now, "
            f"slice sums add {2 * split * (g.batch * g.m * g.n + rows) * 4} bytes"))
