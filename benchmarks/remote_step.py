"""A remote step over loopback (``torch-adreno-step serve`` and torch_adreno.remote) against the same
step run locally by the native library (in this process, ctypes) and by the in-PyTorch replay
(TrainingStep), on one device, their steps interleaved round by round (the order rotating) so that
a neighbour's load on a shared machine falls on all alike; and a TrainingStep on the remote device
(``device="remote:..."``, a second server: the whole desktop path, its guard and scalar checks
included). The bound: a remote step should cost at most 1.1x the local replay's plus the batch's
bytes at 1 GB/s (``budget_ms``). The server's own phases for the step (upload, enqueue, wait) say
what the socket adds: ``remote_ms`` minus their sum.

    python benchmarks/remote_step.py [--models digits mlp resnet_mini] [--device "Intel(R) OpenCL"] [--steps 30]

Appends JSON lines to benchmarks/results/<device>/remote_step.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, run_context
from native_step import WARMUP, export_step, interleaved, training_step

from torch_adreno.cli.native import build_native, opencl_environment
from torch_adreno.data import digits_split
from torch_adreno.models import MODELS
from torch_adreno.remote import NativeStep, RemoteDevice

#: The bound: a remote step <= 1.1 x the local replay's + the batch's bytes at this rate.
BUDGET_FACTOR, BUDGET_BYTES_PER_SECOND = 1.1, 1e9


def start_server(executable: Path, device: str, cache: Path) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen([str(executable), "serve", "--port", "0", "--device", device, "--cache-dir", str(cache)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=dict(os.environ, **opencl_environment()))
    assert server.stdout is not None
    found = re.match(r"listening on \S+:(\d+) ", server.stdout.readline())
    if found is None:
        server.kill()
        raise SystemExit("the step server did not start")
    return server, int(found.group(1))


def measure(model: str, device: str, steps: int, work: Path, library: Path, port: int,
            step_port: int) -> dict[str, Any]:
    exported = export_step(model, device, steps, work)
    path, row = exported.path, exported.row

    server_phases: list[float] = []
    with RemoteDevice("127.0.0.1", port) as remote_device, \
            training_step(model, {"device": device}) as replay, \
            training_step(model, {"device": f"remote:127.0.0.1:{step_port}"}) as remote_training, \
            NativeStep(library, path, device=device, cache_dir=work / "cache") as native:
        remote = remote_device.load_step(path)
        losses: dict[str, list[float]] = {"native": [], "remote": []}

        times = interleaved({
            "replay": lambda i: replay(*(torch.from_numpy(a) for a in row(i))).item(),
            "native": lambda i: losses["native"].append(native.step(*row(i))),
            "remote": lambda i: losses["remote"].append(remote.step(*row(i))),
            "training_step_remote": lambda i: remote_training(*(torch.from_numpy(a) for a in row(i))).item(),
        }, steps)
        assert replay.replayed_steps >= steps
        assert remote_training.remote is not None and remote_training.remote.steps_run >= steps
        for i in range(WARMUP):  # the server's phases of a few steps of its own, after the timed ones
            remote.step(*row(i))
            server_phases.append(sum(remote.profile()["last_step"].values()))
    batch_bytes = sum(a.nbytes for a in row(0))
    record: dict[str, Any] = {f"{name}_ms": round(statistics.median(t) * 1e3, 3) for name, t in times.items()}
    record["batch_bytes"] = batch_bytes
    record["budget_ms"] = round(BUDGET_FACTOR * record["replay_ms"] + batch_bytes / BUDGET_BYTES_PER_SECOND * 1e3, 3)
    record["within_budget"] = record["remote_ms"] <= record["budget_ms"]
    record["training_step_remote_within_budget"] = record["training_step_remote_ms"] <= record["budget_ms"]
    record["remote_over_native"] = round(statistics.median(
        r / n for r, n in zip(times["remote"], times["native"], strict=True)), 4)
    record["server_step_ms"] = round(statistics.median(server_phases), 3)
    # (the same file from the same state on the same batches: the losses must agree bit for bit)
    record["remote_losses_equal_native"] = losses["remote"] == losses["native"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["digits", "mlp", "resnet_mini"], choices=[*MODELS, "digits"])
    parser.add_argument("--device", default="Intel(R) OpenCL")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    digits_split(0)  # (the data set loads once, outside any timing)
    built = build_native()
    os.environ.update(opencl_environment())  # (the library loads the OpenCL library pyopencl loaded)
    records = []
    with tempfile.TemporaryDirectory() as work:
        server, port = start_server(built.executable, args.device, Path(work) / "server-cache")
        step_server, step_port = start_server(built.executable, args.device, Path(work) / "step-server-cache")
        try:
            for model in args.models:
                record = {"benchmark": "remote_step", "model": model, "steps": args.steps, "method": "interleaved",
                          "transport": "loopback", **run_context(args.device),
                          **measure(model, args.device, args.steps, Path(work), built.library, port, step_port)}
                print(record, flush=True)
                records.append(record)
        finally:
            for running in (server, step_server):
                running.terminate()
                running.wait(timeout=60)
    append_jsonl(RESULTS / DEVICE / "remote_step.jsonl", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
