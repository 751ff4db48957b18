"""Compile time of each reference model's forward+backward, cold and warm, each in a fresh process.

    python benchmarks/compile_time.py --models mlp lenet resnet_mini transformer

Per model, one fresh Python process per phase, all sharing one temporary set of cache directories
(the compile cache, i.e. PyTorch's AOTAutograd cache under ``TORCHINDUCTOR_CACHE_DIR``; the
program-binary cache, ``TORCH_ADRENO_CACHE_DIR``; and the driver's own caches: PoCL's
``POCL_CACHE_DIR``, NVIDIA's ``CUDA_CACHE_PATH``), which start empty:

* ``cold``: nothing cached anywhere, the first run ever on this device and driver;
* ``warm``: the same caches again, as a second process finds them;
* ``warm_no_compile_cache``: binary and driver caches warm, the compile cache off
  (``TORCH_ADRENO_COMPILE_CACHE=0``): every stage runs again, only OpenCL builds are saved;
* ``warm_driver_cache_only``: the driver's caches warm but the binary and compile caches off
  (``TORCH_ADRENO_BINARY_CACHE=0``), what a second process got before either cache;
* ``dynamo_only``: the same model compiled with ``backend="eager"`` in a fresh process: Dynamo's
  own tracing and set-up, which every backend pays and no cache of ours can skip;
* ``cold_no_binary_cache`` (with ``--all-phases``): fresh driver caches, binary cache off, the
  cold cost without the binary cache (on PoCL, fetching binaries compiles every kernel).

In each process: the device is opened first (``runtime_init_s``, not compile time), then the
model's loss is compiled with ``torch.compile(backend="adreno")`` and the first step runs forward
(``forward_s``, includes compiling the forward graph) and backward (``backward_s``, includes the
backward graph); the median of three more steps gives the steady step time ``step_s``, and
``compile_s`` = ``forward_s + backward_s - step_s``. The OpenCL share of it comes from the build counters
(``opencl_*``). Then Dynamo is reset, the process's programs forgotten and the model compiled
again (``recompile_s``): compile time without Python's one-time import and set-up costs (with the
compile cache on, a hit in this process's cache).

Appends JSON lines to benchmarks/results/<device>/compile_time.jsonl (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
import torch.nn.functional as F
from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context
from torch._dynamo.utils import counters

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.runtime import get_runtime
from torch_adreno.runtime.binary_cache import build_stats, cache_enabled, forget_programs, reset_build_stats

_MARK = "COMPILE_TIME_RESULT "
PHASES = ("cold", "warm", "warm_no_compile_cache", "warm_driver_cache_only", "dynamo_only")
ALL_PHASES = ("cold_no_binary_cache", *PHASES)


def _compile_and_step(model_name: str, options: dict[str, Any], backend: str = "adreno") -> dict[str, float]:
    """Compile the model's loss, run four steps; seconds of each part."""
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    if backend == "adreno":
        compiled = torch.compile(loss_fn, backend="adreno", options=options, dynamic=False)
    else:
        compiled = torch.compile(loss_fn, backend=backend, dynamic=False)
    start = time.perf_counter()
    loss = compiled(model, x, y)
    forward = time.perf_counter()
    loss.backward()
    backward = time.perf_counter()
    steps = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        begin = time.perf_counter()
        compiled(model, x, y).backward()
        steps.append(time.perf_counter() - begin)
    return {"forward_s": forward - start, "backward_s": backward - forward, "step_s": statistics.median(steps),
            "loss": float(loss.detach())}


