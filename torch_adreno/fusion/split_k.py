"""Split-K: GEMMs with few outputs and a long k get the k range cut into slices.

A convolution's weight gradient multiplies over batch x height x width (k = 32,768 in resnet_mini's
first stage) into a few hundred outputs (16 x 144): one or a few output tiles, so one or a few
work-groups walk all of k while the rest of the GPU idles. Cut into S slices, S times as many work-groups each multiply k / S into a slice sum,
and a second, small launch adds the S slice sums and runs the fused epilogue. The slice sums
cost 2 x S x m x n floats of traffic, kept under a quarter of the bytes the operands move.

On a desktop GPU, whose tiled template multiplies in 128 x 128 tiles, a GEMM of fewer such tiles
than compute units is also split, whatever its k: into as many slices as fill every compute unit
twice (two work-groups of 128 x 128 tiles run at once on one). One work-group alone on a compute
unit runs at about half the rate of two (GPT-2's 1,024 x 768 x 3,072 product, 48 tiles, and
ResNet-18's last convolution, 28 tiles of k = 4,608, run in well under their unsplit time). With a
whole wave of tiles or more nothing is gained: splitting the few tiles left over after whole waves
makes such a GEMM slower (``benchmarks/gemm_shapes.py``; its results are listed in
``benchmarks/results/README.md``).

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
from dataclasses import dataclass

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.schedule import FusionGroup
from torch_adreno.fusion.specs import GemmKernel

#: Output tiles (64 x 64, times the batch) below which a GEMM is split, and the most it is split to,
#: on a device of at most 16 compute units; larger ones get four tiles per compute unit (on a
#: GPU of a hundred or more: ResNet-18's first-stage weight gradients, 9 tiles each, split into 8,
#: and GPT-2's head backward, 96 work-groups of 128 x 64, split in 2).
TARGET_TILES = 64
TILES_PER_COMPUTE_UNIT = 4
#: The shortest k slice.
MIN_SLICE = 256
#: The large tiles' side, their shortest k slice, and the work-groups of them a compute unit runs at once.
LARGE_TILE = 128
LARGE_TILE_MIN_SLICE = 64
LARGE_TILE_GROUPS_PER_UNIT = 2
#: Slice sums written and read again, at most this fraction of the operand bytes.
MAX_PARTIAL_TRAFFIC = 0.25


@dataclass(frozen=True)
class SplitPolicy:
    """How far the fusion stage cuts long GEMMs (and long reductions) into slices so that a device
    gets enough work-groups; the kernels stage's choices for a device hold it
    (``torch_adreno.kernels.choices.KernelChoices.split``).

    ``compute_units``: the device's, which :func:`choose_split` and the reduction split aim to
    keep busy (None: a phone GPU's few, :data:`TARGET_TILES`). ``fill_units``: where the kernels
    stage multiplies in 128 x 128 tiles, the compute units :func:`choose_large_tile_split` and
    :func:`choose_small_output_split` fill twice over, whatever the slice sums weigh (None: those
    rules are off)."""

    compute_units: int | None = None
    fill_units: int | None = None


#: The policy for a device whose compute units are unknown: a phone GPU's few, no 128 x 128 tiles.
UNKNOWN_DEVICE_SPLIT = SplitPolicy()


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


def large_tiles(gemm: ir.Gemm) -> int:
    return gemm.batch * math.ceil(gemm.m / LARGE_TILE) * math.ceil(gemm.n / LARGE_TILE)


def choose_large_tile_split(gemm: ir.Gemm, compute_units: int) -> int:
    """The number of k slices of a GEMM multiplied in 128 x 128 tiles on ``compute_units``: enough
    that its tiles times the slices fill every compute unit twice over, where its tiles are fewer
    than the compute units and both extents fill a tile, slices at least
    :data:`LARGE_TILE_MIN_SLICE` long. 1: no split."""
    tiles = large_tiles(gemm)
    if gemm.m < LARGE_TILE or gemm.n < LARGE_TILE or tiles >= compute_units:
        return 1
    split = min(LARGE_TILE_GROUPS_PER_UNIT * compute_units // tiles, gemm.k // LARGE_TILE_MIN_SLICE)
    return max(split, 1)


def choose_small_output_split(gemm: ir.Gemm, compute_units: int) -> int:
    """The number of k slices of a GEMM whose output is under one 64 x 64 tile per compute unit and
    narrower than a 128 x 128 tile (which :func:`choose_large_tile_split` leaves alone): enough that
    its tiles times the slices give every compute unit two work-groups, slices at least
    :data:`LARGE_TILE_MIN_SLICE` long. The slice sums may then outweigh the operands: on a GPU of
    a hundred compute units the few work-groups of such an output each walking k alone are what
    takes the time (MobileNetV2's 384 x 64 weight gradients over k = 3,136: 6 tiles in 4
    slices), and the sums of a few hundred KB per slice stay in the L2
    cache. 1: no split."""
    tiles = output_tiles(gemm)
    if tiles >= compute_units or (gemm.m >= LARGE_TILE and gemm.n >= LARGE_TILE):
        return 1
    return max(1, min(LARGE_TILE_GROUPS_PER_UNIT * compute_units // tiles, gemm.k // LARGE_TILE_MIN_SLICE))


def split_long_gemms(graph: ir.Graph, groups: list[FusionGroup], decisions: list[Decision],
                     policy: SplitPolicy = UNKNOWN_DEVICE_SPLIT) -> None:
    """Give every GEMM kernel that :func:`choose_split` splits (or, with the policy's
    ``fill_units``, :func:`choose_large_tile_split` or :func:`choose_small_output_split`, whichever
    splits more) its slice count and a buffer for the slice sums (written and read by the kernel's
    own two launches only); record each choice."""
    compute_units, fill_units = policy.compute_units, policy.fill_units
    for group in groups:
        spec = group.spec
        if not isinstance(spec, GemmKernel):
            continue
        g = spec.gemm
        split = choose_split(g, target_tiles(compute_units))
        filling = large = 1
        if fill_units:
            large = choose_large_tile_split(g, fill_units)
            # (outputs too small for the large tiles are split to fill the compute units, whatever
            # the slice sums weigh)
            filling = max(large, choose_small_output_split(g, fill_units))
        if split == 1 and filling == 1:
            continue
        reason = (f"{output_tiles(g)} output tile(s) of 64x64 would leave most of {compute_units or 'the'} compute units "
                  f"idle" if filling <= split else
                  f"{large_tiles(g)} tile(s) of 128x128 would leave {fill_units} compute units without their "
                  f"two work-groups" if filling == large else
                  f"{output_tiles(g)} output tile(s) of 64x64 would leave {fill_units} compute units without their "
                  f"two work-groups")
        split = max(split, filling)
        rows = g.batch * g.m if spec.row_sum is not None else 0
        name = f"{g.name}_slices"
        graph.buffers[name] = ir.Buffer(name, (split * (g.batch * g.m * g.n + rows),), ir.DType.F32)
        spec.split_k, spec.partials = split, name
        group.writes.append(name)
        decisions.append(Decision(
            g.name, g.name, True,
            f"split k={g.k} into {split} slices of {math.ceil(g.k / split)}: {reason}; {split}x the work-groups now, "
            f"slice sums add {2 * split * (g.batch * g.m * g.n + rows) * 4} bytes"))
