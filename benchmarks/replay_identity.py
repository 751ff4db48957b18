"""Replayed steps of the reference models, bit for bit: one JSON line per model with every loss's
bits, a hash of the trained parameters and optimizer state, and the replayed step's median time.

Run once per source tree (``PYTHONPATH=<other tree>`` for another commit's) and compare the lines:
a restructuring that keeps behaviour gives the same bits, and times within the machine's noise.

    python benchmarks/replay_identity.py --steps 30 --out benchmarks/results/replay_identity.jsonl --label after
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.models import MODELS


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def run(name: str, steps: int, options: dict[str, object]) -> dict[str, object]:
    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses, times = [], []
    with torch_adreno.TrainingStep(model, _loss, opt, options) as step:
        for _ in range(steps):
            start = time.perf_counter()
            loss = step(x, y)
            bits = loss.view(torch.int32).item() if loss.dtype == torch.float32 else float(loss)
            times.append(time.perf_counter() - start)
            losses.append(bits)
        replayed = step.replayed_steps
        step.synchronize()
    digest = hashlib.sha256()
    for tensor in [*model.state_dict().values(), *(v for s in opt.state.values() for v in s.values()
                                                    if isinstance(v, torch.Tensor))]:
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return {"model": name, "steps": steps, "replayed": replayed, "loss_bits": losses,
            "state_sha256": digest.hexdigest(), "median_step_ms": statistics.median(times[2:]) * 1e3,
            "source": str(Path(torch_adreno.__file__).parent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    options = {"device": args.device} if args.device else {}
    for name in args.models:
        row = {**run(name, args.steps, options), "label": args.label}
        line = json.dumps(row)
        print(line, flush=True)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
