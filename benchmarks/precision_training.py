"""Loss curves of 50 training steps per precision vs a float64 run: the accuracy rule of issue 15.

For each model and precision (float16 autocast + GradScaler, bfloat16 autocast, and an
all-float16 mlp): eager float64, eager in that precision, and compiled with the adreno backend,
from the same weights over the same batches (``tests/half_training.py``). Prints the mean
absolute distance of each loss curve from float64's, ours / eager's (the rule: at most 2), the
host fallbacks and skipped (overflowing) steps, and the median compiled step time.

    python benchmarks/precision_training.py --steps 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context
from half_training import distance, train

CASES = [(m, p) for m in ("mlp", "lenet", "resnet_mini", "transformer") for p in ("fp16_autocast", "bf16_autocast")]
CASES.append(("mlp", "half"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "precision_training.jsonl")
    args = parser.parse_args()
    options = {"device": args.device} if args.device is not None else {}
    context = run_context(args.device)
    print(f"{'model':<12} {'precision':<14} {'eager dist':>10} {'ours dist':>10} {'ratio':>6} {'fallbacks':>9} "
          f"{'skipped e/o':>11} {'step ms':>8}")
    for model, precision in CASES:
        if args.models and model not in args.models:
            continue
        reference = train(model, "float64", args.steps, compiled=False)
        eager = train(model, precision, args.steps, compiled=False)
        ours = train(model, precision, args.steps, compiled=True, options=options)
        d_eager, d_ours = distance(eager.losses, reference.losses), distance(ours.losses, reference.losses)
        step_ms = 1e3 * statistics.median(ours.step_seconds[2:])
        print(f"{model:<12} {precision:<14} {d_eager:>10.2e} {d_ours:>10.2e} {d_ours / d_eager:>6.2f} "
              f"{ours.host_fallback_ops:>9} {eager.skipped_steps:>5}/{ours.skipped_steps:<5} {step_ms:>8.1f}", flush=True)
        append_jsonl(args.out, [{**context, "benchmark": "precision_training", "model": model, "precision": precision,
                                 "steps": args.steps, "eager_distance": d_eager, "ours_distance": d_ours,
                                 "ratio": d_ours / d_eager, "host_fallback_ops": ours.host_fallback_ops,
                                 "step_ms_median": step_ms, "losses": ours.losses, "eager_losses": eager.losses,
                                 "float64_losses": reference.losses}])


if __name__ == "__main__":
    main()
