"""TrainingStep replayed vs through the compiled graphs, per reference model, in one run:

- bit-identical: losses and parameters over --check-steps steps (a new batch each step);
- step time: --rounds rounds of --steps steps, the two variants interleaved step by step (the
  order alternating) on the same batch; the median of each round's medians, and in how many
  rounds the replay was faster (a shared machine's noise shows as disagreeing rounds); and per
  pair of adjacent steps the replayed over the full step's time (drifting load cancels out of
  a pair): their median, and how many pairs the replay won;
- host time of a replayed step split into guard / batch / enqueue loop / after (the caller's
  bookkeeping once the loss is read), with the loss read's wait beside it (device time, not
  host work), measured in the interleaved rounds and again over replayed steps back to back (as
  a training loop runs them), next to the bar of issue #14: 0.1 ms + 1.25 x the driver's own cost of one bare
  enqueue (a trivial kernel, one prebound argument, nothing else in the loop) per launch. The
  floor is measured two ways: "busy", the device running the launches meanwhile (the issue's
  measure), and "idle", the queue held by a user event so that only the enqueue is timed;
- the replay's kernels rewritten to address its arena (one argument for all the step's own
  memory) against the same replay with its kernels as compiled, alternating step by step;
- the replay's enqueue loop timed operation by operation (device held idle the same way): per
  launch, by argument count, and the flushes; and the launch list through the C loop
  (:mod:`torch_adreno.replay.launch_list`) against the Python loop, alternating step by step;
- device time and launches of one replayed step; device bytes of the step's memory: the
  replay's whole-step plan next to what the compiled graphs hold (arenas + escaping peak).

    python benchmarks/replay.py [--models mlp lenet] [--device NVIDIA] [--copy] [--rounds 5 --steps 20]

Appends JSON lines to benchmarks/results/<device>/replay.jsonl. Not a test: asserts nothing.
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

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.replay import launch_list
from torch_adreno.replay.launch_list import Flush, Launch, LaunchList
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


def _gate(context: Any, queue: cl.CommandQueue) -> cl.UserEvent:
    """Hold ``queue`` until the returned event is set complete: what is enqueued meanwhile does
    not run, so a timed loop measures the host's enqueue cost alone."""
    gate = cl.UserEvent(context)
    cl.enqueue_barrier(queue, wait_for=[gate])
    return gate


def bare_enqueue_us(runtime: Any, launches: int, repeats: int = 30) -> tuple[float, float]:
    """Host microseconds of one enqueue of a trivial kernel with one prebound argument, on a
    queue without profiling (as a replay enqueues), nothing else in the loop: the driver's own
    floor. Returns (busy: the device runs the launches meanwhile, idle: the queue held)."""
    program = cl.Program(runtime.context, "__kernel void tiny(__global float* x) { x[get_global_id(0)] += 1.0f; }").build()
    buffers = [cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, 256) for _ in range(launches)]
    kernels = []
    for buffer in buffers:
        kernel = cl.Kernel(program, "tiny")
        kernel.set_arg(0, buffer)
        kernels.append(kernel)
    queue = cl.CommandQueue(runtime.context)  # no profiling, as the replay's own queue
    results = []
    for idle in (False, True):
        times = []
        for _ in range(repeats):
            queue.finish()
            gate = _gate(runtime.context, queue) if idle else None
            start = time.perf_counter()
            for kernel in kernels:
                cl.enqueue_nd_range_kernel(queue, kernel, (64,), (64,))
            times.append(time.perf_counter() - start)
            if gate is not None:
                gate.set_status(cl.command_execution_status.COMPLETE)
        queue.finish()
        results.append(statistics.median(times) / launches * 1e6)
    return results[0], results[1]


