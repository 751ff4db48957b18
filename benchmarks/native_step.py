"""Step time of one exported training step in its three runners on one device, measured in one
process with their steps interleaved: the in-PyTorch replay (TrainingStep), the torch-free Python
runner (torch_adreno.runner) and the native runtime (native/, its library through ctypes: the same
C code as ``torch-adreno-step train``). Each round runs one step of each runner, in an order that
rotates from round to round, so that a neighbour's load on a shared machine (CI's 2 cores) falls on
all three alike; the medians are over the rounds after warm-up. The native runtime's phases (batch
upload, enqueue, wait for the device: tas_step_last_phases) say where its time goes. Then, not
interleaved, ``torch-adreno-step train``'s own median for reference.

    python benchmarks/native_step.py [--models digits lenet resnet_mini mlp] [--device "Intel(R) OpenCL"]
                                     [--steps 30]

Appends JSON lines to benchmarks/results/<device>/native_step.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, run_context

from torch_adreno.cli import main as cli_main
from torch_adreno.cli.native import build_native, opencl_environment
from torch_adreno.data import digits_split
from torch_adreno.export.data_file import load_batches
from torch_adreno.models import MODELS, LeNet
from torch_adreno.remote import NativeStep
from torch_adreno.runner import StepRunner, choose_device
from torch_adreno.training.optimizers import make_optimizer
from torch_adreno.training.step import TrainingStep

WARMUP = 3


def interleaved(runners: dict[str, Callable[[int], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each runner's step per round after warm-up; round i runs step i of each runner,
    starting with a different runner each round."""
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(WARMUP + rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            start = time.perf_counter()
            runners[name](i)
            if i >= WARMUP:
                times[name].append(time.perf_counter() - start)
    return times


def native_cli_median(executable: Path, path: Path, data: Path, device: str, steps: int, cache: Path) -> float:
    env = dict(os.environ, **opencl_environment())
    command = [str(executable), "train", str(path), "--data", str(data), "--steps", str(WARMUP + steps), "--out",
               str(path.with_suffix(".state.safetensors")), "--device", device, "--cache-dir", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    times = [float(t) for t in re.findall(r"^step \d+ loss \S+ time (\S+) ms", done.stdout, re.MULTILINE)]
    return statistics.median(times[WARMUP:])


@dataclass(frozen=True)
class ExportedStep:
    """A reference model's training step exported (``python -m torch_adreno export``, SGD, lr 0.05)
    with a data file of ``steps`` batches: the file, the data, and batch ``i`` (in turn) as arrays."""

    path: Path
    data: Path
    batches: dict[str, Any]

    def row(self, i: int) -> list[Any]:
        names = sorted(self.batches)
        return [self.batches[name][i % len(self.batches[names[0]])] for name in names]


def export_step(model: str, device: str, steps: int, work: Path) -> ExportedStep:
    torch._dynamo.reset()  # (each model's export and replay compile optimizers of their own)
    path, data = work / f"{model}.onnx", work / f"{model}.safetensors"
    assert cli_main(["export", str(path), "--model", model, "--lr", "0.05", "--device", device,
                     "--data-out", str(data), "--data-steps", str(steps)]) == 0
    torch._dynamo.reset()
    return ExportedStep(path, data, load_batches(data))


def training_step(model: str, options: dict[str, Any]) -> TrainingStep:
    """The exported step's model and optimizer, fresh, as a TrainingStep with ``options``."""
    module = (LeNet if model == "digits" else MODELS[model].make)()
    optimizer = make_optimizer("sgd", module.parameters(), lr=torch.tensor(0.05))

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    return TrainingStep(module, loss_fn, optimizer, options)


def measure(model: str, device: str, steps: int, work: Path, library: Path, executable: Path) -> dict[str, Any]:
    exported = export_step(model, device, steps, work)
    path, data, row = exported.path, exported.data, exported.row
    runner = StepRunner.load(path, choose_device(device))
    phases: list[dict[str, float]] = []
    with training_step(model, {"device": device}) as replay, \
            NativeStep(library, path, device=device, cache_dir=work / "cache") as native:
        def native_step(i: int) -> None:
            native.step(*row(i))
            if i >= WARMUP:
                phases.append(native.last_phases())

        times = interleaved({
            "replay": lambda i: replay(*(torch.from_numpy(a) for a in row(i))).item(),
            "python_runner": lambda i: runner.step(*row(i)),
            "native": native_step,
        }, steps)
        assert replay.replayed_steps >= steps
    record: dict[str, Any] = {f"{name}_ms": round(statistics.median(t) * 1e3, 3) for name, t in times.items()}
    record["native_over_replay"] = round(statistics.median(
        n / r for n, r in zip(times["native"], times["replay"], strict=True)), 4)
    for phase in ("upload_ms", "enqueue_ms", "wait_ms"):
        record[f"native_{phase}"] = round(statistics.median(p[phase] for p in phases), 3)
    record["native_cli_ms_not_interleaved"] = round(native_cli_median(executable, path, data, device, steps,
                                                                      work / "cache"), 3)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["digits", "lenet", "resnet_mini", "mlp"],
                        choices=[*MODELS, "digits"])
    parser.add_argument("--device", default="Intel(R) OpenCL")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    digits_split(0)  # (the data set loads once, outside any timing)
    built = build_native()
    # The library loads the OpenCL library pyopencl loaded (one ICD loader, the same platforms).
    os.environ.update(opencl_environment())
    records = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            record = {"benchmark": "native_step", "model": model, "steps": args.steps, "method": "interleaved",
                      **run_context(args.device), **measure(model, args.device, args.steps, Path(work), built.library,
                                                            built.executable)}
            print(record, flush=True)
            records.append(record)
    append_jsonl(RESULTS / DEVICE / "native_step.jsonl", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
