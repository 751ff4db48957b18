"""Kernel launches per TrainingStep step, and how many of them the optimizer's graph makes, for the
reference models with SGD (momentum) and Adam: the measure of multi-tensor optimizer grouping.

    python benchmarks/optimizer_launches.py --models mlp lenet resnet_mini transformer

Prints one row per model and optimizer: parameters, launches of a whole step, launches of the
optimizer's graph, the step's peak planned device bytes and its median time (synchronised by
reading the loss). Appends JSON lines to
benchmarks/results/<device>/optimizer_launches.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
}


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def measure(model_name: str, optimizer: str, options: dict, steps: int) -> dict:
    torch.manual_seed(0)
    spec = MODELS[model_name]
    model = spec.make()
    opt = OPTIMIZERS[optimizer](model.parameters())
    x, y = spec.batch(torch.Generator().manual_seed(0))
    with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
        for _ in range(2):  # compile, then the optimizer state exists
            step(x, y)
        with torch_adreno.profile() as prof:
            step(x, y)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step(x, y).item()
            times.append((time.perf_counter() - start) * 1e3)
    graphs: dict[str, int] = {}
    for k in prof.kernels:
        graphs[k.graph] = graphs.get(k.graph, 0) + 1
    optimizer_launches = sum(n for g, n in graphs.items() if g.startswith("inference"))
    return {"model": model_name, "optimizer": optimizer, "parameters": len(list(model.parameters())),
            "launches": prof.kernel_launches, "optimizer_launches": optimizer_launches,
            "peak_device_bytes": prof.step_peak_device_bytes(), "median_step_ms": statistics.median(times), "launches_by_graph": graphs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"])
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "optimizer_launches.jsonl")
    args = parser.parse_args()
    options = {"device": args.device} if args.device is not None else {}
    context = run_context(args.device)
    print(f"{'model':<12} {'optimizer':<9} {'params':>6} {'step launches':>13} {'optimizer launches':>18} {'peak MB':>8} {'step ms':>8}")
    for model in args.models:
        for optimizer in args.optimizers:
            row = measure(model, optimizer, options, args.steps)
            append_jsonl(args.out, [{**row, **context, "benchmark": "optimizer_launches"}])
            print(f"{model:<12} {optimizer:<9} {row['parameters']:>6} {row['launches']:>13} "
                  f"{row['optimizer_launches']:>18} {row['peak_device_bytes'] / 1e6:>8.2f} {row['median_step_ms']:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
