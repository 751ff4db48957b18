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

This module decides which rule applies where (:class:`Scheduler`); ``joins.py`` holds the rules,
each of which checks its own conditions and grows the kernel's spec; ``groups.py`` the bookkeeping
of kernels being assembled and the FusionGroups they become.
"""

from __future__ import annotations

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.groups import Assembly, FusionGroup, OpenKernel, close_kernels
from torch_adreno.fusion.joins import (
    join_gemm_column,
    join_gemm_epilogue,
    join_pointwise,
    join_reduction,
    join_reduction_pointwise,
    promote_to_reduction,
)
from torch_adreno.fusion.specs import (
    Accumulator,
    GemmKernel,
    HostKernel,
    Phase,
    PointwiseKernel,
    ReductionKernel,
    Store,
    TemplateKernel,
    spec_kind,
)

__all__ = ["FusionGroup", "Scheduler"]


class Scheduler:
    """Places IR nodes, in order, into kernels: each node joins the latest kernel related to it
    (one holding or reading a buffer it reads) whose rule accepts it, else starts a kernel of its
    own. Every refusal is logged with its reason before the next candidate is tried."""

    def __init__(self, graph: ir.Graph, decisions: list[Decision]) -> None:
        self.graph = graph
        self.decisions = decisions
        self.assembly = Assembly(graph, decisions)

    def place(self, node: ir.Node) -> None:
        reads = set(ir.node_inputs(node))
        related = [k for k in reversed(self.assembly.kernels) if reads & (set(k.held) | k.external)]
        for kernel in related:
            reason = self._try_join(node, kernel, reads)
            if reason is None:
                return
            self.assembly.refuse(node, kernel, reason)
        self._start(node, reads)

    def _start(self, node: ir.Node, reads: set[str]) -> None:
        """Open a kernel computing ``node`` alone (``reads``: the buffers it reads)."""
        if isinstance(node, ir.Pointwise):
            pointwise = PointwiseKernel(node.ranges, [])
            kernel = self.assembly.open(node, pointwise)
            pointwise.stores.append(Store(node.output, node.loop_vars, node.body))
            kernel.held[node.output] = node.loop_vars
            kernel.values[node.output] = node.body
        elif isinstance(node, ir.Reduction):
            acc = Accumulator(node.output, node.reduce_op, node.body, self.assembly.dtype(node.output))
            kernel = self.assembly.open(node, ReductionKernel(node.ranges, node.reduction_ranges, [Phase([acc])], []))
            kernel.held[node.output] = node.loop_vars
            kernel.phase_of[node.output] = 0
        elif isinstance(node, ir.Gemm):
            kernel = self.assembly.open(node, GemmKernel(node, []))
            kernel.held[node.output] = node.out_index
        elif isinstance(node, ir.TemplateOp):
            kernel = self.assembly.open(node, TemplateKernel(node))
            for out in node.outputs:
                kernel.held[out] = None
        else:
            kernel = self.assembly.open(node, HostKernel(node))
            for out in node.outputs:
                kernel.held[out] = None
        kernel.external |= reads - set(kernel.held)

    def _try_join(self, node: ir.Node, kernel: OpenKernel, reads: set[str]) -> str | None:
        """Join ``node`` to ``kernel`` by the rule for their kinds; the reason when it cannot."""
        spec = kernel.spec
        if isinstance(node, ir.HostOp) or isinstance(spec, HostKernel):
            return "host ops run alone"
        if isinstance(node, ir.TemplateOp) or isinstance(spec, TemplateKernel):
            return "a template kernel (fused attention) runs alone"
        if isinstance(node, ir.Gemm):
            return "a GEMM starts its own kernel"
        not_ready = self.assembly.not_ready(kernel, reads)
        if not_ready is not None:
            return not_ready
        if isinstance(node, ir.Pointwise):
            if isinstance(spec, GemmKernel):
                return join_gemm_epilogue(self.assembly, node, kernel, spec)
            if isinstance(spec, ReductionKernel):
                return join_reduction_pointwise(self.assembly, node, kernel, spec)
            assert isinstance(spec, PointwiseKernel)
            return join_pointwise(self.assembly, node, kernel, spec)
        assert isinstance(node, ir.Reduction)
        if isinstance(spec, GemmKernel):
            return join_gemm_column(self.assembly, node, kernel, spec)
        if isinstance(spec, PointwiseKernel):
            promoted = promote_to_reduction(self.assembly, node, kernel, spec)
            if isinstance(promoted, str):
                return promoted
        if isinstance(kernel.spec, ReductionKernel):  # possibly just promoted from pointwise
            return join_reduction(self.assembly, node, kernel, kernel.spec)
        return f"a reduction cannot join a {spec_kind(spec)} kernel"

    def finish(self, name_prefix: str) -> list[FusionGroup]:
        """The kernels in launch order, named ``name_prefix`` + index, storing what is needed."""
        return close_kernels(self.graph, self.assembly.kernels, name_prefix)
