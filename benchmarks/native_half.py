"""``native_half`` measured: float16 training with float16 values computed in ``half`` registers
(cl_khr_fp16) against the default (float registers, rounded to float16 where eager rounds), on a
device that has the extension (Intel's CPU runtime here; Adreno GPUs on phones).

Per reference model, trained in float16 (``model.half()``, plain SGD with momentum, the compiled
loop): the median step time of ``--steps`` steps after two warm-up steps, the kernels' bytes per
step, and the loss curve's largest distance from a float64 run of the same model and batches,
beside eager float16's.

    python benchmarks/native_half.py --device Intel --models mlp transformer

Appends JSON lines to benchmarks/results/<device>/native_half.jsonl (or --out).
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

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS


def train(name: str, dtype: torch.dtype, steps: int, options: dict[str, Any] | None) -> dict[str, Any]:
    """``steps`` SGD steps of model ``name`` in ``dtype``; ``options`` None: eager."""
    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.make().to(dtype)
    data = [spec.batch(torch.Generator().manual_seed(i)) for i in range(4)]
    if not spec.vocabulary:
        data = [(x.to(dtype), y) for x, y in data]
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    torch._dynamo.reset()
    forward = torch.compile(model, backend="adreno", options=options) if options is not None else model
    losses, seconds, kernel_bytes = [], [], 0
    for i in range(steps + 2):
        x, y = data[i % len(data)]
        with torch_adreno.profile() as prof:
            start = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(forward(x).float(), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            seconds.append(time.perf_counter() - start)
        kernel_bytes = prof.bytes_kernel_read + prof.bytes_kernel_written
    return {"losses": losses, "median_ms": statistics.median(seconds[2:]) * 1e3, "kernel_bytes": kernel_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=device_arg, default="Intel")
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "transformer"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "native_half.jsonl")
    args = parser.parse_args(argv)
    context = run_context(args.device)
    records = []
    for name in args.models:
        exact = train(name, torch.float64, args.steps, None)["losses"]
        eager = train(name, torch.float16, args.steps, None)
        runs = {native: train(name, torch.float16, args.steps, {"device": args.device, "native_half": native})
                for native in (False, True)}

        def distance(losses: list[float], exact: list[float] = exact) -> float:
            return max(abs(a - b) for a, b in zip(losses, exact, strict=True))

        for native, run in runs.items():
            record = {**context, "model": name, "native_half": native, "steps": args.steps,
                      "median_step_ms": round(run["median_ms"], 3), "kernel_bytes": run["kernel_bytes"],
                      "loss_distance_from_float64": distance(run["losses"]),
                      "eager_float16_distance_from_float64": distance(eager["losses"]),
                      "final_loss": run["losses"][-1]}
            records.append(record)
            print(record)
    append_jsonl(args.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
