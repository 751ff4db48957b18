"""Training-step time of the reference models: eager PyTorch on the host vs the adreno backend,
interleaved in the same run, with the kernel and byte counts of one adreno step.

    python benchmarks/step_time.py --models mlp lenet --steps 30

Appends JSON lines to benchmarks/results/<device>/step_time.jsonl (or --out) and prints a table.
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
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "step_time.jsonl")
    args = parser.parse_args()
    device = args.device
    options = {"device": device} if device is not None else {}
    context = run_context(device)
    print(f"{'model':<12} {'eager ms':>9} {'adreno ms':>10} {'ratio':>6} {'launches':>9} {'h2d B':>10} {'d2h B':>10}")
    for model in args.models:
        eager, adreno = compare_variants(model, {"eager": "eager", "adreno": options}, steps=args.steps,
                                         optimizer=args.optimizer)
        append_jsonl(args.out, [{**s.as_json(), **context, "benchmark": "step_time", "optimizer": args.optimizer}
                                for s in (eager, adreno)])
        print(f"{model:<12} {eager.median_ms:>9.2f} {adreno.median_ms:>10.2f} {adreno.median_ms / eager.median_ms:>6.2f} "
              f"{adreno.kernel_launches:>9} {adreno.bytes_host_to_device:>10} {adreno.bytes_device_to_host:>10}")


if __name__ == "__main__":
    main()
