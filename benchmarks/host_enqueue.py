"""Host time to enqueue a replayed training step, launch by launch ("before") against the step
recorded once into the driver and returning at its loss read ("after": the defaults,
``replay_command_buffers="auto"`` and ``replay_overlap=True``), on each CPU OpenCL runtime.

Per device and model, three measurements:

- the replay (TrainingStep, unprofiled): before and after built side by side and stepped in
  interleaved blocks of 5 (a neighbour's load on a shared machine falls on both), with zero-copy as
  the device's default (unified memory: the batch bound in place before, copied into the replay's
  memory when recorded) and in copy mode (``zero_copy=False``, a device with memory of its own
  simulated: there the step returns at its loss read). Medians of ``last_phases`` (guard, batch,
  enqueue, loss_read, after) and ``last_host_seconds``, the wall time per call, the calls a step
  makes to enqueue, and the path (``ReplayedStep.enqueue_path``); then the enqueue call alone with
  the device idle before it (``enqueue_idle_ms``: on a CPU runtime the device's threads share the
  host's cores, so the in-step phases carry the device's load);
- the peers' script (``adreno_peer.py --mode trainstep``: lenet and resnet_mini, the models it
  has), run before and after through the options' environment variables: its median step time;
- the native runtime (``torch-adreno-step bench``): the exported step's device time and its
  unprofiled enqueue per step recorded and operation by operation.

Models: lenet, resnet_mini and a MobileNetV2 small config (``mobilenet_v2(num_classes=10,
width_mult=0.35)`` on 3x64x64 images, batch 8: the full network's 17 inverted residual blocks;
dropout 0.2 in the replay, 0 in the exported step, which does not export random ops).

    python benchmarks/host_enqueue.py [--devices "Intel(R) OpenCL" "Portable Computing Language"]
        [--models lenet resnet_mini mobilenet_v2] [--steps 30] [--peer-script ../shared/peers/adreno_peer.py]

Appends JSON lines to benchmarks/results/<device>/host_enqueue.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, run_context

from torch_adreno.cli.native import build_native, opencl_environment
from torch_adreno.export.data_file import save_batches
from torch_adreno.models import MODELS, mobilenet_v2
from torch_adreno.training.step import TrainingStep

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 3
BLOCK = 5
#: The configurations compared: the launch list enqueued launch by launch, waiting for the whole
#: step (what a replay did before recording), and the defaults.
CONFIGS: dict[str, dict[str, Any]] = {"before": {"replay_command_buffers": False, "replay_overlap": False},
                                      "after": {}}
ENVIRONMENT = {"before": {"TORCH_ADRENO_REPLAY_COMMAND_BUFFERS": "0", "TORCH_ADRENO_REPLAY_OVERLAP": "0"},
               "after": {}}
PHASES = ("guard", "batch", "enqueue", "loss_read", "after")


def model_parts(name: str, dropout: float = 0.2) -> tuple[Callable[[], torch.nn.Module], Callable[[Any], Any]]:
    """The model's maker and its batch maker (a generator in, (inputs, labels) out)."""
    if name == "mobilenet_v2":
        def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(8, 3, 64, 64, generator=generator), torch.randint(0, 10, (8,), generator=generator)
        return lambda: mobilenet_v2(num_classes=10, width_mult=0.35, dropout=dropout), batch
    spec = MODELS[name]
    return spec.make, spec.batch


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x), y)


def _step(name: str, device: str, options: dict[str, Any]) -> TrainingStep:
    torch.manual_seed(0)
    make, _ = model_parts(name)
    model = make()
    return TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        options={"device": device, **options})


