"""What ``fill_uninitialized_memory`` costs: step time with and without it, the steps interleaved.

    python benchmarks/fill_memory.py --models mlp lenet --device Intel --steps 40

Per model, a replayed TrainingStep (fills in its launch list) and the plain compiled path
(``torch.compile`` of the loss, backward, optimizer on the host: fills in each graph call), each
with the option off and on. Appends JSON lines to benchmarks/results/<device>/fill_memory.jsonl
(or --out) and prints a table with the fills' share of the step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.tools.bench.measure import compare_variants

FILL = {"fill_uninitialized_memory": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet"])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant (default 40)")
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "fill_memory.jsonl")
    args = parser.parse_args()
    base = {"device": args.device} if args.device is not None else {}
    context = run_context(args.device)
    print(f"{context['device']} ({context['platform']}), {args.steps} steps per variant")
    print(f"{'model':<12} {'path':<14} {'off ms':>8} {'on ms':>8} {'overhead':>9}")
    for model in args.models:
        for path, extra in (("replay", {"training_step": True}), ("compiled", {})):
            variants = {"off": {**base, **extra}, "on": {**base, **extra, **FILL}}
            off, on = compare_variants(model, variants, steps=args.steps)
            append_jsonl(args.out, [{**s.as_json(), **context, "benchmark": "fill_memory", "path": path}
                                    for s in (off, on)])
            print(f"{model:<12} {path:<14} {off.median_ms:>8.3f} {on.median_ms:>8.3f} "
                  f"{100 * (on.median_ms / off.median_ms - 1):>8.1f}%")


if __name__ == "__main__":
    main()
