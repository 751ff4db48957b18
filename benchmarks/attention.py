"""Fused attention (``kernels/attention.cl``) against the decomposed path (matrix products and a
softmax with the queries x keys scores in device memory), forward and backward, at GPT-2's shapes.

For each sequence length: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on
[batch, heads, seq, head_dim] tensors, compiled by the adreno backend twice: fused (the default)
and decomposed (the backend option ``fused_attention=False``). Each call runs the
forward and the backward of ``sum(out * grad)``; per pass, the median over ``--reps`` calls of the
device time of its kernels (OpenCL profiling events), the kernel bytes (global memory each launch
must move, as the kernels stage counts them) and the launches (fused ones among them); the largest
deviation from eager on the host (float32) is recorded too. One JSON line
per (seq, path) is printed as it is measured and appended to benchmarks/results/<device>/attention.jsonl.

    python benchmarks/attention.py [--device NVIDIA] [--seqs 256 512 1024] [--batch 4] [--heads 12]
                                   [--head-dim 64] [--reps 5] [--dtype float32|float16|bfloat16]
                                   [--forward-blocking 64,32,4,2 32,32,4,2 ...]
                                   [--backward-blocking 32,32,4,2 32,16,2,2 ...]

A blocking is rows,cols,micro_rows,micro_cols (``kernels/attention.py``'s AttentionBlocks: rows a
work-group owns, streamed rows per step, the scores of one work-item); each pair of the given
forward and backward blockings is measured as its own fused path (a tuning sweep), the default
being the backend's own choice.

Self-contained: any OpenCL device, nothing downloaded; on a CPU device (PoCL) use small --seqs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.kernels import attention as attention_kernels

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _pass_of(graph: str) -> str:
    return "backward" if graph.startswith("backward") else "forward"


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    if leaf.grad is None:
        raise RuntimeError("the backward left an input without a gradient")
    return leaf.grad


def _blocking(text: str) -> tuple[int, int, int, int]:
    try:
        rows, cols, micro_rows, micro_cols = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"blocking {text!r}: expected rows,cols,micro_rows,micro_cols "
                                         "(four integers, e.g. 64,32,4,2)") from None
    attention_kernels.AttentionBlocks(rows, cols, micro_rows, micro_cols)  # (refuses a micro-tile that does not divide)
    return rows, cols, micro_rows, micro_cols


@contextlib.contextmanager
def blockings(forward: tuple[int, int, int, int] | None,
              backward: tuple[int, int, int, int] | None) -> Iterator[None]:
    """The fused kernels built with the given blockings only (None: the backend's list)."""
    saved = attention_kernels.FORWARD_BLOCKINGS, attention_kernels.BACKWARD_BLOCKINGS
    if forward is not None:
        attention_kernels.FORWARD_BLOCKINGS = (forward,)
    if backward is not None:
        attention_kernels.BACKWARD_BLOCKINGS = (backward,)
    try:
        yield
    finally:
        attention_kernels.FORWARD_BLOCKINGS, attention_kernels.BACKWARD_BLOCKINGS = saved


def measure(path: str, inputs: list[torch.Tensor], grad: torch.Tensor, device: Any, reps: int) -> dict[str, Any]:
    """Median device time, kernel bytes and launches per pass over ``reps`` calls of one path."""
    torch._dynamo.reset()
    options = {"compile_cache": False, "fused_attention": path != "decomposed",
               **({"device": device} if device is not None else {})}
    compiled = torch.compile(_attention, backend="adreno", options=options, dynamic=False)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    per_pass: dict[str, dict[str, list[float]]] = {}
    out = compiled(*leaves)  # (compiles the forward)
    out.backward(grad)       # (and the backward)
    for _ in range(reps):
        for t in leaves:
            t.grad = None
        with torch_adreno.profile() as prof:
            out = compiled(*leaves)
            out.backward(grad)
        for name in ("forward", "backward"):
            kernels = [k for k in prof.kernels if _pass_of(k.graph) == name]
            record = per_pass.setdefault(name, {"device_us": [], "bytes": [], "launches": [], "fused": []})
            record["device_us"].append(sum(k.device_time_us or 0.0 for k in kernels))
            record["bytes"].append(sum(k.bytes_read + k.bytes_written for k in kernels))
            record["launches"].append(len(kernels))
            record["fused"].append(sum(1 for k in kernels if k.kind == "attention"))
    reference = [t.detach().clone().float().requires_grad_() for t in inputs]
    expected = _attention(*reference)
    expected.backward(grad.float())
    deviation = max((out.detach().float() - expected.detach()).abs().max().item(),
                    *((_grad(a).float() - _grad(b)).abs().max().item() for a, b in zip(leaves, reference, strict=True)))
    result: dict[str, Any] = {"path": path, "max_abs_deviation_from_eager": deviation}
    for name, record in per_pass.items():
        result[f"{name}_device_ms"] = statistics.median(record["device_us"]) / 1e3
        result[f"{name}_kernel_mb"] = statistics.median(record["bytes"]) / 1e6
        result[f"{name}_launches"] = int(statistics.median(record["launches"]))
        result[f"{name}_fused_launches"] = int(statistics.median(record["fused"]))
    result["step_device_ms"] = result["forward_device_ms"] + result["backward_device_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="index or name substring (python -m torch_adreno devices)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--forward-blocking", type=_blocking, nargs="+", default=[None],
                        help="rows,cols,micro_rows,micro_cols of the forward kernel (several: a sweep)")
    parser.add_argument("--backward-blocking", type=_blocking, nargs="+", default=[None],
                        help="rows,cols,micro_rows,micro_cols of the dQ and dK/dV kernels (several: a sweep)")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "attention.jsonl")
    args = parser.parse_args()
    device = device_arg(args.device)
    context = run_context(device)
    generator = torch.Generator().manual_seed(0)
    dtype = DTYPES[args.dtype]
    for seq in args.seqs:
        shape = (args.batch, args.heads, seq, args.head_dim)
        inputs = [torch.randn(shape, generator=generator).to(dtype) for _ in range(3)]
        grad = torch.randn(shape, generator=generator).to(dtype)
        scores_mb = args.batch * args.heads * seq * seq * 4 / 1e6
        base = {**context, "benchmark": "attention", "batch": args.batch, "heads": args.heads, "seq": seq,
                "head_dim": args.head_dim, "dtype": args.dtype, "causal": True, "reps": args.reps,
                "scores_mb_float32": scores_mb}
        decomposed = {**base, **measure("decomposed", inputs, grad, device, args.reps)}
        print(json.dumps(decomposed), flush=True)
        append_jsonl(args.out, [decomposed])
        for forward_blocking in args.forward_blocking:
            for backward_blocking in args.backward_blocking:
                with blockings(forward_blocking, backward_blocking):
                    fused = {**base, "forward_blocking": forward_blocking, "backward_blocking": backward_blocking,
                             **measure("fused", inputs, grad, device, args.reps)}
                print(json.dumps(fused), flush=True)
                append_jsonl(args.out, [fused])
                print(f"# seq {seq}, blocking forward {forward_blocking or 'default'} backward "
                      f"{backward_blocking or 'default'}: forward {fused['forward_device_ms']:.3f} ms vs decomposed "
                      f"{decomposed['forward_device_ms']:.3f}, backward {fused['backward_device_ms']:.3f} vs "
                      f"{decomposed['backward_device_ms']:.3f}; step {fused['step_device_ms']:.3f} ms vs "
                      f"{decomposed['step_device_ms']:.3f} "
                      f"({decomposed['step_device_ms'] / fused['step_device_ms']:.2f}x); kernel bytes "
                      f"{fused['forward_kernel_mb'] + fused['backward_kernel_mb']:.1f} MB vs "
                      f"{decomposed['forward_kernel_mb'] + decomposed['backward_kernel_mb']:.1f} MB", flush=True)

if __name__ == "__main__":
    main()
