"""``TORCH_ADRENO_DEBUG=<dir>``: what each pipeline stage made of a graph, written as text files.

Per compiled graph ``<name>``: ``<name>.fx.txt`` (the ATen FX graph), ``<name>.ir.txt`` (the IR
before fusion), ``<name>.fusion.txt`` (kernels, the fused IR of each, and every fusion decision
with its reason), ``<name>.memory.txt`` (the memory plan) and ``<name>/<kernel>.cl`` (the OpenCL
source of every kernel, as built).
"""

from __future__ import annotations

from pathlib import Path

from torch.fx import GraphModule

from torch_adreno import ir
from torch_adreno.fusion import FusedGraph
from torch_adreno.kernels import KernelProgram
from torch_adreno.memory import MemoryPlan


def dump(directory: str, gm: GraphModule, graph: ir.Graph, fused: FusedGraph, plan: MemoryPlan,
         program: KernelProgram) -> Path:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    name = graph.name
    (root / f"{name}.fx.txt").write_text(gm.print_readable(print_output=False))
    (root / f"{name}.ir.txt").write_text(ir.format_graph(graph) + "\n")
    (root / f"{name}.fusion.txt").write_text(fused.describe() + "\n")
    (root / f"{name}.memory.txt").write_text(plan.describe() + "\n")
    kernels = root / name
    kernels.mkdir(exist_ok=True)
    for k in program.kernels:
        options = f"// build options: {' '.join(k.build_options)}\n" if k.build_options else ""
        (kernels / f"{k.name}.cl").write_text(options + k.source)
    return root
