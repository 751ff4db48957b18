"""Where a training step's device time goes: every kernel of one profiled step per reference model.

For each model, after two warm-up steps, one step (compiled loss, forward + backward, eager SGD)
runs under ``torch_adreno.profile()``; the summary table (with each kernel's achieved GB/s and
GFLOP/s against the device's roofline) is printed, and every kernel launch is appended as a JSON
line: name, kind, FX nodes, launch geometry, device time, bytes and FLOPs.

    python benchmarks/kernels.py [--models resnet_mini transformer] [--device NVIDIA]
    python benchmarks/kernels.py --target adreno740   # compiled for the target; + its projected time per kernel

With ``--target``, the kernels are compiled for that Adreno profile and each JSON line also gets
``projected_us``: the kernel on the target's roofline plus the assumed launch cost
(``torch_adreno.profiler.roofline``; not a measurement).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.profiler.roofline import project_step
from torch_adreno.targets.profiles import get_target, target_names
from torch_adreno.tools.bench.measure import _loss


def profile_step(model_name: str, options: dict[str, Any]) -> torch_adreno.profile:
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    step_loss = torch.compile(_loss, backend="adreno", options=options, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch_adreno.profile() as prof:
            step_loss(model, x, y).backward()
        opt.step()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"],
                        choices=list(MODELS))
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "kernels.jsonl")
    parser.add_argument("--target", default=None, choices=target_names(),
                        help="compile for this Adreno profile and add its projected time per kernel")
    args = parser.parse_args()
    options: dict[str, Any] = {"device": args.device} if args.device is not None else {}
    if args.target:
        options["target"] = args.target
    context = run_context(args.device)
    for model_name in args.models:
        torch._dynamo.reset()
        prof = profile_step(model_name, options)
        print(f"== {model_name}")
        print(prof.table(sort_by="device_time", row_limit=args.rows, roofline=True))
        projected = ([k.total_us for k in project_step(prof.kernels, get_target(args.target)).kernels]
                     if args.target else [None] * len(prof.kernels))
        if args.target:
            print(f"projected on {args.target}: {sum(p for p in projected if p is not None) / 1e3:.3f} ms "
                  f"for {len(projected)} launches (roofline + assumed launch cost)")
        append_jsonl(args.out, [{
            **context, "benchmark": "kernels", "model": model_name, "kernel": k.name, "kind": k.kind,
            "fx_nodes": list(k.fx_nodes), "global_size": list(k.global_size), "local_size": list(k.local_size),
            "device_time_us": k.device_time_us, "bytes_read": k.bytes_read, "bytes_written": k.bytes_written,
            "flops": k.flops, "target": args.target, "projected_us": p}
            for k, p in zip(prof.kernels, projected, strict=True)])


if __name__ == "__main__":
    main()
