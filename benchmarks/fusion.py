"""Fusion gain per training step: kernel launches, kernel DRAM bytes and step time, fused vs
unfused (one kernel per IR node), for each reference model, in the same run.

    python benchmarks/fusion.py --models mlp lenet resnet_mini transformer --steps 20

Appends JSON lines to benchmarks/results/<device>/fusion.jsonl (or --out) and prints a table. Step times
are medians of interleaved steps; quote ratios from one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.models import MODELS
from torch_adreno.tools.bench.measure import compare_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "fusion.jsonl")
    args = parser.parse_args()
    device = args.device
    base = {"device": device} if device is not None else {}
    context = run_context(device)
    print(f"{'model':<12} {'launches':>17} {'kernel MB':>19} {'step ms':>19}")
    print(f"{'':<12} {'unfused/fused':>17} {'unfused/fused':>19} {'unfused/fused':>19}")
    for model in args.models:
        stats = compare_variants(model, {"unfused": {**base, "fusion": False}, "fused": {**base, "fusion": True}},
                                 steps=args.steps)
        append_jsonl(args.out, [{**s.as_json(), **context, "benchmark": "fusion"} for s in stats])
        u, f = stats
        ub = (u.bytes_kernel_read or 0) + (u.bytes_kernel_written or 0)
        fb = (f.bytes_kernel_read or 0) + (f.bytes_kernel_written or 0)
        print(f"{model:<12} {u.kernel_launches:>5}/{f.kernel_launches:<5} {u.kernel_launches / f.kernel_launches:4.1f}x "
              f"{ub / 1e6:>7.1f}/{fb / 1e6:<7.1f} {ub / fb:4.1f}x "
              f"{u.median_ms:>7.1f}/{f.median_ms:<7.1f} {u.median_ms / f.median_ms:4.2f}x")


if __name__ == "__main__":
    main()
