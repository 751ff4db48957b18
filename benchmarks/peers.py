"""Training-step time of the reference models on one machine: torch_adreno (OpenCL) next to
PyTorch's own paths — eager on the host CPU, eager CUDA and torch.compile (inductor) CUDA where a
CUDA device exists — and tinygrad where it is installed.

    python benchmarks/peers.py --steps 30

Medians of --steps steps after warm-up; appends JSON lines to benchmarks/results/peers.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, run_context

from torch_adreno.benchmark import compare_variants
from torch_adreno.models import MODELS


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x), y)


def cuda_step_times(model_name: str, steps: int, compiled: bool) -> dict[str, Any]:
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make().cuda()
    x, y = (t.cuda() for t in spec.batch(torch.Generator().manual_seed(0)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.compile(_loss) if compiled else _loss
    start = time.perf_counter()
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()
        opt.step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return {"model": model_name, "variant": "inductor CUDA" if compiled else "eager CUDA",
            "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "steps": steps, "warmup_s": warmup_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "peers.jsonl")
    args = parser.parse_args()
    device = int(args.device) if args.device is not None and args.device.isdigit() else args.device
    base = {"device": device} if device is not None else {}
    context = run_context(device)
    try:
        import tinygrad  # noqa: F401
        print("tinygrad is installed, but its reference-model ports are not part of this suite yet")
    except ImportError:
        print("tinygrad: not installed, skipped")
    print(f"{'model':<12} {'variant':<28} {'median ms':>10}")
    for model in args.models:
        rows = [s.as_json() for s in compare_variants(model, {"eager CPU": "eager", "adreno": base}, steps=args.steps)]
        if torch.cuda.is_available():
            rows.append(cuda_step_times(model, args.steps, compiled=False))
            rows.append(cuda_step_times(model, args.steps, compiled=True))
        else:
            print("CUDA: not available, skipped")
        append_jsonl(args.out, [{**r, **context, "benchmark": "peers"} for r in rows])
        for r in rows:
            print(f"{model:<12} {r['variant']:<28} {r['median_ms']:>10.2f}")


if __name__ == "__main__":
    main()
