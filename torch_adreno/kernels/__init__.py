"""Kernels: FusedGraph + MemoryPlan -> KernelProgram (OpenCL C source and launch geometry).

Generated kernels (pointwise, reduction) come from the expression table and the code writer;
heavy ops (GEMM, and the convolutions built on it) instantiate ``.cl`` templates with ``-D``
options, with the fused prologues and epilogues written by the same code writer. Every kernel's
source opens with the FX nodes it came from.
"""

from __future__ import annotations

import math

from torch_adreno import ir
from torch_adreno.fusion import (
    FusedGraph,
    FusionGroup,
    GemmKernel,
    HostKernel,
    PointwiseKernel,
    ReductionKernel,
)
from torch_adreno.kernels.gemm import GEMM_MACROS, render_gemm
from torch_adreno.kernels.generated import buffer_bytes, make_params, render_pointwise, render_reduction
from torch_adreno.kernels.program import (
    HostStep,
    KernelProgram,
    KernelSource,
    Step,
    c_identifier,
    header_comment,
)
from torch_adreno.memory import MemoryPlan
from torch_adreno.target import DeviceProfile

__all__ = ["HostStep", "KernelProgram", "KernelSource", "render_program"]


def kernel_name(graph_name: str, index: int, group: FusionGroup) -> str:
    """Deterministic and descriptive: graph, position, kind and the ATen ops it computes."""
    ops = list(dict.fromkeys(o.op.split(".")[1] if "." in o.op else o.op for o in group.origins))
    kind = {"pointwise": "pw", "reduction": "red", "gemm": "gemm"}.get(group.kind, group.kind)
    summary = "_".join(ops[:3]) + ("_etc" if len(ops) > 3 else "")
    return c_identifier(f"{graph_name}_{index}_{kind}_{summary}").lower()


def _describe(group: FusionGroup) -> str:
    spec = group.spec
    if isinstance(spec, PointwiseKernel):
        return f"pointwise over {list(spec.ranges)}"
    if isinstance(spec, ReductionKernel):
        ops = ", ".join(a.reduce_op for a in spec.accumulators())
        return f"{ops} over {list(spec.inner)} for each of {list(spec.outer)} in {len(spec.phases)} pass(es)"
    assert isinstance(spec, GemmKernel)
    g = spec.gemm
    return f"gemm batch={g.batch} m={g.m} n={g.n} k={g.k}, {len(spec.stores)} store(s)"


def _float_ops(expr: ir.Expr) -> int:
    return sum(1 for e in ir.walk(expr) if isinstance(e, ir.Call) and e.dtype.is_float and e.op != "cast")


def estimate_flops(group: FusionGroup) -> int:
    """Float operations of one launch: 2mnk per GEMM (plus its epilogue), per-element expression
    ops times the elements of pointwise and reduction loops."""
    spec = group.spec
    if isinstance(spec, GemmKernel):
        g = spec.gemm
        epilogue = sum(_float_ops(s.value) for s in spec.stores)
        return 2 * g.batch * g.m * g.n * g.k + g.batch * g.m * g.n * epilogue
    if isinstance(spec, PointwiseKernel):
        return math.prod(spec.ranges) * sum(_float_ops(s.value) for s in spec.stores)
    if isinstance(spec, ReductionKernel):
        inner = sum(_float_ops(a.value) + 1 for a in spec.accumulators())
        inner += sum(_float_ops(s.value) for p in spec.phases for s in p.stores)
        outer = sum(_float_ops(s.value) for s in spec.outer_stores)
        return math.prod(spec.outer) * (spec.inner_numel * inner + outer)
    return 0


def render_program(fused: FusedGraph, plan: MemoryPlan, profile: DeviceProfile) -> KernelProgram:
    steps: list[Step] = []
    graph = fused.graph
    for index, group in enumerate(fused.groups):
        spec = group.spec
        if isinstance(spec, HostKernel):
            steps.append(HostStep(spec.node))
            continue
        name = kernel_name(graph.name, index, group)
        header = header_comment(name, group.origins, _describe(group))
        storage = {name: plan.storage_root(name) for name in [*group.writes, *group.reads]
                   if name in plan.allocations}
        params = make_params(graph, group.writes, group.reads, storage)
        options: tuple[str, ...] = ()
        macros: tuple[str, ...] = ("INDEX_T",)
        if isinstance(spec, PointwiseKernel):
            source, global_size, local_size = render_pointwise(name, header, spec, params, profile)
        elif isinstance(spec, ReductionKernel):
            source, global_size, local_size = render_reduction(name, header, spec, params, profile)
        else:
            source, options, global_size, local_size = render_gemm(name, header, spec, params, profile)
            macros = GEMM_MACROS
        steps.append(KernelSource(name, group.kind, source, options, tuple(params), global_size, local_size,
                                  group.origins, buffer_bytes(graph, group.reads), buffer_bytes(graph, group.writes),
                                  macros, estimate_flops(group)))
    return KernelProgram(graph, plan, steps)
