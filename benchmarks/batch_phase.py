"""Where the replayed step's "batch" phase goes on a device with memory of its own: the staged
batch (ResNet-18's, 16 x 3 x 224 x 224 float32 and labels, 9.6 MB) through a small model, so that
the step's kernels are short and the host phases stand out. Times each part of
``BatchInput.bind`` (the prestaged copies' wait, the write's enqueue, the seeds) with the write's
own device time, prestaged and not.

    python benchmarks/batch_phase.py [--device NVIDIA] [--steps 30] [--workload resnet18]

``--copy-threads``: the threads that copy a prestaged batch into the staging memory.
``--workload``: one of benchmarks/workloads.py's models at full size in place of the small one
(the same batch bytes, the step's own kernels behind them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import device_arg

import torch_adreno
from torch_adreno.training.replay import batch as batch_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workload", default=None, help="a benchmarks/workloads.py workload (full size)")
    parser.add_argument("--staged", action="store_true",
                        help="stage the batch (pinned copy, one write) even on a unified-memory device such as "
                             "PoCL, whose replays bind it in place: the host side of a discrete GPU's batch phase")
    parser.add_argument("--copy-threads", type=int, default=batch_module.COPY_THREADS,
                        help=f"threads copying a prestaged batch (default {batch_module.COPY_THREADS})")
    args = parser.parse_args()
    batch_module.COPY_THREADS = args.copy_threads
    if args.staged:
        from torch_adreno.training.replay import step as replay_step

        replay_step.batch_mode = lambda zero_copy, unified: replay_step.BatchMode.STAGED
    torch.manual_seed(0)
    options = {"device": args.device} if args.device else {}
    if args.staged:
        options["zero_copy"] = False  # parameters in device copies too, as on a discrete GPU
    if args.workload:
        from workloads import LR, MOMENTUM, get_workload

        work = get_workload(args.workload, False)
        model = work.make()
        x, y = work.batch()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
        train = torch_adreno.TrainingStep(model, work.loss, opt, options=options)
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 8, stride=8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(8, 10))
        x, y = torch.randn(16, 3, 224, 224), torch.randint(0, 10, (16,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        train = torch_adreno.TrainingStep(model, lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), opt,
                                          options=options)
    timings: dict[str, list[float]] = defaultdict(list)

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timings[name].append(time.perf_counter() - t)
        return wrapper

    write_events = []
    original_write = batch_module.write_buffer

    def write(*a, **k):
        event = original_write(*a, **k)
        write_events.append(event)
        return event

    batch_module.write_buffer = timed("write enqueue", write)
    cls = batch_module.BatchInput
    for name in ("settle", "bind", "upload_seeds", "prestage"):
        setattr(cls, name, timed(name, getattr(cls, name)))
    for label, prestage_bytes in (("prestaged", 1 << 20), ("inline", 1 << 62), ("prestaged", 1 << 20)):
        batch_module.PRESTAGE_BYTES = prestage_bytes
        for _ in range(5):
            float(train(x, y))
        timings.clear()
        write_events.clear()
        phases = defaultdict(list)
        steps = []
        for _ in range(args.steps):
            t = time.perf_counter()
            float(train(x, y))
            steps.append(time.perf_counter() - t)
            for p, v in train.replay.last_phases.items():
                phases[p].append(v)
        dma = []
        for e in write_events:
            try:
                dma.append((e.profile.end - e.profile.start) * 1e-9)
            except Exception:  # (a queue without profiling)
                break
        row = {"label": label, "step_ms": statistics.median(steps) * 1e3,
               **{f"phase {p} ms": statistics.median(v) * 1e3 for p, v in phases.items()},
               **{f"{n} ms": statistics.median(v) * 1e3 for n, v in timings.items()},
               "write device ms": statistics.median(dma) * 1e3 if dma else None}
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    print("replayed", train.replayed_steps, "mode", train.replay.batch_mode, "copy threads", batch_module.COPY_THREADS)


if __name__ == "__main__":
    main()