def enqueue_breakdown(replay: Any, repeats: int = 5) -> dict[str, Any]:
    """The replay's enqueue loop timed operation by operation from Python, its queue held idle (so
    only the host's cost is timed): microseconds per launch by argument count, and all flushes
    together; and the whole list through the C loop, held idle the same way. Runs the step's
    launches again on the buffers of the last replay (the model trains on)."""
    listed = replay._operations
    queue = listed.queue
    by_args: dict[int, list[float]] = {}
    flushes: list[float] = []
    loops: list[float] = []
    kinds = [("launch", op.kernel.num_args) if isinstance(op, Launch) else
             ("flush", 0) if isinstance(op, Flush) else ("other", 0) for op in listed.operations]
    for _ in range(repeats):
        queue.finish()
        gate = _gate(replay.runtime.context, queue)
        loop_start = time.perf_counter()
        for call, (kind, nargs) in zip(listed.calls, kinds, strict=True):
            start = time.perf_counter()
            call()
            spent = time.perf_counter() - start
            if kind == "launch":
                by_args.setdefault(nargs, []).append(spent)
            elif kind == "flush":
                flushes.append(spent)
        loops.append(time.perf_counter() - loop_start)
        gate.set_status(cl.command_execution_status.COMPLETE)
    native: list[float] = []
    if listed.native:
        for _ in range(repeats):
            queue.finish()
            gate = _gate(replay.runtime.context, queue)
            start = time.perf_counter()
            listed()
            native.append(time.perf_counter() - start)
            gate.set_status(cl.command_execution_status.COMPLETE)
    queue.finish()
    launches = [t for times in by_args.values() for t in times]
    return {
        "enqueue_idle_us_per_launch": statistics.mean(launches) * 1e6 if launches else 0.0,
        "enqueue_idle_loop_us": statistics.median(loops) * 1e6,
        "enqueue_idle_flush_us": sum(flushes) / repeats * 1e6,
        "enqueue_idle_us_by_args": {n: round(statistics.mean(t) * 1e6, 2) for n, t in sorted(by_args.items())},
        "enqueue_idle_native_loop_us": statistics.median(native) * 1e6 if native else None,
    }


def native_against_python(replayed: torch_adreno.TrainingStep, x: torch.Tensor, y: torch.Tensor,
                          steps: int) -> dict[str, Any]:
    """The same replay enqueuing its list through the C loop and from Python, alternating step by
    step: host microseconds (whole step, enqueue phase) of each, medians and the paired ratio."""
    replay = replayed.replay
    assert replay is not None
    native = replay._operations
    if not native.native:
        return {"native_loop": launch_list.native_loop_status()}
    python = LaunchList(native.queue, native.operations, native=False)
    host: dict[bool, list[float]] = {True: [], False: []}
    enqueue: dict[bool, list[float]] = {True: [], False: []}
    try:
        for index in range(steps):
            for is_native in (True, False)[:: 1 if index % 2 == 0 else -1]:
                replay._operations = native if is_native else python
                replayed(x, y).item()
                host[is_native].append(replay.last_host_seconds)
                enqueue[is_native].append(replay.last_phases["enqueue"])
    finally:
        replay._operations = native
    return {
        "native_loop": launch_list.native_loop_status(),
        "native_host_us": statistics.median(host[True]) * 1e6,
        "python_loop_host_us": statistics.median(host[False]) * 1e6,
        "native_enqueue_us": statistics.median(enqueue[True]) * 1e6,
        "python_loop_enqueue_us": statistics.median(enqueue[False]) * 1e6,
        "native_over_python_paired": statistics.median(
            a / b for a, b in zip(host[True], host[False], strict=True)),
    }


class _GatedList:
    """A replay's launch list held behind a user-event barrier while it is enqueued and released
    after: the first ``open_operations`` go in ungated (the device starts on them meanwhile)."""

    def __init__(self, listed: LaunchList, context: Any, open_operations: int) -> None:
        self.context, self.queue = context, listed.queue
        self.head = LaunchList(listed.queue, listed.operations[:open_operations]) if open_operations else None
        self.tail = LaunchList(listed.queue, listed.operations[open_operations:])

    def __call__(self) -> None:
        if self.head is not None:
            self.head()
        gate = _gate(self.context, self.queue)
        self.tail()
        gate.set_status(cl.command_execution_status.COMPLETE)


