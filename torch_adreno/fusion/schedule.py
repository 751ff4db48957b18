"""Grouping IR nodes into kernels, in order, with the reason for every refusal.

A node joins an earlier kernel when its values can flow through registers there:

* a pointwise node joins a GEMM as an epilogue when it reads the GEMM's result element-for-element
  (bias, activation, residual add);
* a pointwise node joins a reduction kernel as an outer epilogue (once per reduced row) or as an
  inner stage (over the row, after the reductions it needs: softmax's normalisation);
* a reduction joins a reduction kernel over the same outer and inner ranges, in the phase after
  the reductions it reads (softmax's sum after its max) or beside those sharing its input
  (horizontal fusion: max and argmax of a pooling window, mean and variance);
* a pointwise node joins a pointwise kernel of the same shape that produces what it reads
  element-for-element, or that reads the same input (horizontal fusion).

Legality: a kernel may only read buffers produced by kernels that run before it, and it may only
read its own results at the index where it produces them. A buffer produced in a kernel is stored
only when a later kernel or the caller needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.kernels import (
    Accumulator,
    GemmKernel,
    HostKernel,
    KernelSpec,
    Phase,
    PointwiseKernel,
    ReductionKernel,
    Store,
    spec_exprs,
    spec_kind,
    spec_stores,
)


def _unravel(linear: ir.Expr, shape: tuple[int, ...]) -> list[ir.Expr]:
    out = []
    for size, stride in zip(shape, ir.contiguous_strides(shape), strict=True):
        out.append(ir.call("mod", ir.call("floordiv", linear, ir.index(stride)), ir.index(size)))
    return out


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
class _Open:
    """A kernel being assembled."""

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


class Scheduler:
    def __init__(self, graph: ir.Graph, decisions: list[Decision]) -> None:
        self.graph = graph
        self.decisions = decisions
        self.groups: list[_Open] = []
        self.group_of: dict[str, int] = {}

    # -- helpers ---------------------------------------------------------------------------------

    def _inputs_ready_before(self, group: _Open, reads: set[str]) -> str | None:
        for name in reads:
            if name in group.held:
                continue
            producer = self.group_of.get(name)
            if producer is not None and producer >= group.index:
                return f"it reads {name}, which a later kernel produces"
        return None

    def _resolve(self, expr: ir.Expr, group: _Open) -> ir.Expr | str:
        """``expr`` with the group's own values substituted; a reason string when it reads one of
        the group's results at an index other than where the group holds it."""
        problem: list[str] = []

        def replace(e: ir.Expr) -> ir.Expr | None:
            if isinstance(e, ir.Load) and e.buffer in group.held:
                index = group.held[e.buffer]
                if index is None or tuple(e.index) != tuple(index):
                    problem.append(f"it reads {e.buffer} at a different element than the kernel produces")
                    return None
                value = group.values.get(e.buffer)
                return ir.cast(value, e.dtype) if value is not None else None
            return None

        out = ir.rewrite(expr, replace)
        return problem[0] if problem else out

    def _refuse(self, node: ir.Node, group: _Open, reason: str) -> None:
        self.decisions.append(Decision(node.name, f"the kernel of {group.nodes[0].name}", False, reason))

    def _accept(self, node: ir.Node, group: _Open, how: str) -> None:
        group.nodes.append(node)
        for out in ir.node_outputs(node):
            self.group_of[out] = group.index
        self.decisions.append(Decision(node.name, f"the kernel of {group.nodes[0].name}", True, how))

    def _new_group(self, node: ir.Node, spec: KernelSpec) -> _Open:
        group = _Open(len(self.groups), spec, [node])
        self.groups.append(group)
        for out in ir.node_outputs(node):
            self.group_of[out] = group.index
        return group

    # -- placement --------------------------------------------------------------------------------

    def place(self, node: ir.Node) -> None:
        reads = set(ir.node_inputs(node))
        related = [g for g in reversed(self.groups) if reads & (set(g.held) | g.external)]
        for group in related:
            reason = self._try_join(node, group, reads)
            if reason is None:
                return
            self._refuse(node, group, reason)
        self._start(node, reads)

    def _start(self, node: ir.Node, reads: set[str]) -> None:
        if isinstance(node, ir.Pointwise):
            group = self._new_group(node, PointwiseKernel(node.ranges, []))
            group.spec.stores.append(Store(node.output, node.loop_vars, node.body))  # type: ignore[union-attr]
            group.held[node.output] = node.loop_vars
            group.values[node.output] = node.body
        elif isinstance(node, ir.Reduction):
            acc = Accumulator(node.output, node.reduce_op, node.body, self.graph.buffers[node.output].dtype)
            group = self._new_group(node, ReductionKernel(node.ranges, node.reduction_ranges, [Phase([acc])], []))
            group.held[node.output] = node.loop_vars
            group.phase_of[node.output] = 0
        elif isinstance(node, ir.Gemm):
            group = self._new_group(node, GemmKernel(node, []))
            group.held[node.output] = node.out_index
        else:
            group = self._new_group(node, HostKernel(node))
            for out in node.outputs:
                group.held[out] = None
        group.external |= reads - set(group.held)

    def _try_join(self, node: ir.Node, group: _Open, reads: set[str]) -> str | None:
        spec = group.spec
        if isinstance(node, ir.HostOp) or isinstance(spec, HostKernel):
            return "host ops run alone"
        if isinstance(node, ir.Gemm):
            return "a GEMM starts its own kernel"
        not_ready = self._inputs_ready_before(group, reads)
        if not_ready is not None:
            return not_ready
        if isinstance(node, ir.Pointwise):
            if isinstance(spec, GemmKernel):
                return self._join_gemm_epilogue(node, group, spec)
            if isinstance(spec, ReductionKernel):
                return self._join_reduction_pointwise(node, group, spec)
            assert isinstance(spec, PointwiseKernel)
            return self._join_pointwise(node, group, spec)
        assert isinstance(node, ir.Reduction)
        if isinstance(spec, GemmKernel):
            return self._join_gemm_column(node, group, spec)
        if isinstance(spec, PointwiseKernel):
            promoted = self._promote_to_reduction(node, group, spec)
            if isinstance(promoted, str):
                return promoted
        if isinstance(group.spec, ReductionKernel):
            return self._join_reduction(node, group, group.spec)
        return f"a reduction cannot join a {spec_kind(spec)} kernel"

    def _join_gemm_column(self, node: ir.Reduction, group: _Open, spec: GemmKernel) -> str | None:
        """Sum the GEMM's left operand over k in the GEMM kernel itself, from the operand values it
        loads anyway: a bias gradient computed beside its weight gradient (horizontal fusion)."""
        g = spec.gemm
        if node.reduce_op != "sum" or not node.body.dtype.is_float:
            return "only a float sum can ride on a GEMM"
        if spec.row_sum is not None:
            return "the GEMM already carries a row reduction"
        if math.prod(node.ranges) != g.batch * g.m or node.reduction_numel != g.k:
            return (f"it reduces {math.prod(node.ranges)} rows of {node.reduction_numel}, the GEMM has "
                    f"{g.batch * g.m} of {g.k}")
        v = g.vars()
        rows = ir.call("add", ir.call("mul", v["b"], ir.index(g.m)), v["m"])
        row_index = _unravel(rows, node.ranges)
        mapping = dict(zip(node.loop_vars, row_index, strict=True))
        mapping.update(zip(node.reduction_vars, _unravel(v["k"], node.reduction_ranges), strict=True))
        body = ir.substitute(node.body, {a: b for a, b in mapping.items() if isinstance(a, ir.Var)})
        if ir.cast(body, g.lhs.dtype) != g.lhs:
            return "it does not sum the GEMM's left operand"
        spec.row_sum = Store(node.output, tuple(row_index), ir.Load(node.output, tuple(row_index),
                                                                           self.graph.buffers[node.output].dtype))
        group.held[node.output] = None
        group.external |= set(ir.node_inputs(node)) - set(group.held)
        self._accept(node, group, "row reduction of the GEMM's left operand, summed in the GEMM kernel from the "
                                  "operand values it loads (horizontal fusion: one pass over the shared input)")
        return None

    def _promote_to_reduction(self, node: ir.Reduction, group: _Open, spec: PointwiseKernel) -> str | None:
        """Turn a pointwise kernel into the inner stage of ``node``'s reduction kernel, when ``node``
        reduces exactly what the kernel computes (a bias gradient summed from the masked gradient
        the kernel writes): each element is then computed once, stored, and summed in a register."""
        for ld in ir.loads(node.body):
            if ld.buffer in group.held and group.held[ld.buffer] is not None:
                index = ld.index
                break
        else:
            return "it reads no result of the kernel"
        if math.prod(spec.ranges) != math.prod(node.ranges) * node.reduction_numel:
            return "the kernel's elements do not match the reduction's loops"
        held_index = group.held[ld.buffer]
        assert held_index is not None
        mapping: dict[ir.Var, ir.Expr] = {}
        for own, target in zip(held_index, index, strict=True):
            if isinstance(own, ir.Const):
                continue
            assert isinstance(own, ir.Var)
            if not isinstance(target, ir.Var) or target in mapping.values() or target.size != own.size:
                return "it reads the kernel's result at computed positions"
            mapping[own] = target
        targets = set(mapping.values())
        loop_vars = {v for v in [*node.loop_vars, *node.reduction_vars] if isinstance(v, ir.Var)}
        if targets != loop_vars:
            return "it does not read each element of the kernel's result exactly once"
        stores = [Store(st.buffer, tuple(ir.substitute(e, mapping) for e in st.index), ir.substitute(st.value, mapping))
                  for st in spec.stores]
        group.spec = ReductionKernel(node.ranges, node.reduction_ranges, [Phase([], stores)], [])
        group.values = {b: ir.substitute(v, mapping) for b, v in group.values.items()}
        group.held = {b: (tuple(ir.substitute(e, mapping) for e in idx) if idx is not None else None)
                      for b, idx in group.held.items()}
        self.decisions.append(Decision(f"the kernel of {group.nodes[0].name}", node.name, True,
                                       "pointwise kernel became the inner stage of this reduction (horizontal fusion)"))
        return None

    def _join_pointwise(self, node: ir.Pointwise, group: _Open, spec: PointwiseKernel) -> str | None:
        squeezed = [s for s in node.ranges if s != 1]
        if squeezed != [s for s in spec.ranges if s != 1]:
            return f"its shape {list(node.ranges)} differs from the kernel's {list(spec.ranges)}"
        # Same elements up to size-1 dimensions: the node's variables are the kernel's, in order.
        mapping = dict(zip([v for v in node.loop_vars if isinstance(v, ir.Var)],
                           [v for v in spec.loop_vars if isinstance(v, ir.Var)], strict=True))
        index = tuple(ir.substitute(v, mapping) for v in node.loop_vars)
        value = self._resolve(ir.substitute(node.body, mapping), group)
        if isinstance(value, str):
            return value
        spec.stores.append(Store(node.output, index, value))
        group.held[node.output] = index
        group.values[node.output] = value
        group.external |= set(ir.node_inputs(node)) - set(group.held)
        self._accept(node, group, "same shape: computed by the same work-items (pointwise fusion)")
        return None

    def _join_gemm_epilogue(self, node: ir.Pointwise, group: _Open, spec: GemmKernel) -> str | None:
        gemm = spec.gemm
        out_shape = self.graph.buffers[gemm.output].shape
        if node.ranges != out_shape:
            return f"its shape {list(node.ranges)} differs from the GEMM result's {list(out_shape)}"
        mapping = {v: e for v, e in zip(node.loop_vars, gemm.out_index, strict=True) if isinstance(v, ir.Var)}
        for ld in ir.loads(node.body):
            if ld.buffer == gemm.output and tuple(ld.index) != tuple(node.loop_vars):
                return "it reads the GEMM result at a different element than it writes"
        value = self._resolve(ir.substitute(node.body, mapping), group)
        if isinstance(value, str):
            return value
        spec.stores.append(Store(node.output, gemm.out_index, value))
        group.held[node.output] = gemm.out_index
        group.values[node.output] = value
        group.external |= set(ir.node_inputs(node)) - set(group.held)
        self._accept(node, group, "GEMM epilogue: applied to each result before it is stored")
        return None

    def _acc_phase(self, value: ir.Expr, group: _Open) -> int:
        phases = [group.phase_of[ld.buffer] for ld in ir.loads(value) if ld.buffer in group.phase_of]
        return max(phases) + 1 if phases else 0

    def _join_reduction(self, node: ir.Reduction, group: _Open, spec: ReductionKernel) -> str | None:
        if (node.ranges, node.reduction_ranges) != (spec.outer, spec.inner):
            return (f"its loops {list(node.ranges)} x {list(node.reduction_ranges)} differ from the kernel's "
                    f"{list(spec.outer)} x {list(spec.inner)}")
        value = self._resolve(node.body, group)
        if isinstance(value, str):
            return value
        phase = self._acc_phase(value, group)
        while len(spec.phases) <= phase:
            spec.phases.append(Phase())
        spec.phases[phase].accumulators.append(
            Accumulator(node.output, node.reduce_op, value, self.graph.buffers[node.output].dtype))
        group.held[node.output] = spec.loop_vars
        group.phase_of[node.output] = phase
        group.external |= set(ir.node_inputs(node)) - set(group.held)
        self._accept(node, group, f"same loops: reduced in pass {phase + 1} of the kernel")
        return None

    def _join_reduction_pointwise(self, node: ir.Pointwise, group: _Open, spec: ReductionKernel) -> str | None:
        mapping = self._map_onto_reduction(node, group, spec)
        if isinstance(mapping, str):
            return mapping
        mapped_vars = tuple(ir.substitute(v, mapping) for v in node.loop_vars)
        value = self._resolve(ir.substitute(node.body, mapping), group)
        if isinstance(value, str):
            return value
        outer = math.prod(node.ranges) == math.prod(spec.outer)
        if outer:
            spec.outer_stores.append(Store(node.output, mapped_vars, value))
            group.held[node.output] = mapped_vars
            group.values[node.output] = value
            how = "reduction epilogue: computed once per reduced row"
        else:
            phase = self._acc_phase(value, group)
            while len(spec.phases) <= phase:
                spec.phases.append(Phase())
            spec.phases[phase].stores.append(Store(node.output, mapped_vars, value))
            group.held[node.output] = None
            how = f"reduction inner stage: computed over each row in pass {phase + 1}"
        group.external |= set(ir.node_inputs(node)) - set(group.held)
        self._accept(node, group, how)
        return None

    def _map_onto_reduction(self, node: ir.Pointwise, group: _Open,
                            spec: ReductionKernel) -> dict[ir.Var, ir.Expr] | str:
        """Node loop variables -> the kernel's outer (i*) and inner (r*) variables, found from how
        the node reads the kernel's per-row results."""
        row_results = {b for b, idx in group.held.items() if idx is not None and tuple(idx) == tuple(spec.loop_vars)}
        by_outer_dim: dict[int, ir.Var] = {}
        for ld in ir.loads(node.body):
            if ld.buffer not in row_results:
                continue
            for d, e in enumerate(ld.index):
                if spec.outer[d] == 1:
                    continue
                if not isinstance(e, ir.Var) or by_outer_dim.get(d, e) != e:
                    return "it reads the kernel's per-row results at computed positions"
                by_outer_dim[d] = e
        if not by_outer_dim and any(s > 1 for s in spec.outer):
            return "it reads no per-row result of the kernel, so its rows cannot be matched"
        outer_vars = [v for v in spec.loop_vars if isinstance(v, ir.Var)]
        if len(by_outer_dim) != len(outer_vars):
            return "it does not cover every outer dimension of the kernel"
        mapping: dict[ir.Var, ir.Expr] = {}
        for d, var in by_outer_dim.items():
            target = spec.loop_vars[d]
            assert isinstance(target, ir.Var)
            if var.size != target.size:
                return "its sizes do not match the kernel's outer loop"
            mapping[var] = target
        rest = [v for v in node.loop_vars if isinstance(v, ir.Var) and v not in mapping]
        if not rest:
            return mapping
        inner_vars = [v for v in spec.reduction_vars if isinstance(v, ir.Var)]
        if [v.size for v in rest] != [v.size for v in inner_vars]:
            return (f"its remaining dimensions {[v.size for v in rest]} do not match the reduced ones "
                    f"{[v.size for v in inner_vars]}")
        mapping.update(zip(rest, inner_vars, strict=True))
        return mapping

    # -- result --------------------------------------------------------------------------------------

    def finish(self, name_prefix: str) -> list[FusionGroup]:
        needed = set(self.graph.output_buffers())
        for g in self.groups:
            needed |= g.external
        result = []
        for g in self.groups:
            spec = g.spec
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
            writes = [s.buffer for s in spec_stores(spec)] if not isinstance(spec, HostKernel) else list(spec.node.outputs)
            produced = set(g.held)
            loaded = [ld.buffer for e in spec_exprs(spec) for ld in ir.loads(e)]
            if isinstance(spec, HostKernel):
                loaded = spec.node.input_buffers()
            reads = list(dict.fromkeys(b for b in loaded if b not in produced))
            result.append(FusionGroup(f"{name_prefix}{g.index}", spec, g.nodes, reads, writes))
        return result
