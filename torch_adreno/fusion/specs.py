"""What the fusion stage hands to code generation: kernel specifications.

Each spec is one future OpenCL kernel. Values flow inside a kernel without touching memory: a
``Load`` of a buffer that the same kernel produces, at the index where it produces it, is served
from a register (an accumulator, or the GEMM's result). Every ``Store`` writes one element of a
buffer per iteration of the kernel's loops, and together a kernel's stores of one buffer write each
of its elements exactly once.
"""

from __future__ import annotations

import functools
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


@dataclass
class SegmentedKernel:
    """Independent pointwise kernels in one launch (multi-tensor grouping, ``multi_tensor.py``).

    The launch's index space is the concatenation of the segments' element ranges, in order:
    work-item ``x`` computes element ``x - offsets[k]`` of segment ``k``, the one whose range holds
    it. Invariant: no segment reads or writes a buffer that another segment writes, so segments
    may run in any order, and each segment's own in-place rules are those of a pointwise kernel.
    """

    segments: list[PointwiseKernel]

    @property
    def offsets(self) -> list[int]:
        """First work-item of each segment, then the total (one more entry than segments)."""
        out = [0]
        for seg in self.segments:
            out.append(out[-1] + math.prod(seg.ranges))
        return out

    def segment_storing(self, buffer: str) -> PointwiseKernel | None:
        for seg in self.segments:
            if any(s.buffer == buffer for s in seg.stores):
                return seg
        return None

    def readers(self, buffer: str) -> list[PointwiseKernel]:
        """The segments that load ``buffer`` (in their values, indices or conditions)."""
        return self._readers.get(buffer, [])

    @functools.cached_property
    def _readers(self) -> dict[str, list[PointwiseKernel]]:
        # (cached: the memory plan asks for every buffer of every segment, and the segments are
        # fixed once the kernel is made)
        readers: dict[str, list[PointwiseKernel]] = {}
        for seg in self.segments:
            read = {ld.buffer for s in seg.stores for e in (s.value, *s.index, *([s.when] if s.when is not None else []))
                    for ld in ir.loads(e)}
            for buffer in read:
                readers.setdefault(buffer, []).append(seg)
        return readers


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
    #: A fused reduction of the left operand over k (a bias gradient next to its weight gradient):
    #: stored per (b, m) by the work-items of the first column block, from the operand values they
    #: load anyway. Its value is ``row_sum_register``.
    row_sum: Store | None = None
    #: Split-K (see ``split_k.py``): the k range is cut into this many slices, each multiplied by
    #: its own work-groups into ``partials`` (slice sums of every output, then of every row sum);
    #: a second launch adds the slices up and runs the epilogue stores.
    split_k: int = 1
    partials: str | None = None

    @property
    def result(self) -> ir.Load:
        # The operands carry the output's type (ctx.gemm casts them to it).
        return ir.Load(self.gemm.output, self.gemm.out_index, self.gemm.lhs.dtype)

    @property
    def row_sum_register(self) -> ir.Load | None:
        if self.row_sum is None:
            return None
        assert isinstance(self.row_sum.value, ir.Load)
        return self.row_sum.value


@dataclass
class HostKernel:
    node: ir.HostOp


@dataclass
class TemplateKernel:
    """A template node alone in its kernel (its renderer in the kernels stage writes every launch)."""

    node: ir.TemplateOp


KernelSpec = PointwiseKernel | SegmentedKernel | ReductionKernel | GemmKernel | HostKernel | TemplateKernel


def _format_store(s: Store) -> str:
    guard = f" if {s.when}" if s.when is not None else ""
    return f"{s.buffer}[{', '.join(map(str, s.index))}] = {s.value}{guard}"


def format_spec(spec: KernelSpec) -> list[str]:
    """The fused IR of one kernel, as text (written by TORCH_ADRENO_DEBUG)."""
    if isinstance(spec, PointwiseKernel):
        return [f"pointwise over {list(spec.ranges)}", *(f"  {_format_store(s)}" for s in spec.stores)]
    if isinstance(spec, SegmentedKernel):
        lines = [f"segmented: {len(spec.segments)} independent pointwise kernels over {spec.offsets[-1]} elements"]
        for k, (seg, start) in enumerate(zip(spec.segments, spec.offsets, strict=False)):
            lines.append(f"  segment {k} from element {start}: pointwise over {list(seg.ranges)}")
            lines.extend(f"    {_format_store(s)}" for s in seg.stores)
        return lines
    if isinstance(spec, ReductionKernel):
        lines = [f"reduction: outer {list(spec.outer)}, inner {list(spec.inner)}"]
        for k, phase in enumerate(spec.phases):
            lines.append(f"  pass {k + 1}:")
            lines.extend(f"    {a.buffer} = reduce_{a.reduce_op} {a.value}" for a in phase.accumulators)
            lines.extend(f"    {_format_store(s)}" for s in phase.stores)
        lines.extend(f"  after: {_format_store(s)}" for s in spec.outer_stores)
        return lines
    if isinstance(spec, GemmKernel):
        g = spec.gemm
        rows = [f"  row sum of lhs over k: {_format_store(spec.row_sum)}"] if spec.row_sum is not None else []
        return [f"gemm batch={g.batch} m={g.m} n={g.n} k={g.k}", f"  lhs(b, m, k) = {g.lhs}",
                f"  rhs(b, k, n) = {g.rhs}", f"  result = {spec.result}",
                *(f"  {_format_store(s)}" for s in spec.stores), *rows]
    if isinstance(spec, TemplateKernel):
        return [f"template {spec.node.target} {dict(spec.node.attributes)}"]
    return [f"host {spec.node.target}"]


def spec_kind(spec: KernelSpec) -> str:
    return {PointwiseKernel: "pointwise", SegmentedKernel: "segmented", ReductionKernel: "reduction",
            GemmKernel: "gemm", HostKernel: "host", TemplateKernel: "template"}[type(spec)]


def spec_stores(spec: KernelSpec) -> list[Store]:
    if isinstance(spec, GemmKernel):
        return list(spec.stores) + ([spec.row_sum] if spec.row_sum is not None else [])
    if isinstance(spec, PointwiseKernel):
        return list(spec.stores)
    if isinstance(spec, SegmentedKernel):
        return [s for seg in spec.segments for s in seg.stores]
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
