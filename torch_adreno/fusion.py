"""Fusion: ir.Graph -> FusedGraph, the list of kernels (FusionGroups) in launch order.

This stage decides which IR nodes share a kernel. Every decision, and every refusal, is kept
with a reason string so that tests and ``TORCH_ADRENO_DEBUG`` can show why a kernel exists.
The schedule here is the baseline: one kernel per IR node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.config import Config


@dataclass
class FusionGroup:
    """One future kernel: IR nodes in order, the buffers it reads from outside and writes."""

    name: str
    nodes: list[ir.Node]
    reads: list[str]
    writes: list[str]

    @property
    def kind(self) -> str:
        head = self.nodes[-1]
        return {ir.Pointwise: "pointwise", ir.Reduction: "reduction", ir.Gemm: "gemm",
                ir.HostOp: "host"}[type(head)]

    @property
    def origins(self) -> tuple[ir.Origin, ...]:
        seen: dict[str, ir.Origin] = {}
        for n in self.nodes:
            for o in n.origins:
                seen.setdefault(o.node, o)
        return tuple(seen.values())


@dataclass(frozen=True)
class Decision:
    """A fusion decision between two nodes, with the reason it was taken or refused."""

    producer: str
    consumer: str
    fused: bool
    reason: str

    def __str__(self) -> str:
        verb = "fused" if self.fused else "cannot fuse"
        return f"{verb} {self.producer} into {self.consumer}: {self.reason}"


@dataclass
class FusedGraph:
    """The graph and its kernels. Invariant: every IR node is in exactly one group, groups are
    in an order that respects every producer-consumer dependency."""

    graph: ir.Graph
    groups: list[FusionGroup]
    decisions: list[Decision] = field(default_factory=list)


def _group_of(node: ir.Node, index: int) -> FusionGroup:
    return FusionGroup(f"k{index}_{node.name}", [node], ir.node_inputs(node), ir.node_outputs(node))


def fuse(graph: ir.Graph, config: Config) -> FusedGraph:
    """Group the graph's nodes into kernels: one kernel per node in this schedule."""
    groups = [_group_of(node, i) for i, node in enumerate(graph.nodes)]
    decisions = [
        Decision(a.name, b.name, False, "fusion is not implemented in this schedule (one kernel per node)")
        for a, b in zip(graph.nodes, graph.nodes[1:], strict=False)
        if set(ir.node_outputs(a)) & set(ir.node_inputs(b))
    ]
    return FusedGraph(graph, groups, decisions)
