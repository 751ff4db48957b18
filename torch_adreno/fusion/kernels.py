"""What the fusion stage hands to code generation: kernel specifications.

Each spec is one future OpenCL kernel. Values flow inside a kernel without touching memory: a
``Load`` of a buffer that the same kernel produces, at the index where it produces it, is served
from a register (an accumulator, or the GEMM's result). Every ``Store`` writes one element of a
buffer per iteration of the kernel's loops, and together a kernel's stores of one buffer write each
of its elements exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch_adreno import ir


@dataclass(frozen=True)
class Store:
    """``buffer[index] = value`` for every iteration of the loops it sits in (where ``when`` holds)."""

    buffer: str
    index: tuple[ir.Expr, ...]
    value: ir.Expr
    when: ir.Expr | None = None


@dataclass
class PointwiseKernel:
    """One work-item per element of ``ranges`` (loop variables ``i0, i1, ...``)."""

    ranges: tuple[int, ...]
    stores: list[Store]

    @property
    def loop_vars(self) -> tuple[ir.Expr, ...]:
        return ir.placeholder_vars(self.ranges, "i")


@dataclass(frozen=True)
class Accumulator:
    """A reduction inside a kernel: ``reduce_op`` of ``value`` over the inner loop, per outer
    element. ``buffer`` names it; loads of ``buffer`` at the outer index read its result."""

    buffer: str
    reduce_op: str
    value: ir.Expr
    dtype: ir.DType


@dataclass
class Phase:
    """One pass over the inner loop: the accumulators it computes and the stores it makes.

    Stores of a phase read only accumulators of earlier phases.
    """

    accumulators: list[Accumulator] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)


@dataclass
class ReductionKernel:
    """Outer loop over ``outer`` (variables ``i*``), inner loops over ``inner`` (``r*``), in phases.

    ``outer_stores`` run once per outer element after the last phase.
    """

    outer: tuple[int, ...]
    inner: tuple[int, ...]
    phases: list[Phase]
    outer_stores: list[Store]

    @property
    def loop_vars(self) -> tuple[ir.Expr, ...]:
        return ir.placeholder_vars(self.outer, "i")

    @property
    def reduction_vars(self) -> tuple[ir.Expr, ...]:
        return ir.placeholder_vars(self.inner, "r")

    @property
    def inner_numel(self) -> int:
        return math.prod(self.inner)

    def accumulators(self) -> list[Accumulator]:
        return [a for p in self.phases for a in p.accumulators]


@dataclass
class GemmKernel:
    """A GEMM template instance: operands (with any fused prologue) and epilogue stores over
    ``b, m, n``; a load of ``gemm.output`` at ``gemm.out_index`` is the accumulated product."""

    gemm: ir.Gemm
    stores: list[Store]
    #: Set when an extra output column carries a fused row reduction: the original columns are
    #: those where this condition holds.
    columns: ir.Expr | None = None

    @property
    def result(self) -> ir.Load:
        return ir.Load(self.gemm.output, self.gemm.out_index, ir.DType.F32)


@dataclass
class HostKernel:
    node: ir.HostOp


KernelSpec = PointwiseKernel | ReductionKernel | GemmKernel | HostKernel


def spec_kind(spec: KernelSpec) -> str:
    return {PointwiseKernel: "pointwise", ReductionKernel: "reduction", GemmKernel: "gemm",
            HostKernel: "host"}[type(spec)]


def spec_stores(spec: KernelSpec) -> list[Store]:
    if isinstance(spec, PointwiseKernel | GemmKernel):
        return list(spec.stores)
    if isinstance(spec, ReductionKernel):
        return [s for p in spec.phases for s in p.stores] + list(spec.outer_stores)
    return []


def spec_exprs(spec: KernelSpec) -> list[ir.Expr]:
    """Every expression the kernel evaluates (to find what it reads)."""
    exprs: list[ir.Expr] = []
    for s in spec_stores(spec):
        exprs.append(s.value)
        exprs.extend(s.index)
        if s.when is not None:
            exprs.append(s.when)
    if isinstance(spec, ReductionKernel):
        exprs.extend(a.value for a in spec.accumulators())
    if isinstance(spec, GemmKernel):
        exprs.extend([spec.gemm.lhs, spec.gemm.rhs])
    return exprs
