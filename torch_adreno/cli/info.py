"""``devices``, ``ops`` and ``project``: what this machine has, what the backend lowers, and projected step times on Adreno targets."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from torch_adreno.cli.arguments import add_device_argument, address, bounded, refuse_bad_device
from torch_adreno.config import Config
from torch_adreno.errors import OptionError
from torch_adreno.lowering import supported_ops
from torch_adreno.opencl_drivers import load_failures
from torch_adreno.profiler.roofline import SEED_DATA_MOVEMENT_SHARE, SEED_GEMM_GFLOPS
from torch_adreno.remote.client import PREFIX as REMOTE_PREFIX
from torch_adreno.remote.client import RemoteError
from torch_adreno.remote.listing import print_remote_device
from torch_adreno.replay.driver_recording import driver_recording
from torch_adreno.replay.launch_list import native_loop_status
from torch_adreno.runtime.device import ENV_DEVICE, INSTALL_HINT, get_runtime, list_devices, select_device
from torch_adreno.targets.profiles import TARGETS, AdrenoTarget, get_target, match_device, target_names
from torch_adreno.tools.bench.calibration import (
    CALIBRATION_FILE,
    Calibration,
    load_calibration,
    usable_record,
)
from torch_adreno.tools.bench.projected_workloads import DEFAULT_MODELS, SEED_MLP, step_workloads
from torch_adreno.tools.bench.projection import (
    ModelProjection,
    calibration_lines,
    energy_lines,
    format_table,
    kernel_table,
    project_model,
    project_record,
    summary_row,
)
from torch_adreno.tools.bench.remote_calibration import measure_calibration


def register(sub: argparse._SubParsersAction) -> None:
    """The ``devices``, ``ops`` and ``project`` commands."""
    sub.add_parser("devices", help="list OpenCL devices and their capabilities").set_defaults(fn=cmd_devices)
    sub.add_parser("ops", help="list the ATen ops the backend lowers").set_defaults(fn=cmd_ops)
    project = sub.add_parser("project", help="project training-step times onto Adreno targets' rooflines, "
                                          "as they are and calibrated by our kernels' measured efficiency")
    project.add_argument("--target", nargs="+", choices=target_names(), default=["adreno740"], metavar="TARGET",
                         help=f"Adreno profiles, of: {', '.join(target_names())} (default: %(default)s)")
    project.add_argument("--model", nargs="+", choices=sorted(step_workloads()), default=None, metavar="MODEL",
                         help=f"models, of: {', '.join(sorted(step_workloads()))} (default: {' '.join(DEFAULT_MODELS)}; "
                              f"{SEED_MLP} is the seed's MLP 784-256-128-16, batch 32; resnet18 and mobilenet_v2 "
                              "are 224x224 at batch 16, *_b32 at 32; gpt2_lora is GPT-2 124M LoRA r=8, seq 256 "
                              "batch 4, gpt2_lora_s512 seq 512)")
    project.add_argument("--profile-layers", nargs=2, type=bounded(int, "a whole number", 1), default=None,
                         metavar=("A", "B"),
                         help="profile the GPT-2 workloads with A and B blocks and extrapolate per block to 12 "
                              "(a full-depth GPT-2 step takes many minutes to compile and run on a CPU device); "
                              "default: the full depth")
    project.add_argument("--records", type=Path, default=None,
                         help="project the steps a benchmarks/workloads.py results file recorded on a GPU (each "
                              "kernel kind's launches, bytes and FLOPs of its profiled step; the first record per "
                              "workload, e.g. a workloads.jsonl under benchmarks/results) instead of profiling "
                              "here: kinds' sums on the roofline, coarser than per launch")
    project.add_argument("--calibration", type=Path, default=CALIBRATION_FILE,
                         help="the kernel kinds' achieved fractions of a GPU's roofline (default: the stored reference GPU's, "
                              "made by benchmarks/calibrate_projection.py)")
    project.add_argument("--remote", type=address, default=None, metavar="HOST:PORT",
                         help="calibrate by our kernels' efficiency measured now on a step server's device "
                              "(`torch-adreno-step serve`; adb forward for a phone) instead of --calibration: each "
                              "model's step replayed there once, profiled by its own OpenCL events")
    project.add_argument("--remote-peaks", nargs=2, type=bounded(float, "a number", 0.0), default=None,
                         metavar=("GFLOPS", "GBS"),
                         help="the remote device's fp32 peak (GFLOP/s) and memory bandwidth (GB/s) its fractions "
                              "are of (default: its Adreno profile's; required for a device of no profile)")
    project.add_argument("--launch-us", type=bounded(float, "a number", 0.0), default=10.0,
                         help="assumed cost of one kernel launch on the target, microseconds (default: %(default)s)")
    project.add_argument("--kernels", action="store_true", help="also print each model's kernels by projected time")
    add_device_argument(project)
    project.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per model and target")
    project.set_defaults(fn=cmd_project)


def _replay_enqueue(device: Any, label: str) -> str:
    """How a replayed TrainingStep on ``device`` enqueues its step, as the replay_command_buffers
    option (its environment variable) has it."""
    try:
        wanted = Config.from_options({}).replay_command_buffers
        recording = driver_recording(device, wanted, label)
    except OptionError as err:
        return f"cannot: {err}"
    if recording.kind:
        return f"recorded once in a {recording.kind} ({recording.detail}), enqueued whole each step"
    return f"launch by launch ({recording.detail})"


def cmd_devices(args: argparse.Namespace) -> int:
    # TORCH_ADRENO_DEVICE=remote:HOST:PORT: the remote device first; the local ones (where steps are
    # captured) follow, without a default of their own.
    remote = os.environ.get(ENV_DEVICE, "").strip()
    if not remote.lower().startswith(REMOTE_PREFIX):
        remote = ""
    elif print_remote_device(remote) != 0:
        return 1
    entries = list_devices()
    for distribution, error in load_failures().items():
        print(f"Installed OpenCL driver {distribution} cannot load, so the ICD loader skips it: {error}")
    if not entries:
        print(f"No OpenCL device found. {INSTALL_HINT}")
        return 1 if not remote else 0
    working = [e for e in entries if e.unusable is None]
    default = select_device(None) if working and not remote else None
    for e in entries:
        mark = "*" if default is not None and e.index == default.index else " "
        print(f"{mark}[{e.index}] {e.label}")
        if e.unusable is not None:
            print(f"      unusable: {e.unusable}")
            continue
        p = get_runtime(e.index).profile
        print(f"      {p.opencl_version}, driver {p.driver}, {'GPU' if p.is_gpu else 'CPU'}, "
              f"{p.compute_units} compute units")
        print(f"      work-group <= {p.max_work_group_size} (preferred multiple {p.preferred_work_group_multiple}), "
              f"local memory {p.local_mem_bytes // 1024} KiB")
        print(f"      global memory {p.global_mem_bytes / 2**30:.1f} GiB, largest allocation "
              f"{p.max_alloc_bytes / 2**20:.0f} MiB, base alignment {p.base_addr_align_bytes} B")
        print(f"      fp16 {'yes' if p.fp16 else 'no'}, images {'yes' if p.images else 'no'}, "
              f"unified memory {'yes' if p.unified_memory else 'no'}")
        print(f"      recordable queues (cl_qcom_recordable_queues) {'yes' if p.recordable_queues else 'no'}, "
              f"command buffers (cl_khr_command_buffer) {'yes' if p.command_buffers else 'no'}")
        print(f"      replayed TrainingStep enqueues: {_replay_enqueue(e.device, e.label)}")
        matched = match_device(p.name, p.opencl_version)
        print(f"      Adreno profile: {matched.name + ' (' + matched.gpu + ', ' + matched.soc + ')' if matched else 'none'}")
    if default is None and not remote:
        print(f"No device here can build a kernel. {INSTALL_HINT}")
        return 1
    if remote:
        print(f"R = the remote device {ENV_DEVICE} selects")
    else:
        print(f"* = default device (select another with options={{'device': ...}} or {ENV_DEVICE})")
    # Built on first use (once per machine): the line says whether replays get the C loop.
    print(f"Replayed TrainingStep launch loop: {native_loop_status()}")
    print("Adreno targets (compile for one on any device: options={'target': ...} or TORCH_ADRENO_TARGET; "
          "`python -m torch_adreno project` projects step times):")
    for t in TARGETS.values():
        print(f"  {t.name}: {t.gpu} ({t.soc}), work-group <= {t.max_work_group_size}, waves {t.wave_sizes}, "
              f"local {t.local_mem_bytes // 1024} KiB, largest allocation {t.max_alloc_bytes >> 20} MiB, "
              f"{t.peak_fp32_gflops / 1e3:.1f} TFLOP/s fp32, {t.bandwidth_gbs:.0f} GB/s")
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    if refuse_bad_device(args.device):
        return 2
    targets = [get_target(name) for name in args.target]
    models = args.model or list(DEFAULT_MODELS)
    workloads = step_workloads()
    if args.remote is not None and args.records is not None:
        print("error: --remote measures the models here named; --records projects recorded ones: give one",
              file=sys.stderr)
        return 2
    try:
        calibration = (load_calibration(args.calibration) if args.remote is None else measure_calibration(
            f"remote:{args.remote}", [workloads[m] for m in models],
            tuple(args.remote_peaks) if args.remote_peaks else None))
    except (ValueError, RemoteError) as error:
        print(f"error: {'--calibration' if args.remote is None else '--remote'}: {error}", file=sys.stderr)
        return 2
    if args.profile_layers:
        low, high = args.profile_layers
        if low >= high:
            print(f"error: --profile-layers: expected two increasing depths, got {low} {high}", file=sys.stderr)
            return 2
        if not any(workloads[m].layers for m in models):
            print(f"error: --profile-layers: none of {', '.join(models)} has repeated blocks to extrapolate "
                  "(only gpt2_lora and gpt2_lora_s512 do)", file=sys.stderr)
            return 2
    projections = []
    if args.records is not None:
        try:
            projections = recorded_projections(args.records, args.model, targets, args.launch_us, calibration)
        except (OSError, ValueError) as error:
            print(f"error: --records: {error}", file=sys.stderr)
            return 2
    for model in models if args.records is None else ():
        layers = tuple(args.profile_layers) if args.profile_layers and workloads[model].layers else None
        for projected in project_model(model, targets, args.launch_us, args.device, calibration, layers):
            projections.append(projected)
            if args.kernels:
                print(f"== {model} on {projected.target.name}: kernels by projected time")
                print(kernel_table(projected))
    rows = [summary_row(p) for p in projections]
    print(format_table(rows))
    print("\n".join(calibration_lines(projections, calibration)))
    print("\n".join(energy_lines(projections)))
    low, high = SEED_GEMM_GFLOPS
    print(f"Assumed: each launch costs {args.launch_us:g} us; roofline: kernels reach the target's roofline (bytes / "
          f"bandwidth, FLOPs / fp32 peak); calibrated: they reach the share of it their kind reached on the "
          f"{calibration.device}; a copy reads and writes DRAM. Seed's figures: GPU GEMM {low:.0f}-"
          f"{high:.0f} GFLOP/s on Snapdragon 8-series; data movement {SEED_DATA_MOVEMENT_SHARE:.0%} of an MNN "
          "training step." + ("" if args.remote else " Nothing here was measured on an Adreno."))
    if args.jsonl:
        args.jsonl.parent.mkdir(parents=True, exist_ok=True)
        with args.jsonl.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def recorded_projections(path: Path, models: list[str] | None, targets: list[AdrenoTarget], launch_us: float,
                         calibration: Calibration) -> list[ModelProjection]:
    """The first usable record of each workload in ``path`` (of ``models`` if given), projected."""
    first: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if usable_record(record):
            first.setdefault(record["workload"], record)
    missing = sorted(set(models or ()) - set(first))
    if missing or not first:
        raise ValueError(f"{path} has no profiled full-size step of {', '.join(missing or ['any workload'])} "
                         f"(it has {', '.join(sorted(first)) or 'none'})")
    return [p for name, record in first.items() if models is None or name in models
            for p in project_record(record, targets, launch_us, calibration)]


def cmd_ops(args: argparse.Namespace) -> int:
    ops = supported_ops()
    print("\n".join(ops))
    print(f"{len(ops)} ATen ops lowered (after decomposition to the core ATen op set)")
    return 0
