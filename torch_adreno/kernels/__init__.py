"""Kernels: FusedGraph + MemoryPlan -> KernelProgram (OpenCL C source and launch geometry).

Generated kernels (pointwise, reduction) come from the expression table and the code writer;
heavy ops (GEMM, and the convolutions built on it) instantiate ``.cl`` templates with ``-D``
options. Every kernel's source opens with the FX nodes it came from.
"""

from __future__ import annotations

from torch_adreno import ir
from torch_adreno.fusion import FusedGraph
from torch_adreno.kernels.gemm import render_gemm
from torch_adreno.kernels.generated import render_pointwise, render_reduction
from torch_adreno.kernels.program import HostStep, KernelProgram, KernelSource, Step, c_identifier
from torch_adreno.memory import MemoryPlan
from torch_adreno.target import DeviceProfile

__all__ = ["HostStep", "KernelProgram", "KernelSource", "render_program"]


def kernel_name(graph: ir.Graph, index: int, node: ir.Node) -> str:
    """Deterministic and descriptive: graph, position, kind and the ATen op it computes."""
    op = node.origins[0].op.split(".")[1] if node.origins and "." in node.origins[0].op else type(node).__name__
    kind = {ir.Pointwise: "pw", ir.Reduction: "red", ir.Gemm: "gemm"}.get(type(node), "host")
    return c_identifier(f"{graph.name}_{index}_{kind}_{op}").lower()


def render_program(fused: FusedGraph, plan: MemoryPlan, profile: DeviceProfile) -> KernelProgram:
    steps: list[Step] = []
    for index, group in enumerate(fused.groups):
        if len(group.nodes) != 1:
            raise NotImplementedError("kernels of several IR nodes are rendered by the fusion-aware writer")
        node = group.nodes[0]
        name = kernel_name(fused.graph, index, node)
        if isinstance(node, ir.Pointwise):
            steps.append(render_pointwise(name, node, fused.graph, profile))
        elif isinstance(node, ir.Reduction):
            steps.append(render_reduction(name, node, fused.graph, profile))
        elif isinstance(node, ir.Gemm):
            steps.append(render_gemm(name, node, fused.graph, profile))
        else:
            steps.append(HostStep(node))
    return KernelProgram(fused.graph, plan, steps)
