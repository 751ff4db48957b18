"""What the read trap of a copy-mode TrainingStep costs the host code running between steps.

Between a step and the next sync point, ``runtime/host_sync.SyncOnFirstTouch`` (a torch function
mode) sees every torch call of the thread. This times one small eager op (``a.add(b)`` on 4
elements, where the per-call cost is all there is) with no mode, with a pass-through mode (what
any mode costs in PyTorch), with ours armed after a real step, and with ours disarmed but still
on the stack (after it synchronized from inside its own handler). Best of several rounds.

    python benchmarks/host_sync_overhead.py

Appends JSON lines to benchmarks/results/host_sync_overhead.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, run_context

import torch_adreno
from torch_adreno.training import host_sync


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _per_op_us(calls: int, rounds: int) -> float:
    a, b = torch.randn(4), torch.randn(4)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            a.add(b)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="ops per round (default: 20000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, best taken (default: 7)")
    parser.add_argument("--out", type=Path, default=RESULTS / "host_sync_overhead.jsonl",
                        help="JSON lines appended here (default: %(default)s)")
    args = parser.parse_args()

    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt,
                                     options={"zero_copy": False})
    step(torch.randn(16, 12), torch.randint(0, 5, (16,)))

    results: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        results["armed"] = _per_op_us(args.calls, args.rounds)  # the step left the mode armed
        assert host_sync.is_armed(step._residency)
        model[0].weight.sum()  # first read: synchronizes, the mode stays on the stack disarmed
        results["disarmed_on_stack"] = _per_op_us(args.calls, args.rounds)
        step.synchronize()  # off the stack
        results["no_mode"] = _per_op_us(args.calls, args.rounds)
        stack.enter_context(_PassThrough())
        results["pass_through_mode"] = _per_op_us(args.calls, args.rounds)
    step.close()
    for name, us in results.items():
        print(f"{name:>20}: {us:6.2f} us/op  (+{us - results['no_mode']:.2f})")
    append_jsonl(args.out, [{**run_context(None), "benchmark": "host_sync_overhead",
                             **{f"{k}_us": round(v, 3) for k, v in results.items()}}])


if __name__ == "__main__":
    main()