def child(model_name: str, device: str | int | None, backend: str = "adreno") -> dict[str, Any]:
    """One phase in this (fresh) process; the record without the run context."""
    options = {"device": device} if device is not None else {}
    start = time.perf_counter()
    get_runtime(device)
    runtime_init = time.perf_counter() - start
    reset_build_stats()
    first = _compile_and_step(model_name, options, backend)
    stats = build_stats()
    aot = dict(counters["aot_autograd"])
    record: dict[str, Any] = {
        "compile_cache_hits": aot.get("autograd_cache_hit", 0), "compile_cache_saved": aot.get("autograd_cache_saved", 0),
        "model": model_name, "backend": backend, "binary_cache": cache_enabled(get_runtime(device).device), "runtime_init_s": runtime_init, **first,
        "compile_s": first["forward_s"] + first["backward_s"] - first["step_s"],
        "opencl_build_s": stats.build_seconds, "opencl_source_s": stats.source_seconds,
        "opencl_load_s": stats.load_seconds, "opencl_store_s": stats.store_seconds,
        "programs_from_source": stats.programs_from_source, "programs_from_cache": stats.programs_from_cache,
        "entries_rejected": stats.entries_rejected, "write_failures": stats.write_failures,
    }
    torch._dynamo.reset()
    forget_programs()
    reset_build_stats()
    again = _compile_and_step(model_name, options, backend)
    record["recompile_s"] = again["forward_s"] + again["backward_s"] - again["step_s"]
    record["recompile_opencl_build_s"] = build_stats().build_seconds
    return record


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run_phase(model_name: str, phase: str, caches: Path, device: str | None, timeout: float) -> dict[str, Any]:
    """Run ``phase`` of ``model_name`` in a fresh interpreter using the cache directories under ``caches``."""
    package_root = str(Path(torch_adreno.__file__).resolve().parents[1])
    driver = caches / ("driver_nobin" if phase == "cold_no_binary_cache" else "driver")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p),
        "TORCH_ADRENO_CACHE_DIR": str(caches / "programs"),
        "TORCH_ADRENO_BINARY_CACHE": "0" if phase in ("warm_driver_cache_only", "cold_no_binary_cache") else "1",
        "TORCH_ADRENO_COMPILE_CACHE": "1" if phase in ("cold", "warm") else "0",
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "POCL_CACHE_DIR": str(driver / "pocl"),
        "CUDA_CACHE_PATH": str(driver / "cuda"),
    }
    command = [sys.executable, __file__, "--child", model_name]
    if phase == "dynamo_only":
        command += ["--backend", "eager"]
    if device is not None:
        command += ["--device", device]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{model_name} {phase}: child exited {done.returncode}\n{done.stderr[-4000:]}")
    record = json.loads(lines[-1][len(_MARK):])
    return {**record, "phase": phase, "process_s": wall, "binary_cache_bytes": _dir_bytes(caches / "programs")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default=None)
    parser.add_argument("--all-phases", action="store_true", help="also measure cold_no_binary_cache")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "compile_time.jsonl")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="adreno", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(_MARK + json.dumps(child(args.child, device_arg(args.device), args.backend)), flush=True)
        return
    context = run_context(device_arg(args.device))
    phases = ALL_PHASES if args.all_phases else PHASES
    print(f"{context['device']} ({context['platform']}, driver {context['driver']}), torch {context['torch']}")
    print(f"{'model':<15} {'phase':<24} {'compile s':>9} {'graphs hit':>10} {'opencl s':>8} {'src':>4} {'hit':>4} "
          f"{'recompile s':>11} {'step s':>7} {'process s':>9}")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="torch_adreno_compile_time_") as tmp:
            for phase in phases:
                record = run_phase(model, phase, Path(tmp), args.device, args.timeout)
                append_jsonl(args.out, [{**record, **context, "benchmark": "compile_time"}])
                print(f"{model:<15} {phase:<24} {record['compile_s']:>9.2f} {record['compile_cache_hits']:>10} "
                      f"{record['opencl_build_s']:>8.2f} "
                      f"{record['programs_from_source']:>4} {record['programs_from_cache']:>4} "
                      f"{record['recompile_s']:>11.2f} {record['step_s']:>7.3f} {record['process_s']:>9.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
