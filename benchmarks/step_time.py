"""Training-step time of the reference models: eager PyTorch vs the adreno backend, same run.

Writes one JSON line per (model, variant) to benchmarks/results/step_time.jsonl (or --out) and
prints a table. Timings are medians of --steps steps; compare ratios within one run only.

    python benchmarks/step_time.py --models mlp lenet --steps 30
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import torch

from torch_adreno.benchmark import measure_training_step
from torch_adreno.runtime import get_runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "step_time.jsonl"))
    args = parser.parse_args()
    options = {"device": args.device} if args.device is not None else {}
    device = get_runtime(args.device).profile
    context = {"date": datetime.date.today().isoformat(), "device": device.name, "driver": device.driver,
               "torch": torch.__version__, "host": platform.node(), "threads": torch.get_num_threads()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<8} {'variant':<8} {'median ms':>10} {'min':>8} {'max':>8} {'launches':>9} "
          f"{'h2d B':>10} {'d2h B':>10}")
    with out.open("a") as f:
        for model in args.models:
            for variant in ("eager", "adreno"):
                torch._dynamo.reset()
                stats = measure_training_step(model, variant, steps=args.steps, options=options,
                                              optimizer=args.optimizer)
                record = {**stats.as_json(), **context, "optimizer": args.optimizer}
                f.write(json.dumps(record) + "\n")
                print(f"{model:<8} {variant:<8} {stats.median_ms:>10.2f} {stats.min_ms:>8.2f} {stats.max_ms:>8.2f} "
                      f"{stats.kernel_launches or '':>9} {stats.bytes_host_to_device or '':>10} "
                      f"{stats.bytes_device_to_host or '':>10}")


if __name__ == "__main__":
    main()
