"""Where a training step's kernel bytes go, by element type, per precision: which bytes autocast
halves and which eager's autocast keeps in float32.

One profiled step per precision (the step of ``benchmarks/precision.py``); every kernel's buffers
(each counted once per launch, as the profile counts them) are sorted by the graph that launched
the kernel (forward, backward, the optimizer's step), their role in it (graph input: weights,
batch, saved activations, gradients coming in; graph output: saved activations, gradients; an
intermediate of the graph) and their element type. The totals are checked against the profile's.

``floor`` is the ratio to float32's bytes were every byte that is not float32 under autocast
exactly half its float32 bytes: what stays float32 (eager's choice) bounds the ratio from below.

    python benchmarks/precision_bytes.py --models transformer resnet_mini
    source .gpu/env.sh && python benchmarks/precision_bytes.py --device NVIDIA
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import device_arg, run_context
from precision import PRECISIONS, training_step

import torch_adreno
import torch_adreno.frontend.pipeline as pipeline
from torch_adreno import ir
from torch_adreno.fusion import FusedGraph

GRAPH_KINDS = {"forward": "forward", "backward": "backward", "inference": "optimizer"}


def _element_class(dtype: ir.DType) -> str:
    if dtype is ir.DType.F32:
        return "float32"
    return "16-bit" if dtype.is_half else "integer"


def step_bytes(model_name: str, precision: str, options: dict[str, Any]) -> dict[tuple[str, str, str], int]:
    """(graph kind, role, element class) -> bytes one step's kernels move."""
    fused: dict[str, FusedGraph] = {}
    original = pipeline.fuse

    def keeping(graph: ir.Graph, *args: Any, **kwargs: Any) -> FusedGraph:
        result = original(graph, *args, **kwargs)
        fused[graph.name] = result
        return result

    pipeline.fuse = keeping
    try:
        # The compile cache would hand back programs without running fusion again.
        step, _ = training_step(model_name, precision, {**options, "compile_cache": False})
        for _ in range(2):
            step()
        with torch_adreno.profile() as prof:
            step()
    finally:
        pipeline.fuse = original
    totals: collections.Counter[tuple[str, str, str]] = collections.Counter()
    seen: set[tuple[str, int]] = set()
    for k in prof.kernels:
        index = int(k.name[len(k.graph) + 1:].split("_")[0])
        if (k.graph, index) in seen:  # a split-K GEMM's second launch: counted with its group
            continue
        seen.add((k.graph, index))
        result = fused[k.graph]
        group = result.groups[index]
        graph = result.graph
        kind = GRAPH_KINDS[k.graph.rsplit("_", 1)[0]]
        inputs, outputs = graph.input_buffers(), graph.output_buffers()
        split = getattr(group.spec, "partials", None)
        # Slice sums of a split-K GEMM are written by its first launch and read by its second.
        moved = [*group.reads, *group.writes, *([split] if split else [])]
        for name in moved:
            role = "input" if name in inputs else "output" if name in outputs else "intermediate"
            buffer = graph.buffers[name]
            totals[(kind, role, _element_class(buffer.dtype))] += buffer.nbytes
    counted = sum(totals.values())
    profiled = prof.bytes_kernel_read + prof.bytes_kernel_written
    if counted != profiled:
        raise RuntimeError(f"{model_name} {precision}: buffers add up to {counted} bytes, the profile has {profiled}")
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet_mini", "transformer"])
    parser.add_argument("--device", default=None, type=device_arg)
    args = parser.parse_args()
    options = {"device": args.device} if args.device is not None else {}
    context = run_context(args.device)
    print(f"device: {context['device']} ({context['platform']}), torch {context['torch']}")
    for model in args.models:
        rows = {p: step_bytes(model, p, options) for p in PRECISIONS}
        base = sum(rows["float32"].values())
        keys = sorted({(kind, role) for totals in rows.values() for kind, role, _ in totals})
        print(f"\n{model}: MB per step (float32 / 16-bit / integer elements)")
        print(f"{'graph':<10} {'role':<13}" + "".join(f" {p:>26}" for p in PRECISIONS))
        for kind, role in keys:
            cells = ["/".join(f"{rows[p][(kind, role, c)] / 1e6:.2f}" for c in ("float32", "16-bit", "integer"))
                     for p in PRECISIONS]
            print(f"{kind:<10} {role:<13}" + "".join(f" {c:>26}" for c in cells))
        for p, totals in rows.items():
            total = sum(totals.values())
            wide = sum(v for (_, _, c), v in totals.items() if c != "16-bit")
            floor = (wide + (base - wide) / 2) / base
            bound = f"  (float32 and integer {wide / 1e6:.2f} MB: floor {floor:.3f}x)" if p != "float32" else ""
            print(f"{p:<14} {total / 1e6:8.2f} MB  {total / base:.3f}x float32{bound}")


if __name__ == "__main__":
    main()