def replay_phases(name: str, device: str, zero_copy: str | bool, steps: int) -> list[dict[str, Any]]:
    """Before and after, interleaved in blocks, each a record of medians."""
    torch._dynamo.reset()
    _, batch = model_parts(name)
    generator = torch.Generator().manual_seed(1)
    batches = [batch(generator) for _ in range(WARMUP + BLOCK)]
    runs = {label: _step(name, device, {"zero_copy": zero_copy, **config}) for label, config in CONFIGS.items()}
    samples: dict[str, list[dict[str, float]]] = {label: [] for label in runs}
    for step in runs.values():
        for x, y in batches[:WARMUP]:
            step(x.clone(), y.clone()).item()
    for block in range(-(-steps // BLOCK)):
        order = list(runs) if block % 2 == 0 else list(reversed(runs))
        for label in order:
            step = runs[label]
            for x, y in batches[WARMUP:WARMUP + BLOCK]:
                started = time.perf_counter()
                step(x.clone(), y.clone()).item()
                wall = time.perf_counter() - started
                replay = step.replay
                samples[label].append({"wall": wall, "host": replay.last_host_seconds, **replay.last_phases})
    idle = {label: enqueue_idle(step) for label, step in runs.items()}
    records = []
    for label, step in runs.items():
        replay = step.replay
        taken = samples[label][:steps]
        record: dict[str, Any] = {
            "runner": "replay", "config": label, "zero_copy": zero_copy, "steps": len(taken),
            "replayed_steps": step.replayed_steps, "launches": replay.kernel_launches,
            "enqueue_calls": replay._operations.host_calls, "batch_mode": replay.batch_mode.value,
            "enqueue_path": replay.enqueue_path,
            "wall_ms": round(statistics.median(s["wall"] for s in taken) * 1e3, 4),
            "host_ms": round(statistics.median(s["host"] for s in taken) * 1e3, 4),
            "enqueue_idle_ms": round(idle[label] * 1e3, 4)}
        for phase in PHASES:
            record[f"{phase}_ms"] = round(statistics.median(s[phase] for s in taken) * 1e3, 4)
        records.append(record)
        step.close()
    return records


def enqueue_idle(step: TrainingStep, repeats: int = 15) -> float:
    """Median seconds of the replay's enqueue call alone (its launch list, recorded or not) with the
    device idle before it: each time the queue is finished first and after. (It runs the step's
    operations again on the device's current state: the model is not used after this.)"""
    replay = step.replay
    queue = replay._operations.queue
    times = []
    for _ in range(repeats):
        queue.finish()
        started = time.perf_counter()
        replay._operations()
        times.append(time.perf_counter() - started)
        queue.finish()
    return statistics.median(times)


def peer_step_times(name: str, device: str, steps: int, script: Path) -> list[dict[str, Any]]:
    """adreno_peer.py --mode trainstep, before and after (the options' environment variables)."""
    records = []
    for label, variables in ENVIRONMENT.items():
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **variables}
        done = subprocess.run([sys.executable, str(script), "--model", name, "--mode", "trainstep", "--steps",
                               str(steps), "--device", device], capture_output=True, text=True, env=env, timeout=3600,
                              check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            records.append({"runner": "peer", "config": label, "error": (done.stderr or done.stdout)[-400:]})
            continue
        result = json.loads(lines[-1])
        records.append({"runner": "peer", "config": label, "steps": result["steps"],
                        "step_ms_median": result["step_ms_median"], "step_ms_min": result["step_ms_min"],
                        "launches": result["launches"], "device_ms": result["device_ms"]})
    return records


def native_enqueue(name: str, device: str, steps: int, work: Path, executable: Path) -> list[dict[str, Any]]:
    """The model's step exported (captured after two calls, dropout 0) with ``steps`` batches, then
    ``torch-adreno-step bench``: device time, and the enqueue recorded and operation by operation."""
    torch._dynamo.reset()
    make, batch = model_parts(name, dropout=0.0)
    torch.manual_seed(0)
    model = make()
    generator = torch.Generator().manual_seed(1)
    batches = [batch(generator) for _ in range(steps)]
    path, data = work / f"{name}.onnx", work / f"{name}.safetensors"
    with TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05)),
                      options={"device": device}) as step:
        step(*batches[0])
        step(*batches[1])
        step.export(str(path))
    save_batches(data, [tuple(t.numpy() for t in b) for b in batches])
    done = subprocess.run([str(executable), "bench", str(path), "--data", str(data), "--steps", str(steps),
                           "--warmup", str(WARMUP), "--device", device, "--cache-dir", str(work / "cache")],
                          capture_output=True, text=True, env={**os.environ, **opencl_environment()}, timeout=3600,
                          check=False)
    if done.returncode != 0:
        return [{"runner": "native", "error": done.stderr[-400:]}]
    device_ms = re.search(r"^total\s+\S+\s+([\d.]+)\s+per step", done.stdout, re.MULTILINE)
    records = []
    for enqueue, upload, wait, path_text in re.findall(
            r"^enqueue, unprofiled \(median of \d+ steps\): ([\d.]+) ms per step, upload ([\d.]+) ms, wait for the "
            r"device ([\d.]+) ms: (.*)$", done.stdout, re.MULTILINE):
        recorded = not path_text.startswith("operation by operation")
        records.append({"runner": "native", "config": "after" if recorded else "before", "steps": steps,
                        "enqueue_ms": float(enqueue), "upload_ms": float(upload), "wait_ms": float(wait),
                        "enqueue_path": path_text, "device_ms": float(device_ms.group(1)) if device_ms else None})
    if len(records) == 1:  # nothing recorded on this device: the one run is both
        records.append({**records[0], "config": "after"})
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs="+", default=["Intel(R) OpenCL", "Portable Computing Language"])
    parser.add_argument("--models", nargs="+", default=["lenet", "resnet_mini", "mobilenet_v2"],
                        choices=["lenet", "resnet_mini", "mobilenet_v2", *MODELS])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--peer-script", type=Path, default=ROOT.parent / "shared" / "peers" / "adreno_peer.py",
                        help="the peers' adreno_peer.py (default: ../shared/peers from the repository root)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["replay", "peer", "native"])
    args = parser.parse_args()
    built = build_native() if "native" not in args.skip else None
    with tempfile.TemporaryDirectory() as work:
        for device in args.devices:
            context = run_context(device)
            for name in args.models:
                records: list[dict[str, Any]] = []
                if "replay" not in args.skip:
                    for zero_copy in ("auto", False):
                        records += replay_phases(name, device, zero_copy, args.steps)
                if "peer" not in args.skip and name in ("lenet", "resnet_mini") and args.peer_script.is_file():
                    records += peer_step_times(name, device, args.steps, args.peer_script)
                if built is not None:
                    records += native_enqueue(name, device, args.steps, Path(work), built.executable)
                records = [{"benchmark": "host_enqueue", "model": name, **context, **r} for r in records]
                for record in records:
                    print(json.dumps(record), flush=True)
                append_jsonl(RESULTS / DEVICE / "host_enqueue.jsonl", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
