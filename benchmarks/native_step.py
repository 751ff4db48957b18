"""Step time of one exported training step in its three runners on one device: the in-PyTorch replay
(TrainingStep), the torch-free Python runner (torch_adreno.runner) and the native runtime
(native/, torch-adreno-step). Median wall time of a step (upload, launches, loss read back) after
warm-up; the native runtime's from its per-step lines, its programs from its cache.

    python benchmarks/native_step.py [--models mlp digits] [--device "Intel(R) OpenCL"] [--steps 30]

Appends JSON lines to benchmarks/results/native_step.jsonl. Not a test: asserts nothing.
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
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, run_context

from torch_adreno.cli import main as cli_main
from torch_adreno.cli.native import build_native, opencl_environment
from torch_adreno.data import digits_split
from torch_adreno.export.data_file import load_batches
from torch_adreno.models import MODELS, LeNet
from torch_adreno.runner import StepRunner, choose_device
from torch_adreno.training.optimizers import make_optimizer
from torch_adreno.training.step import TrainingStep

WARMUP = 3


def replay_times(model: str, device: str, batches: dict, steps: int) -> list[float]:
    make = LeNet if model == "digits" else MODELS[model].make
    module = make()
    optimizer = make_optimizer("sgd", module.parameters(), lr=torch.tensor(0.05))

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    names = sorted(batches)
    rows = len(batches[names[0]])
    times = []
    with TrainingStep(module, loss_fn, optimizer, {"device": device}) as step:
        for i in range(WARMUP + steps):
            batch = [torch.from_numpy(batches[name][i % rows]) for name in names]
            start = time.perf_counter()
            step(*batch).item()
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        assert step.replayed_steps >= steps
    return times


def runner_times(path: Path, device: str, batches: dict, steps: int) -> list[float]:
    runner = StepRunner.load(path, choose_device(device))
    names = [spec["input"] for spec in runner.batch_inputs]
    rows = len(batches[names[0]])
    times = []
    for i in range(WARMUP + steps):
        start = time.perf_counter()
        runner.step(*(batches[name][i % rows] for name in names))
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def native_times(executable: Path, path: Path, data: Path, device: str, steps: int, cache: Path) -> list[float]:
    env = dict(os.environ, **opencl_environment())
    command = [str(executable), "train", str(path), "--data", str(data), "--steps", str(WARMUP + steps), "--out",
               str(path.with_suffix(".state.safetensors")), "--device", device, "--cache-dir", str(cache)]
    for _ in range(2):  # the first run fills the program cache
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    times = [float(t) / 1e3 for t in re.findall(r"^step \d+ loss \S+ time (\S+) ms", done.stdout, re.MULTILINE)]
    return times[WARMUP:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "digits"], choices=[*MODELS, "digits"])
    parser.add_argument("--device", default="Intel(R) OpenCL")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    digits_split(0)  # (the data set loads once, outside any timing)
    built = build_native()
    records = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            path, data = Path(work) / f"{model}.onnx", Path(work) / f"{model}.safetensors"
            assert cli_main(["export", str(path), "--model", model, "--lr", "0.05", "--device", args.device,
                             "--data-out", str(data), "--data-steps", str(args.steps)]) == 0
            batches = load_batches(data)
            medians = {
                "replay_ms": statistics.median(replay_times(model, args.device, batches, args.steps)) * 1e3,
                "python_runner_ms": statistics.median(runner_times(path, args.device, batches, args.steps)) * 1e3,
                "native_ms": statistics.median(native_times(built.executable, path, data, args.device, args.steps,
                                                            Path(work) / "cache")) * 1e3,
            }
            record = {"benchmark": "native_step", "model": model, "steps": args.steps, **run_context(args.device),
                      **{k: round(v, 3) for k, v in medians.items()}}
            print(record)
            records.append(record)
    append_jsonl(RESULTS / "native_step.jsonl", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
