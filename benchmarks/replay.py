"""TrainingStep replayed vs through the compiled graphs, per reference model, in one run:

- bit-identical: losses and parameters over --check-steps steps (a new batch each step);
- step time: median of --steps steps, the two interleaved on the same batch;
- host time of a replayed step, per launch, next to the driver's own cost of one bare enqueue
  with prebound arguments (a trivial kernel, the same number of launches);
- device time and launches of one replayed step; device bytes of the step's memory: the
  replay's whole-step plan next to what the compiled graphs hold (arenas + escaping peak).

    python benchmarks/replay.py [--models mlp lenet] [--device NVIDIA] [--copy]

Appends JSON lines to benchmarks/results/replay.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyopencl as cl
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.runtime import get_runtime


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _step(name: str, options: dict[str, Any], replay: bool) -> tuple[torch.nn.Module, torch_adreno.TrainingStep]:
    torch._dynamo.reset()  # each step compiles its own optimizer's step: stay below the recompile limit
    torch.manual_seed(0)
    model = MODELS[name].make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, torch_adreno.TrainingStep(model, _loss, opt, options=options, replay=replay)


def bit_identical(name: str, options: dict[str, Any], steps: int) -> bool:
    results = []
    for replay in (False, True):
        model, step = _step(name, options, replay)
        generator = torch.Generator().manual_seed(1)
        losses = [step(*MODELS[name].batch(generator)) for _ in range(steps)]
        step.synchronize()
        results.append((torch.stack(losses), [t.clone() for t in model.state_dict().values()]))
    (a, pa), (b, pb) = results
    return torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))


def bare_enqueue_us(runtime: Any, launches: int, repeats: int = 30) -> float:
    """Host microseconds of one enqueue of a trivial kernel with prebound arguments, on a queue
    without profiling (as a replay enqueues): the driver's own floor."""
    program = cl.Program(runtime.context, "__kernel void tiny(__global float* x) { x[get_global_id(0)] += 1.0f; }").build()
    buffers = [cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 256) for _ in range(launches)]
    kernels = []
    for buffer in buffers:
        kernel = cl.Kernel(program, "tiny")
        kernel.set_arg(0, buffer)
        kernels.append(kernel)
    queue = cl.CommandQueue(runtime.context)  # no profiling, as the replay's own queue
    times = []
    for _ in range(repeats):
        queue.finish()
        start = time.perf_counter()
        for kernel in kernels:
            cl.enqueue_nd_range_kernel(queue, kernel, (64,), (64,))
        times.append(time.perf_counter() - start)
    queue.finish()
    return statistics.median(times) / launches * 1e6


def measure(name: str, options: dict[str, Any], steps: int) -> dict[str, Any]:
    x, y = MODELS[name].batch(torch.Generator().manual_seed(1))
    full = _step(name, options, replay=False)[1]
    replayed = _step(name, options, replay=True)[1]
    for _ in range(3):
        full(x, y)
        replayed(x, y)
    times: dict[bool, list[float]] = {False: [], True: []}
    host: list[float] = []
    phases: list[tuple[float, float, float]] = []
    for _ in range(steps):
        for replay, step in ((False, full), (True, replayed)):
            start = time.perf_counter()
            step(x, y).item()
            times[replay].append(time.perf_counter() - start)
        assert replayed.replay is not None
        host.append(replayed.replay.last_host_seconds)
        phases.append(replayed.replay.last_phase_seconds)
    with torch_adreno.profile() as prof:
        replayed(x, y).item()
    replay = replayed.replay
    assert replay is not None and prof.replayed_steps == 1, "the replay did not run"
    host_us = statistics.median(host) * 1e6
    return {
        "model": name, "launches": replay.kernel_launches,
        "full_ms": statistics.median(times[False]) * 1e3, "replay_ms": statistics.median(times[True]) * 1e3,
        "replay_host_us": host_us, "replay_host_us_per_launch": host_us / replay.kernel_launches,
        "bare_enqueue_us": bare_enqueue_us(replay.runtime, replay.kernel_launches),
        "replay_host_checks_us": statistics.median(p[0] for p in phases) * 1e6,
        "replay_host_batch_us": statistics.median(p[1] for p in phases) * 1e6,
        "replay_host_enqueue_us": statistics.median(p[2] for p in phases) * 1e6,
        "device_ms": prof.device_time_us / 1e3,
        "step_memory_planned_bytes": replay.memory.planned_bytes,
        "step_memory_full_path_bytes": replay.memory.full_path_bytes,
        "step_memory_unshared_bytes": replay.memory.unshared_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"],
                        choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant (default 30)")
    parser.add_argument("--check-steps", type=int, default=50,
                        help="steps compared bit for bit, replayed vs not (default 50; 0 skips)")
    parser.add_argument("--device", default=None, type=device_arg, help="OpenCL device (index or name part)")
    parser.add_argument("--copy", action="store_true", help="zero_copy=False on a unified-memory device")
    parser.add_argument("--out", type=Path, default=RESULTS / "replay.jsonl", help="JSON-lines file to append to")
    args = parser.parse_args()
    options: dict[str, Any] = {"device": args.device} if args.device is not None else {}
    if args.copy:
        options["zero_copy"] = False
    context = run_context(args.device)
    print(f"{'model':<12} {'launches':>8} {'full ms':>8} {'replay ms':>9} {'host us/launch':>14} "
          f"{'bare us':>7} {'device ms':>9} {'plan MB':>7} {'today MB':>8} identical  host us: checks/batch/enqueue")
    for name in args.models:
        row = measure(name, options, args.steps)
        row["bit_identical"] = bit_identical(name, options, args.check_steps) if args.check_steps else None
        row["check_steps"] = args.check_steps
        append_jsonl(args.out, [{**row, **context, "options": {k: str(v) for k, v in options.items()},
                                 "unified_memory": get_runtime(args.device).profile.unified_memory,
                                 "benchmark": "replay"}])
        print(f"{name:<12} {row['launches']:>8} {row['full_ms']:>8.2f} {row['replay_ms']:>9.2f} "
              f"{row['replay_host_us_per_launch']:>14.2f} {row['bare_enqueue_us']:>7.2f} {row['device_ms']:>9.3f} "
              f"{row['step_memory_planned_bytes'] / 1e6:>7.2f} {row['step_memory_full_path_bytes'] / 1e6:>8.2f} "
              f"{row['bit_identical']!s:>9}  {row['replay_host_checks_us']:.0f}/{row['replay_host_batch_us']:.0f}/"
              f"{row['replay_host_enqueue_us']:.0f}")


if __name__ == "__main__":
    main()
