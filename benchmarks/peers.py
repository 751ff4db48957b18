"""Training-step time of the reference models on one machine: torch_adreno (OpenCL) next to
PyTorch's own paths — eager on the host CPU, eager CUDA and torch.compile (inductor) CUDA where a
CUDA device exists — and tinygrad where it is installed.

    python benchmarks/peers.py --steps 30

Medians of --steps steps after warm-up; appends JSON lines to benchmarks/results/<device>/peers.jsonl.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.models import MODELS
from torch_adreno.tools.bench.measure import compare_variants, cuda_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"],
                        choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "peers.jsonl")
    args = parser.parse_args()
    device = args.device
    base = {"device": device} if device is not None else {}
    context = run_context(device)
    try:
        import tinygrad  # noqa: F401
        print("tinygrad is installed, but its reference-model ports are not part of this suite yet")
    except ImportError:
        print("tinygrad: not installed, skipped")
    print(f"{'model':<12} {'variant':<28} {'median ms':>10} {'launches':>8} {'device ms':>9}")
    for model in args.models:
        variants = {"eager CPU": "eager", "adreno": base, "adreno device-opt": {**base, "optimizer_on_device": True},
                    "adreno TrainingStep": {**base, "training_step": True, "replay": False},
                    "adreno TrainingStep replayed": {**base, "training_step": True}}
        rows = [s.as_json() for s in compare_variants(model, variants, steps=args.steps)]
        if torch.cuda.is_available():
            rows += [stats.as_json() for compiled in (False, True)
                     if (stats := cuda_step(model, args.steps, compiled)) is not None]
        else:
            print("CUDA: not available, skipped")
        append_jsonl(args.out, [{**r, **context, "benchmark": "peers"} for r in rows])
        for r in rows:
            launches, device_ms = r.get("kernel_launches"), r.get("device_time_ms")
            print(f"{model:<12} {r['variant']:<28} {r['median_ms']:>10.2f} {launches if launches is not None else '':>8} "
                  f"{f'{device_ms:.3f}' if device_ms is not None else '':>9}")


if __name__ == "__main__":
    main()
