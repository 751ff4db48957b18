"""What ``fill_uninitialized_memory`` costs: step time with and without it, the steps interleaved.

    python benchmarks/fill_memory.py --models mlp lenet --device Intel --steps 40

Per model, a replayed TrainingStep (fills in its launch list) and the plain compiled path
(``torch.compile`` of the loss, backward, optimizer on the host: fills in each graph call), each
with the option off and on; and the replay's fills alone (its fill operations enqueued as one
launch list and waited for) against its whole step, timed back to back, which a busy host's noise
disturbs less than the difference of two step times. Appends JSON lines to
benchmarks/results/<device>/fill_memory.jsonl (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
import torch.nn.functional as F
from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.replay.launch_list import Fill, LaunchList
from torch_adreno.tools.bench.measure import compare_variants

FILL = {"fill_uninitialized_memory": True}


def fills_alone(model_name: str, options: dict[str, Any], steps: int) -> dict[str, Any]:
    """The replayed step's fills: how many, their bytes, and the median time of enqueuing them alone
    and waiting, against the median time of the whole step (each ``steps`` times, alternating)."""
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    step = torch_adreno.TrainingStep(model, lambda m, a, b: F.cross_entropy(m(a), b),
                                     torch.optim.SGD(model.parameters(), lr=0.05), options={**options, **FILL})
    for _ in range(4):
        step(x, y)
    replay = step.replay
    assert replay is not None, "the step was not captured"
    fills = [o for o in replay._operations.operations if isinstance(o, Fill)]
    queue = replay._operations.queue
    only = LaunchList(queue, fills)

    def timed(run: Callable[[], Any]) -> float:
        start = time.perf_counter()
        run()
        queue.finish()
        return (time.perf_counter() - start) * 1e3

    fill_ms, step_ms = [], []
    for _ in range(steps):
        fill_ms.append(timed(only))
        step_ms.append(timed(lambda: step(x, y)))
    step.close()
    return {"model": model_name, "fills": len(fills), "fill_bytes": sum(f.nbytes for f in fills),
            "operations": len(replay._operations.operations) - len(fills),
            "fills_ms": statistics.median(fill_ms), "step_ms": statistics.median(step_ms)}


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
    print(f"{'model':<12} {'path':<14} {'off ms':>8} {'on ms':>8} {'overhead':>9}   (fills alone: step ms, fills ms)")
    for model in args.models:
        for path, extra in (("replay", {"training_step": True}), ("compiled", {})):
            variants = {"off": {**base, **extra}, "on": {**base, **extra, **FILL}}
            off, on = compare_variants(model, variants, steps=args.steps)
            append_jsonl(args.out, [{**s.as_json(), **context, "benchmark": "fill_memory", "path": path}
                                    for s in (off, on)])
            print(f"{model:<12} {path:<14} {off.median_ms:>8.3f} {on.median_ms:>8.3f} "
                  f"{100 * (on.median_ms / off.median_ms - 1):>8.1f}%")
        alone = fills_alone(model, base, args.steps)
        append_jsonl(args.out, [{**alone, **context, "benchmark": "fill_memory", "path": "replay fills alone"}])
        print(f"{model:<12} {'fills alone':<14} {alone['step_ms']:>8.3f} {alone['fills_ms']:>8.3f} "
              f"{100 * alone['fills_ms'] / alone['step_ms']:>8.1f}%  ({alone['fills']} fills, "
              f"{alone['fill_bytes']:,} bytes, beside {alone['operations']} operations)")


if __name__ == "__main__":
    main()