#: Gate variants: how many of the list's operations go in before the gate (0: all held).
GATE_VARIANTS = {"open": None, "gated": 0, "gated_after_8": 8, "gated_after_24": 24}


def gated_against_open(replayed: torch_adreno.TrainingStep, x: torch.Tensor, y: torch.Tensor,
                       steps: int) -> dict[str, Any]:
    """The same replay with its list enqueued into the open queue (as it runs) and held behind a
    user event until all of it is in (whole, or after its first operations), alternating step by
    step, replayed steps back to back: host microseconds (whole step, enqueue phase including the
    gate and its release) and the step's wall time to its loss, medians."""
    replay = replayed.replay
    assert replay is not None
    listed = replay._operations
    variants = {label: listed if open_ops is None else _GatedList(listed, replay.runtime.context, open_ops)
                for label, open_ops in GATE_VARIANTS.items()}
    host: dict[str, list[float]] = {label: [] for label in variants}
    enqueue: dict[str, list[float]] = {label: [] for label in variants}
    wall: dict[str, list[float]] = {label: [] for label in variants}
    labels = list(variants)
    try:
        for index in range(steps):
            for label in labels[index % len(labels):] + labels[:index % len(labels)]:
                replay._operations = variants[label]
                start = time.perf_counter()
                replayed(x, y).item()
                wall[label].append(time.perf_counter() - start)
                host[label].append(replay.last_host_seconds)
                enqueue[label].append(replay.last_phases["enqueue"])
    finally:
        replay._operations = listed
    return {f"gate_{label}": {"host_us": round(statistics.median(host[label]) * 1e6, 1),
                              "enqueue_us": round(statistics.median(enqueue[label]) * 1e6, 1),
                              "wall_us": round(statistics.median(wall[label]) * 1e6, 1)} for label in labels}


PHASES = ("guard", "batch", "enqueue", "after", "loss_read")


