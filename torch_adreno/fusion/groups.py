"""The bookkeeping of scheduling: kernels being assembled, and the FusionGroups they become.

An :class:`OpenKernel` is a kernel while nodes may still join it. It knows which buffers it holds
in registers and at which index (a node may read them there and only there), the value expression
of each buffer computed as an expression (substituted into the readers), the pass of each
accumulator, and what it reads from outside. :class:`Assembly` is the list of open kernels in
launch order, which kernel produces each buffer, and the decision log. :func:`close_kernels`
turns the open kernels into :class:`FusionGroup` s once every node is placed: only then is it
known which buffers a later kernel or the caller needs, hence which ones are stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.specs import (
    GemmKernel,
    HostKernel,
    KernelSpec,
    PointwiseKernel,
    ReductionKernel,
    Store,
    TemplateKernel,
    spec_exprs,
    spec_kind,
    spec_stores,
)


@dataclass
class FusionGroup:
    """One kernel: its specification, the IR nodes it computes, what it reads and writes."""

    name: str
    spec: KernelSpec
    nodes: list[ir.Node]
    reads: list[str]
    writes: list[str]

    @property
    def kind(self) -> str:
        return spec_kind(self.spec)

    @property
    def origins(self) -> tuple[ir.Origin, ...]:
        seen: dict[str, ir.Origin] = {}
        for n in self.nodes:
            for o in n.origins:
                seen.setdefault(o.node, o)
        return tuple(seen.values())


@dataclass
class OpenKernel:
    """A kernel being assembled. Invariant: every buffer in ``held`` is produced by one of
    ``nodes``; ``external`` holds the buffers ``nodes`` read that none of them produces."""

    index: int
    spec: KernelSpec
    nodes: list[ir.Node]
    #: buffer -> the index at which this kernel holds it in a register (None: not readable here)
    held: dict[str, tuple[ir.Expr, ...] | None] = field(default_factory=dict)
    #: buffer -> its value expression, for buffers computed as expressions (substituted on read)
    values: dict[str, ir.Expr] = field(default_factory=dict)
    #: accumulator buffer -> phase (reduction kernels)
    phase_of: dict[str, int] = field(default_factory=dict)
    external: set[str] = field(default_factory=set)

    @property
    def label(self) -> str:
        """How decisions name this kernel: after its first node."""
        return f"the kernel of {self.nodes[0].name}"

    def reads_from_outside(self, node: ir.Node) -> None:
        """Note what ``node`` reads that the kernel does not hold. Called after ``node``'s outputs
        are in ``held``, so that a node reading its own kernel's results adds nothing."""
        self.external |= set(ir.node_inputs(node)) - set(self.held)

    def resolve(self, expr: ir.Expr) -> ir.Expr | str:
        """``expr`` with the kernel's own values substituted; a reason string when it reads one of
        the kernel's results at an index other than where the kernel holds it."""
        problem: list[str] = []

        def replace(e: ir.Expr) -> ir.Expr | None:
            if isinstance(e, ir.Load) and e.buffer in self.held:
                index = self.held[e.buffer]
                if index is None or tuple(e.index) != tuple(index):
                    problem.append(f"it reads {e.buffer} at a different element than the kernel produces")
                    return None
                value = self.values.get(e.buffer)
                return ir.cast(value, e.dtype) if value is not None else None
            return None

        out = ir.rewrite(expr, replace)
        return problem[0] if problem else out

    def phase_after(self, value: ir.Expr) -> int:
        """The first pass of a reduction kernel in which ``value`` can be computed: the one after
        the last pass whose accumulators it reads (0 when it reads none)."""
        phases = [self.phase_of[ld.buffer] for ld in ir.loads(value) if ld.buffer in self.phase_of]
        return max(phases) + 1 if phases else 0


class Assembly:
    """The kernels opened so far, in launch order, and the decision log.

    Invariant: ``producer[b]`` is the index in ``kernels`` of the kernel that computes buffer
    ``b``; a kernel may read only buffers produced by kernels before it (or held by itself)."""

    def __init__(self, graph: ir.Graph, decisions: list[Decision]) -> None:
        self.graph = graph
        self.decisions = decisions
        self.kernels: list[OpenKernel] = []
        self.producer: dict[str, int] = {}

    def open(self, node: ir.Node, spec: KernelSpec) -> OpenKernel:
        """A new kernel at the end of the launch order, computing ``node``."""
        kernel = OpenKernel(len(self.kernels), spec, [node])
        self.kernels.append(kernel)
        for out in ir.node_outputs(node):
            self.producer[out] = kernel.index
        return kernel

    def accept(self, node: ir.Node, kernel: OpenKernel, how: str) -> None:
        """``node`` joins ``kernel`` (whose spec the caller has already extended), for ``how``."""
        kernel.nodes.append(node)
        for out in ir.node_outputs(node):
            self.producer[out] = kernel.index
        self.decisions.append(Decision(node.name, kernel.label, True, how))

    def refuse(self, node: ir.Node, kernel: OpenKernel, reason: str) -> None:
        self.decisions.append(Decision(node.name, kernel.label, False, reason))

    def not_ready(self, kernel: OpenKernel, reads: set[str]) -> str | None:
        """Why ``kernel`` cannot read all of ``reads``: one is produced by it or a later kernel
        without being held by it (None when all are ready before it runs)."""
        for name in reads:
            if name in kernel.held:
                continue
            producer = self.producer.get(name)
            if producer is not None and producer >= kernel.index:
                return f"it reads {name}, which a later kernel produces"
        return None

    def dtype(self, buffer: str) -> ir.DType:
        return self.graph.buffers[buffer].dtype


def close_kernels(graph: ir.Graph, kernels: list[OpenKernel], name_prefix: str) -> list[FusionGroup]:
    """The FusionGroups of ``kernels``, named ``name_prefix`` + index. A buffer is stored only when
    the caller or a later kernel reads it; an accumulator or a GEMM result that is, gets a store
    of its register (first, before the stores computed from it)."""
    needed = set(graph.output_buffers())
    for k in kernels:
        needed |= k.external
    return [_close(k, needed, f"{name_prefix}{k.index}") for k in kernels]


def _close(kernel: OpenKernel, needed: set[str], name: str) -> FusionGroup:
    spec = kernel.spec
    if isinstance(spec, PointwiseKernel | GemmKernel):
        spec.stores = [s for s in spec.stores if s.buffer in needed]
    if isinstance(spec, ReductionKernel):
        for phase in spec.phases:
            phase.stores = [s for s in phase.stores if s.buffer in needed]
        spec.outer_stores = [s for s in spec.outer_stores if s.buffer in needed]
        for acc in spec.accumulators():
            if acc.buffer in needed:
                spec.outer_stores.insert(0, Store(acc.buffer, spec.loop_vars,
                                                  ir.Load(acc.buffer, spec.loop_vars, acc.dtype)))
    if isinstance(spec, GemmKernel) and spec.gemm.output in needed:
        spec.stores.insert(0, Store(spec.gemm.output, spec.gemm.out_index, spec.result))
    produced = set(kernel.held)
    if isinstance(spec, HostKernel | TemplateKernel):
        writes, loaded = list(spec.node.outputs), spec.node.input_buffers()
    else:
        writes = [s.buffer for s in spec_stores(spec)]
        loaded = [ld.buffer for e in spec_exprs(spec) for ld in ir.loads(e)]
    reads = list(dict.fromkeys(b for b in loaded if b not in produced))
    return FusionGroup(name, spec, kernel.nodes, reads, writes)
