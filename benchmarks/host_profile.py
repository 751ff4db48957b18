"""Where the host's time goes in a training step: cProfile of --steps steps after warm-up.

On a discrete GPU a small model's step is bound by the host (Dynamo guards, AOTAutograd's
wrappers, our executable's binding and enqueueing, copies), not by its kernels; this prints the
functions with the most own time, and the step's wall time next to its device time.

    python benchmarks/host_profile.py --model resnet_mini [--steps 20] [--device NVIDIA]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import device_arg

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.tools.bench.measure import _loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet_mini", choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--device", default=None, type=device_arg)
    args = parser.parse_args()
    spec = MODELS[args.model]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    options = {"device": args.device} if args.device is not None else {}
    step_loss = torch.compile(_loss, backend="adreno", options=options, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        step_loss(model, x, y).backward()
        opt.step()

    for _ in range(3):
        step()
    with torch_adreno.profile() as prof:
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    wall_ms = (time.perf_counter() - start) / args.steps * 1e3
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        step()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.rows)
    print(f"{args.model}: {wall_ms:.2f} ms per step unprofiled; one step's device time {prof.device_time_us / 1e3:.2f} ms, "
          f"{prof.kernel_launches} launches")
    print(out.getvalue())


if __name__ == "__main__":
    main()
