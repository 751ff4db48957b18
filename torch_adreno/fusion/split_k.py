"""Split-K: GEMMs with few outputs and a long k get the k range cut into slices.

A convolution's weight gradient multiplies over batch x height x width (k = 32,768 in resnet_mini's
first stage) into a few hundred outputs (16 x 144): one or a few output tiles, so one or a few
work-groups walk all of k while the rest of the GPU idles (measured on the H200: 1.5 ms for
151 MFLOP). Cut into S slices, S times as many work-groups each multiply k / S into a slice sum,
and a second, small launch adds the S slice sums and runs the fused epilogue. The slice sums
cost 2 x S x m x n floats of traffic, kept under a quarter of the bytes the operands move.

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
from torch_adreno.fusion.kernels import GemmKernel
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


def split_long_gemms(graph: ir.Graph, groups: list[FusionGroup], decisions: list[Decision],
                     compute_units: int | None = None) -> None:
    """Give every GEMM kernel that :func:`choose_split` splits its slice count and a buffer for the
    slice sums (written and read by the kernel's own two launches only); record each choice."""
    for group in groups:
        spec = group.spec
        if not isinstance(spec, GemmKernel):
            continue
        g = spec.gemm
        split = choose_split(g, target_tiles(compute_units))
        if split == 1:
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
