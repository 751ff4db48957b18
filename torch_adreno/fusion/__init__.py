"""Fusion: ir.Graph -> FusedGraph, the kernels of a graph in launch order.

Steps, each recording a reason for every decision (``TORCH_ADRENO_DEBUG`` writes them out):

1. recomputation (``inline.py``): small reductions are unrolled, cheap pointwise producers are
   substituted into their consumers, so their results never reach memory; long reductions into
   few outputs (``split_reductions.py``) become partial reductions and a reduction of the partials
   (also without fusion, like split-K);
2. scheduling (``schedule.py``): what remains is grouped into kernels where values can flow through
   registers (GEMM epilogues, reduction prologues/epilogues/inner stages, pointwise chains,
   horizontal siblings);
3. split-K (``split_k.py``): GEMMs with few outputs and a long k are cut into k slices, so that
   enough work-groups run (also without fusion: it is how a GEMM runs, not what it fuses);
4. multi-tensor grouping (``multi_tensor.py``): independent pointwise kernels (an optimizer's
   per-parameter updates) are launched together, each a segment of one index space.

With ``options={"fusion": False}`` every IR node is its own kernel: the baseline fusion is
measured against. Both schedules compute the same values up to float reassociation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.inline import inline_pointwise, unroll_small_reductions
from torch_adreno.fusion.multi_tensor import group_independent_pointwise, max_kernel_buffers
from torch_adreno.fusion.schedule import FusionGroup, Scheduler
from torch_adreno.fusion.specs import (
    Accumulator,
    GemmKernel,
    HostKernel,
    KernelSpec,
    Phase,
    PointwiseKernel,
    ReductionKernel,
    SegmentedKernel,
    Store,
    TemplateKernel,
    format_spec,
)
from torch_adreno.fusion.split_k import UNKNOWN_DEVICE_SPLIT, SplitPolicy, split_long_gemms
from torch_adreno.fusion.split_reductions import split_long_reductions

__all__ = [
    "Accumulator",
    "Decision",
    "FusedGraph",
    "FusionGroup",
    "GemmKernel",
    "HostKernel",
    "KernelSpec",
    "Phase",
    "PointwiseKernel",
    "ReductionKernel",
    "SegmentedKernel",
    "SplitPolicy",
    "Store",
    "TemplateKernel",
    "fuse",
    "max_kernel_buffers",
]


@dataclass
class FusedGraph:
    """The graph and its kernels. Invariants: every buffer a kernel reads is a graph input or is
    written by an earlier kernel; every graph output is a graph input or written by a kernel."""

    graph: ir.Graph
    groups: list[FusionGroup]
    decisions: list[Decision] = field(default_factory=list)

    def stored_buffers(self) -> set[str]:
        return {w for g in self.groups for w in g.writes}

    def describe(self) -> str:
        lines = [f"{len(self.groups)} kernels for {len(self.graph.nodes)} IR nodes"]
        for g in self.groups:
            lines.append(f"{g.name} [{g.kind}] nodes {[n.name for n in g.nodes]} reads {g.reads} writes {g.writes}")
            lines.extend(f"    {line}" for line in format_spec(g.spec))
        lines.append("decisions:")
        lines.extend(f"  {d}" for d in self.decisions)
        return "\n".join(lines)


def fuse(graph: ir.Graph, config: Config, max_buffers: int | None = None,
         split: SplitPolicy = UNKNOWN_DEVICE_SPLIT) -> FusedGraph:
    """``max_buffers``: the most buffer arguments a kernel may take on the target device
    (:func:`max_kernel_buffers`; default: what every full-profile OpenCL device accepts);
    ``split``: how far long GEMMs and reductions are cut to fill the target (the kernel choices
    made for it, ``KernelChoices.split``; default: a phone GPU's few compute units, no 128 x 128
    tiles; see ``split_k.py``)."""
    decisions: list[Decision] = []
    if not config.fusion:
        scheduler = Scheduler(graph, decisions)
        for node in split_long_reductions(graph, list(graph.nodes), decisions, split.compute_units):
            scheduler._start(node, set(ir.node_inputs(node)))
        decisions.append(Decision("*", "*", False, "fusion disabled (options={'fusion': False}): one kernel per node"))
        groups = scheduler.finish("k")
    else:
        nodes = unroll_small_reductions(list(graph.nodes), decisions)
        nodes = inline_pointwise(graph, nodes, decisions)
        nodes = split_long_reductions(graph, nodes, decisions, split.compute_units)
        scheduler = Scheduler(graph, decisions)
        for node in nodes:
            scheduler.place(node)
        groups = scheduler.finish("k")
    split_long_gemms(graph, groups, decisions, split)
    if config.fusion:
        groups = group_independent_pointwise(groups, decisions, max_buffers or max_kernel_buffers())
    return FusedGraph(graph, groups, decisions)
