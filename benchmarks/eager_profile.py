"""Where PyTorch's eager CUDA step spends the GPU's time: one step of a workload under
``torch.profiler``, its CUDA kernels grouped by name (the peer's side of ``workloads.py``'s
per-op breakdown of ours).

    python benchmarks/eager_profile.py --workloads gpt2_lora resnet18 [--rows 30]

Appends JSON lines (kernel name, calls, CUDA microseconds) to benchmarks/results/<device>/eager_profile.jsonl.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, run_context
from workloads import LR, MOMENTUM, WORKLOADS, get_workload


def profile_step(name: str) -> list[dict[str, Any]]:
    """The CUDA kernels of one eager step of workload ``name`` (after three warm-up steps), by name."""
    work = get_workload(name, small=False)
    model = work.make().cuda()
    x, y = (t.cuda() for t in work.batch())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = work.loss(model, x, y)
        loss.backward()
        opt.step()
        loss.item()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time)
    return sorted(({"kernel": k, "calls": len(v), "us": sum(v)} for k, v in kernels.items()), key=lambda r: -r["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "eager_profile.jsonl")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("eager_profile needs CUDA: it profiles PyTorch's own GPU step")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    for name in args.workloads:
        rows = profile_step(name)
        total = sum(float(r["us"]) for r in rows)
        append_jsonl(args.out, [{**run_context(None), "benchmark": "eager_profile", "workload": name,
                                 "cuda_us": total, "kernels": rows}])
        print(f"{name}: {total / 1e3:.2f} ms of CUDA kernels in one step, {sum(int(r['calls']) for r in rows)} launches")
        for r in rows[:args.rows]:
            print(f"  {float(r['us']):9.1f} us {int(r['calls']):4d}x  {str(r['kernel'])[:110]}")

if __name__ == "__main__":
    main()