def measure(name: str, options: dict[str, Any], rounds: int, steps: int) -> dict[str, Any]:
    x, y = MODELS[name].batch(torch.Generator().manual_seed(1))
    full = _step(name, options, replay=False)[1]
    replayed = _step(name, options, replay=True)[1]
    for _ in range(3):
        full(x, y)
        replayed(x, y)
    round_medians: dict[bool, list[float]] = {False: [], True: []}
    # Each replayed step over the full step run next to it: load that drifts on a shared machine
    # cancels out of a pair.
    paired: list[float] = []
    host: list[float] = []
    phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(rounds):
        times: dict[bool, list[float]] = {False: [], True: []}
        for index in range(steps):
            order = ((False, full), (True, replayed)) if index % 2 == 0 else ((True, replayed), (False, full))
            for is_replay, step in order:
                start = time.perf_counter()
                step(x, y).item()
                times[is_replay].append(time.perf_counter() - start)
                if is_replay:
                    assert step.replay is not None
                    host.append(step.replay.last_host_seconds)
                    for phase in PHASES:
                        phases[phase].append(step.replay.last_phases[phase])
        for is_replay in (False, True):
            round_medians[is_replay].append(statistics.median(times[is_replay]))
        paired += [r / f for f, r in zip(times[False], times[True], strict=True)]
    assert replayed.replayed_steps >= rounds * steps, "the replay did not run"
    # As a training loop runs them: replayed steps back to back (above, each follows a full step,
    # whose Python work leaves the host's caches cold for the replay's checks).
    consecutive: list[float] = []
    consecutive_phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(rounds * steps):
        replayed(x, y).item()
        assert replayed.replay is not None
        consecutive.append(replayed.replay.last_host_seconds)
        for phase in PHASES:
            consecutive_phases[phase].append(replayed.replay.last_phases[phase])
    # The replay's kernels as compiled (each operand its own argument) against the same replay with
    # kernels addressing its arena, alternating step by step.
    plain = _step(name, {**options, "replay_arena_kernels": False}, replay=True)[1]
    for _ in range(3):
        plain(x, y)
    assert plain.replay is not None and replayed.replay is not None
    by_variant: dict[str, list[float]] = {"arena": [], "plain": []}
    for index in range(rounds * steps):
        for label, step in (("arena", replayed), ("plain", plain))[:: 1 if index % 2 == 0 else -1]:
            step(x, y).item()
            assert step.replay is not None
            by_variant[label].append(step.replay.last_host_seconds)
    plain_arguments = plain.replay.kernel_arguments
    with torch_adreno.profile() as prof:
        replayed(x, y).item()
    replay = replayed.replay
    assert replay is not None and prof.replayed_steps == 1, "the replay did not run"
    host_us = statistics.median(host) * 1e6
    busy, idle = bare_enqueue_us(replay.runtime, replay.kernel_launches)
    bar_us = 100 + 1.25 * busy * replay.kernel_launches
    return {
        "model": name, "launches": replay.kernel_launches, "batch_mode": replay.batch_mode.value,
        "rounds": rounds, "steps_per_round": steps,
        "full_ms": statistics.median(round_medians[False]) * 1e3,
        "replay_ms": statistics.median(round_medians[True]) * 1e3,
        "full_ms_by_round": [round(t * 1e3, 3) for t in round_medians[False]],
        "replay_ms_by_round": [round(t * 1e3, 3) for t in round_medians[True]],
        "rounds_replay_faster": sum(r < f for f, r in zip(round_medians[False], round_medians[True], strict=True)),
        "paired_ratio_median": statistics.median(paired),
        "pairs_replay_faster": sum(ratio < 1 for ratio in paired), "pairs": len(paired),
        "replay_host_us": host_us, "replay_host_us_per_launch": host_us / replay.kernel_launches,
        **{f"replay_host_{phase}_us": statistics.median(phases[phase]) * 1e6 for phase in PHASES},
        "bare_enqueue_us": busy, "bare_enqueue_idle_us": idle,
        "host_bar_us": bar_us, "host_bar_idle_us": 100 + 1.25 * idle * replay.kernel_launches,
        "host_bar_met": host_us <= bar_us,
        "replay_host_consecutive_us": statistics.median(consecutive) * 1e6,
        **{f"replay_host_consecutive_{phase}_us": statistics.median(consecutive_phases[phase]) * 1e6
           for phase in PHASES},
        "host_bar_met_consecutive": statistics.median(consecutive) * 1e6 <= bar_us,
        "kernel_arguments": replay.kernel_arguments,
        "kernel_arguments_as_compiled": plain_arguments,
        "replay_host_arena_us": statistics.median(by_variant["arena"]) * 1e6,
        "replay_host_as_compiled_us": statistics.median(by_variant["plain"]) * 1e6,
        "arena_over_as_compiled_paired": statistics.median(
            a / b for a, b in zip(by_variant["arena"], by_variant["plain"], strict=True)),
        **enqueue_breakdown(replay),
        **native_against_python(replayed, x, y, rounds * steps),
        **gated_against_open(replayed, x, y, rounds * steps),
        "device_ms": prof.device_time_us / 1e3,
        "step_memory_planned_bytes": replay.memory.planned_bytes,
        "step_memory_full_path_bytes": replay.memory.full_path_bytes,
        "step_memory_unshared_bytes": replay.memory.unshared_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"],
                        choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="rounds of timed steps (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant and round (default 20)")
    parser.add_argument("--check-steps", type=int, default=50,
                        help="steps compared bit for bit, replayed vs not (default 50; 0 skips)")
    parser.add_argument("--device", default=None, type=device_arg, help="OpenCL device (index or name part)")
    parser.add_argument("--copy", action="store_true", help="zero_copy=False on a unified-memory device")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "replay.jsonl", help="JSON-lines file to append to")
    args = parser.parse_args()
    options: dict[str, Any] = {"device": args.device} if args.device is not None else {}
    if args.copy:
        options["zero_copy"] = False
    context = run_context(args.device)
    print(f"{'model':<12} {'launches':>8} {'full ms':>8} {'replay ms':>9} {'faster':>6} {'paired':>13} {'host us':>7} "
          f"{'bar us':>6} {'met':>5} {'bare us busy/idle':>17} {'enq us/launch idle':>18} {'flush us':>8} "
          f"{'device ms':>9} {'plan MB':>7} {'today MB':>8} identical  host us guard/batch/enqueue/after "
          f"(loss-read wait)  batch mode")
    for name in args.models:
        row = measure(name, options, args.rounds, args.steps)
        row["bit_identical"] = bit_identical(name, options, args.check_steps) if args.check_steps else None
        row["check_steps"] = args.check_steps
        append_jsonl(args.out, [{**row, **context, "options": {k: str(v) for k, v in options.items()},
                                 "unified_memory": get_runtime(args.device).profile.unified_memory,
                                 "benchmark": "replay"}])
        print(f"{name:<12} {row['launches']:>8} {row['full_ms']:>8.2f} {row['replay_ms']:>9.2f} "
              f"{row['rounds_replay_faster']:>3}/{row['rounds']:<2} "
              f"{row['paired_ratio_median']:>5.3f} {row['pairs_replay_faster']:>3}/{row['pairs']:<3} "
              f"{row['replay_host_us']:>7.0f} "
              f"{row['host_bar_us']:>6.0f} {row['host_bar_met']!s:>5} "
              f"{row['bare_enqueue_us']:>8.2f}/{row['bare_enqueue_idle_us']:<8.2f} "
              f"{row['enqueue_idle_us_per_launch']:>18.2f} {row['enqueue_idle_flush_us']:>8.0f} "
              f"{row['device_ms']:>9.3f} {row['step_memory_planned_bytes'] / 1e6:>7.2f} "
              f"{row['step_memory_full_path_bytes'] / 1e6:>8.2f} {row['bit_identical']!s:>9}  "
              f"{row['replay_host_guard_us']:.0f}/{row['replay_host_batch_us']:.0f}/{row['replay_host_enqueue_us']:.0f}/"
              f"{row['replay_host_after_us']:.0f} ({row['replay_host_loss_read_us']:.0f})  {row['batch_mode']}")
        print(f"{'':<12} consecutive replayed steps: host us {row['replay_host_consecutive_us']:.0f} "
              f"(guard/batch/enqueue/after {row['replay_host_consecutive_guard_us']:.0f}/"
              f"{row['replay_host_consecutive_batch_us']:.0f}/{row['replay_host_consecutive_enqueue_us']:.0f}/"
              f"{row['replay_host_consecutive_after_us']:.0f}), bar met: {row['host_bar_met_consecutive']}; "
              f"kernel arguments per step {row['kernel_arguments']}")
        print(f"{'':<12} kernels addressing the arena vs as compiled, alternating: host us "
              f"{row['replay_host_arena_us']:.0f} vs {row['replay_host_as_compiled_us']:.0f} "
              f"(paired ratio {row['arena_over_as_compiled_paired']:.3f}), arguments "
              f"{row['kernel_arguments']} vs {row['kernel_arguments_as_compiled']}")
        native = row["enqueue_idle_native_loop_us"]
        print(f"{'':<12} enqueue us per launch by argument count (idle, Python loop): "
              f"{row['enqueue_idle_us_by_args']}; whole list idle: Python loop {row['enqueue_idle_loop_us']:.0f} us, "
              f"C loop {'n/a' if native is None else f'{native:.0f} us'}")
        if "native_host_us" in row:
            print(f"{'':<12} C loop vs Python loop, alternating: host us {row['native_host_us']:.0f} vs "
                  f"{row['python_loop_host_us']:.0f} (enqueue {row['native_enqueue_us']:.0f} vs "
                  f"{row['python_loop_enqueue_us']:.0f}; paired ratio {row['native_over_python_paired']:.3f})")
        else:
            print(f"{'':<12} launch loop: {row['native_loop']}")
        print(f"{'':<12} open vs gated queue (host / enqueue / wall us): " + "; ".join(
            f"{label} {row[f'gate_{label}']['host_us']:.0f}/{row[f'gate_{label}']['enqueue_us']:.0f}/"
            f"{row[f'gate_{label}']['wall_us']:.0f}" for label in GATE_VARIANTS))


if __name__ == "__main__":
    main()
