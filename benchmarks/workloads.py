"""The three real workloads of issue 28, one training step each (forward, loss, backward, SGD with
momentum 0.9), timed for PyTorch's peers and ours on the same device in one run:

- ``mobilenet_v2``: MobileNetV2, 224x224, batch 16, 1,000 classes, cross-entropy;
- ``resnet18``: ResNet-18, 224x224, batch 16, 1,000 classes, cross-entropy;
- ``gpt2_lora``: GPT-2 124M shapes (12 layers, d 768, 12 heads, vocab 50,257), seq 256, batch 4,
  LoRA r=8 (alpha 16) on q and v, base weights frozen, next-token cross-entropy
  (:mod:`gpt2_lora`, plain torch).

torchvision's models where ``import torchvision`` works, else ``torch_adreno.models``' (the same
module names and initialisation); MobileNetV2 with ``dropout=0.0`` (its random masks would differ
between peers, whose losses are compared); ``--small`` always takes ``torch_adreno.models``' (torchvision's
ResNet has no width to reduce). ``--small``: the same architectures reduced to run on PoCL in about
a minute each (ResNet-18 at width 8, a shortened MobileNetV2 at width 0.25, both 64x64, batch 4,
10 classes; GPT-2 with 2 layers, d 64, 4 heads, vocab 512, seq 32, batch 2).

Peers (``--peers``): ``eager`` (CUDA with TF32 off in cuBLAS and cuDNN where CUDA is available,
else the host's eager CPU step), ``inductor`` (``torch.compile``), ``inductor_cg``
(``torch.compile(mode="reduce-overhead")``, CUDA graphs), each also as ``*_tf32`` with TF32 on in
both (strict fp32 is what ours computes; cuDNN's default is TF32 on), and ``ours``
(``torch_adreno.TrainingStep`` replayed, options ``{"device": --device}``). The CUDA peers run
only where ``torch.cuda.is_available()``. As ``../shared/peers`` times steps: every peer starts
from the same weights and batch, runs ``--warmup`` steps, then ``--steps`` timed ones, each
synchronised inside its window and its loss read there (ours: ``float(step(x, y))``, the batch on
the host); the median and min of those. Ours also gets one replayed step under
``torch_adreno.profile()`` (device time, launches, kernel bytes, FLOPs; breakdowns by kernel kind,
ATen op and kernel with GFLOP/s and GB/s) and its compile time: the calls before its first replay
(compiling the loss and optimizer graphs, then the capture), cold (fresh caches) and warm (a second
process finding those caches; ``--no-warm`` skips it). Each CUDA peer also gets its device time:
the CUDA kernels of one more step under ``torch.profiler`` (``device_ms``; ``device_over_eager``
for every peer beside eager's): on the shared GPU host eager's wall time for ResNet-18 varied from
8.8 to 12.4 ms between four runs of one day (2026-12-04), with its host's share of each step.

Energy per step (``energy_j_per_step``): after its timed steps each peer runs its step back to back
for at least ``--energy-seconds`` (1 s) and ``--energy-steps`` (60) inside one window of the
profiler's energy reader (:mod:`energy_window`): the GPU's NVML energy counter, the same GPU for the
CUDA peers and for ours (NVIDIA's OpenCL device, matched by PCI address). Where nothing is read (the
host's CPU, a CPU OpenCL runtime, no NVIDIA driver) the record says ``energy_not_measured`` with
the reason, and the window is not run. ``--no-energy`` skips it.

Each workload runs in a fresh process (its memory returned after it) whose caches -- the program
binaries (``TORCH_ADRENO_CACHE_DIR``), PyTorch's compile cache (``TORCHINDUCTOR_CACHE_DIR``) and the
drivers' (``POCL_CACHE_DIR``, ``CUDA_CACHE_PATH``) -- start empty unless ``--warm-caches``.

    python benchmarks/workloads.py --device NVIDIA                      # full sizes (the GPU machine)
    python benchmarks/workloads.py --small --steps 3 --workloads resnet18
    python benchmarks/workloads.py --small --plot                       # + benchmarks/results/<device>/workloads.png

Appends JSON lines to ``--out`` (default benchmarks/results/<device>/workloads.jsonl), one per workload and
peer, and prints a table. Not a test: asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
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
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

import gpt2_lora
from common import DEVICE, RESULTS, append_jsonl, device_arg, results_file, run_context
from energy_window import MIN_SECONDS, MIN_STEPS, cuda_meter, energy_per_step, ours_meter
from workloads_report import breakdown_text, fmt, plot, table

import torch_adreno
from torch_adreno.profiler.roofline import device_peaks
from torch_adreno.runtime import get_runtime

WORKLOADS = ("mobilenet_v2", "resnet18", "gpt2_lora")
PEERS = ("eager", "eager_tf32", "inductor", "inductor_tf32", "inductor_cg", "inductor_cg_tf32", "ours")
CUDA_PEERS = ("eager_tf32", "inductor", "inductor_tf32", "inductor_cg", "inductor_cg_tf32")
LABELS = {"eager": "eager CUDA, TF32 off", "eager_tf32": "eager CUDA, TF32 on", "inductor": "inductor, TF32 off",
          "inductor_tf32": "inductor, TF32 on", "inductor_cg": "inductor + CUDA graphs, TF32 off",
          "inductor_cg_tf32": "inductor + CUDA graphs, TF32 on", "ours": "ours replayed"}
CPU_EAGER_LABEL = "eager CPU (no CUDA here: the host's step is the peer)"
LR = 0.01
MOMENTUM = 0.9
SEED = 0


# -- the workloads --------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    title: str
    source: str
    make: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    shape: dict[str, Any]


def _classify(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


#: A shortened MobileNetV2 for --small: every kind of block (expansion 1 and 6, stride 1 and 2,
#: with and without the residual) at width 0.25.
SMALL_MOBILENET_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2], [6, 64, 1, 2]]


def _vision_module() -> tuple[Any, str]:
    try:
        import torchvision.models as tv

        return tv, f"torchvision {__import__('torchvision').__version__}"
    except Exception:  # not installed, or a CUDA build whose _C does not load with this torch
        import torch_adreno.models as own

        return own, "torch_adreno.models"


def vision_workload(name: str, small: bool) -> Workload:
    batch, size, classes = (4, 64, 10) if small else (16, 224, 1000)
    module, source = (__import__("torch_adreno.models", fromlist=["x"]), "torch_adreno.models") if small \
        else _vision_module()
    if name == "resnet18":
        title = "ResNet-18"
        kwargs: dict[str, Any] = {"width": 8} if small else {}
        factory = module.resnet18
    else:
        title = "MobileNetV2"
        # Dropout off: its random masks differ between peers, and the peers' losses are compared.
        kwargs = {"dropout": 0.0}
        if small:
            kwargs.update(width_mult=0.25, inverted_residual_setting=SMALL_MOBILENET_SETTING)
        factory = module.mobilenet_v2

    def make() -> nn.Module:
        torch.manual_seed(SEED)
        return factory(num_classes=classes, **kwargs).train()

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(SEED + 1)
        return (torch.randn(batch, 3, size, size, generator=generator),
                torch.randint(0, classes, (batch,), generator=generator))

    shape = {"batch": batch, "image": size, "classes": classes, **kwargs}
    return Workload(name, f"{title}, {size}x{size}, batch {batch}", source, make, make_batch, _classify, shape)


def lora_workload(small: bool) -> Workload:
    cfg = gpt2_lora.SMALL if small else gpt2_lora.FULL

    def make() -> nn.Module:
        torch.manual_seed(SEED)
        return gpt2_lora.gpt2_lora(cfg).train()

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        return gpt2_lora.token_batch(cfg, torch.Generator().manual_seed(SEED + 1))

    title = (f"GPT-2 ({cfg.layers} layers, d {cfg.d}), LoRA r={cfg.rank} on q and v, seq {cfg.seq}, "
             f"batch {cfg.batch}")
    return Workload("gpt2_lora", title, "benchmarks/gpt2_lora.py", make, make_batch, gpt2_lora.lm_loss,
                    dataclasses.asdict(cfg))


def get_workload(name: str, small: bool) -> Workload:
    return lora_workload(small) if name == "gpt2_lora" else vision_workload(name, small)


# -- timing ---------------------------------------------------------------------------------------


def _timed(step: Callable[[], float], warmup: int, steps: int, sync: Callable[[], None]) -> dict[str, Any]:
    """Warm-up calls (each timed: the first includes compiling), then ``steps`` timed steps, each
    synchronised inside its window, the loss read there."""
    calls, losses, times = [], [], []
    for _ in range(warmup):
        sync()
        start = time.perf_counter()
        losses.append(step())
        sync()
        calls.append(time.perf_counter() - start)
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        loss = step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "steps": steps, "warmup": warmup, "first_call_s": calls[0], "warmup_call_s": calls,
            "loss_first": losses[0], "loss_last": losses[-1], "losses": losses}


def torch_peer(work: Workload, base: nn.Module, peer: str, steps: int, warmup: int,
               energy: tuple[float, int] | None = None) -> dict[str, Any]:
    """Eager or inductor, as PyTorch runs the step on CUDA (or eager on the host without CUDA);
    ``energy``: (seconds, steps) of the window its joules per step are read over (None: not read)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    tf32 = peer.endswith("_tf32")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    torch._dynamo.reset()
    model = copy.deepcopy(base).to(device)
    x, y = (t.to(device) for t in work.batch())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)

    def loss_of(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return work.loss(model, a, b)

    graphs = peer.startswith("inductor_cg")
    loss_fn = (torch.compile(loss_of, mode="reduce-overhead") if graphs else
               torch.compile(loss_of) if peer.startswith("inductor") else loss_of)

    def step() -> float:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    from torch._dynamo.utils import counters

    counters.clear()
    row = _timed(step, warmup, steps, sync)
    if energy is not None:
        row.update(energy_per_step(step, sync, cuda_meter(), *energy))
    row.update(peer_device=torch.cuda.get_device_name() if cuda else "cpu", tf32=tf32 if cuda else None,
               label=LABELS[peer] if cuda else CPU_EAGER_LABEL, host_threads=torch.get_num_threads())
    if peer.startswith("inductor"):
        row["cudagraph_skips"] = dict(counters["inductor"]).get("cudagraph_skips", 0)
    if cuda:
        row["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
        row["device_ms"] = cuda_kernel_ms(step)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return row


def cuda_kernel_ms(step: Callable[[], float]) -> float:
    """The CUDA kernels' time in one more ``step`` (``torch.profiler``), ms: the peer's device time,
    to set beside ours', free of the host's share of the wall time (which varies from run to run
    on a shared host far more than the kernels do)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3


def _rate(row: dict[str, Any]) -> dict[str, Any]:
    """A grouped profile row with its ms, GFLOP, MB, GFLOP/s and GB/s."""
    us = row["time"]
    return {"calls": row["calls"], "time_ms": us / 1e3, "gflop": row["flops"] / 1e9, "mb": row["bytes"] / 1e6,
            "gflops": row["flops"] / (us * 1e3) if us else None, "gbs": row["bytes"] / (us * 1e3) if us else None}


def breakdown(prof: torch_adreno.profile, rows: int) -> dict[str, Any]:
    """One profiled step: totals, by kernel kind (all), by ATen op and by kernel (top ``rows``)."""
    total = prof.device_time_us or 1.0
    kinds: dict[str, dict[str, Any]] = {}
    ops_of: dict[str, tuple[str, ...]] = {}
    for k in prof.kernels:
        row = kinds.setdefault(k.kind, {"calls": 0, "time": 0.0, "flops": 0.0, "bytes": 0.0})
        row["calls"] += 1
        row["time"] += k.device_time_us or 0.0
        row["flops"] += k.flops
        row["bytes"] += k.bytes
        ops_of.setdefault(k.name, k.aten_ops)

    def top(group: str) -> list[dict[str, Any]]:
        ordered = sorted(prof.grouped(group).items(), key=lambda kv: -kv[1]["time"])[:rows]
        out = []
        for name, row in ordered:
            entry = {"name": name, **_rate(row), "share": row["time"] / total}
            if group == "kernel":
                entry["ops"] = [op.removeprefix("aten.") for op in ops_of.get(name, ())]
            out.append(entry)
        return out

    return {
        "device_ms": prof.device_time_us / 1e3, "launches": prof.kernel_launches,
        "kernel_bytes_read": prof.bytes_kernel_read, "kernel_bytes_written": prof.bytes_kernel_written,
        "gflop": prof.flops / 1e9, "h2d_bytes": prof.bytes_host_to_device, "d2h_bytes": prof.bytes_device_to_host,
        "host_fallback_ops": prof.host_fallback_ops, "replay_host_us": prof.host_time_per_replayed_step_us,
        "by_kind": {kind: {**_rate(row), "share": row["time"] / total}
                    for kind, row in sorted(kinds.items(), key=lambda kv: -kv[1]["time"])},
        "by_op": top("op"), "by_kernel": top("kernel"),
    }


def ours(work: Workload, base: nn.Module, device: str | int | None, steps: int, warmup: int, rows: int,
         profile: bool = True, energy: tuple[float, int] | None = None) -> dict[str, Any]:
    """``TrainingStep`` replayed; the batch on the host, the loss read inside each step's window;
    ``energy`` as :func:`torch_peer`'s."""
    torch._dynamo.reset()
    model = copy.deepcopy(base)
    x, y = work.batch()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    options = {"device": device} if device is not None else {}
    train = torch_adreno.TrainingStep(model, work.loss, opt, options=options)

    phases: dict[str, list[float]] = {"guard": [], "batch": [], "enqueue": [], "after": []}

    def step() -> float:
        loss = float(train(x, y))
        if train.replay is not None and train.replayed_steps:
            for phase, values in phases.items():
                values.append(train.replay.last_phases.get(phase, 0.0))
        return loss

    row = _timed(step, warmup, steps, lambda: None)
    if energy is not None:  # each step reads its loss: the device is done when step() returns
        row.update(energy_per_step(step, lambda: None, ours_meter(device), *energy))
    # The host's own work of each replayed step, by phase (the device idles through guard + batch).
    row["replay_host_phases_ms"] = {phase: statistics.median(values) * 1e3 for phase, values in phases.items() if values}
    row["compile_s"] = sum(row["warmup_call_s"][:2])  # the calls before the first replay
    row.update(label=LABELS["ours"], options={k: str(v) for k, v in options.items()},
               replayed_steps=train.replayed_steps, timed_steps_replayed=train.replayed_steps >= warmup - 2 + steps,
               unreplayable=list(train.unreplayable_reasons))
    if profile:
        with torch_adreno.profile() as prof:
            row["profiled_loss"] = step()
        row["profiled_step_replayed"] = prof.replayed_steps == 1
        row["replay_fallbacks"] = prof.replay_fallbacks
        row.update(breakdown(prof, rows))
        try:  # measured once per device and cached (torch_adreno.profiler.roofline)
            row["device_peaks"] = dataclasses.asdict(device_peaks(get_runtime(device)))
        except Exception as error:  # the peaks are context, not the measurement
            row["device_peaks"] = f"not measured: {type(error).__name__}: {error}"
    train.close()
    return row


# -- one workload in this process (the child) ----------------------------------------------------


def child(args: argparse.Namespace) -> None:
    device = device_arg(args.device)
    work = get_workload(args.child, args.small)
    base = work.make()
    context = run_context(device)
    common = {"benchmark": "workloads", **context, "workload": work.name, "title": work.title,
              "model_source": work.source, "shape": work.shape, "small": args.small, "lr": LR,
              "momentum": MOMENTUM, "params": sum(p.numel() for p in base.parameters()),
              "trainable_params": sum(p.numel() for p in base.parameters() if p.requires_grad)}
    records = []
    peers = ["ours"] if args.phase == "warm" else args.peers
    energy = None if args.no_energy or args.phase == "warm" else (args.energy_seconds, args.energy_steps)
    for peer in peers:
        print(f"[{work.name}] {peer}{' (warm compile)' if args.phase == 'warm' else ''} ...", flush=True)
        try:
            if peer == "ours":
                row = ours(work, base, device, args.steps if args.phase != "warm" else 1, args.warmup, args.rows,
                           profile=args.phase != "warm", energy=energy)
            else:
                row = torch_peer(work, base, peer, args.steps, args.warmup, energy)
        except Exception as error:  # one peer failing does not lose the others' rows
            row = {"label": LABELS.get(peer, peer), "error": f"{type(error).__name__}: {str(error)[:2000]}"}
            print(f"[{work.name}] {peer} failed: {row['error'][:500]}", flush=True)
        records.append({**common, "peer": peer, "phase": args.phase, **row})
        torch._dynamo.reset()  # its cached code holds the peer's model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if peer == "ours" and "by_op" in row:
            print(breakdown_text(row, args.rows), flush=True)
    with open(args.child_out, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


# -- the run (the parent) ------------------------------------------------------------------------


def run_child(args: argparse.Namespace, workload: str, phase: str, caches: Path | None) -> list[dict[str, Any]]:
    """``workload`` in a fresh process; its records (one per peer), or one error record."""
    package_root = str(Path(torch_adreno.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    if caches is not None:
        env.update(TORCH_ADRENO_CACHE_DIR=str(caches / "programs"), TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                   TRITON_CACHE_DIR=str(caches / "triton"), POCL_CACHE_DIR=str(caches / "pocl"),
                   CUDA_CACHE_PATH=str(caches / "cuda"))
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as out:
        out_path = Path(out.name)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", workload, "--phase", phase,
               "--child-out", str(out_path), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--rows", str(args.rows), "--peers", *args.peers, "--energy-seconds", str(args.energy_seconds),
               "--energy-steps", str(args.energy_steps)]
    if args.no_energy:
        command.append("--no-energy")
    if args.small:
        command.append("--small")
    if args.device is not None:
        command += ["--device", args.device]
    try:
        done = subprocess.run(command, env=env, timeout=args.timeout, check=False)
        records = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
        if done.returncode != 0 or not records:
            return [{"benchmark": "workloads", "workload": workload, "phase": phase, "peer": "(all)",
                     "error": f"the workload's process exited with {done.returncode} and no result"}]
        return records
    except subprocess.TimeoutExpired:
        return [{"benchmark": "workloads", "workload": workload, "phase": phase, "peer": "(all)",
                 "error": f"the workload's process ran past --timeout {args.timeout:.0f} s"}]
    finally:
        out_path.unlink(missing_ok=True)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _at_least(kind: Callable[[str], Any], low: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS, metavar="W",
                        help=f"which workloads (default all: {' '.join(WORKLOADS)})")
    parser.add_argument("--peers", nargs="+", default=None, choices=PEERS, metavar="P",
                        help=f"which peers (default all this machine has: {' '.join(PEERS)})")
    parser.add_argument("--small", action="store_true", help="reduced sizes (PoCL, CI)")
    parser.add_argument("--steps", type=_positive, default=10, help="timed steps per peer (default 10)")
    parser.add_argument("--warmup", type=_positive, default=3,
                        help="untimed steps first (default 3; at least 2: ours replays from its third call)")
    parser.add_argument("--device", default=None, help="OpenCL device for ours (index or name part)")
    parser.add_argument("--energy-seconds", type=_at_least(float, MIN_SECONDS), default=MIN_SECONDS,
                        help=f"each peer's energy window lasts at least this long (default and minimum "
                             f"{MIN_SECONDS:g} s: the counters smooth over about a second)")
    parser.add_argument("--energy-steps", type=_at_least(int, MIN_STEPS), default=MIN_STEPS,
                        help=f"and holds at least this many steps (default and minimum {MIN_STEPS})")
    parser.add_argument("--no-energy", action="store_true", help="do not read joules per step")
    parser.add_argument("--rows", type=_positive, default=12, help="rows of each per-op breakdown (default 12)")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "workloads.jsonl", help="JSON-lines file to append to")
    parser.add_argument("--plot", nargs="?", type=Path, const=Path(), default=None, metavar="PNG",
                        help="plot step ms per workload and peer (default path: --out with .png)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm compile (a second process)")
    parser.add_argument("--warm-caches", action="store_true",
                        help="use this user's caches instead of fresh ones (the compile is then not cold)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per workload process (default 3600)")
    parser.add_argument("--child", default=None, choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="peers", choices=("peers", "warm"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 2:
        parser.error("--warmup must be at least 2: ours compiles on its first call and captures on its second")
    cuda = torch.cuda.is_available()
    if args.peers is None:
        args.peers = [p for p in PEERS if cuda or p not in CUDA_PEERS]
    elif not cuda and (wanted := [p for p in args.peers if p in CUDA_PEERS]):
        parser.error(f"--peers {' '.join(wanted)}: CUDA is not available here (only eager, on the CPU, and ours)")
    args.peers = list(dict.fromkeys(args.peers))
    try:
        device_arg(args.device)
    except Exception as error:
        parser.error(f"--device {args.device!r}: {error}")
    if args.child is None:
        try:
            args.context = run_context(device_arg(args.device))
        except Exception as error:  # no such device, or no OpenCL at all
            parser.error(f"--device {args.device!r}: cannot open the OpenCL device: {type(error).__name__}: {error}")
        if args.out.exists() and args.out.is_dir():
            parser.error(f"--out {args.out}: is a directory, expected a JSON-lines file")
    return args


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child(args)
        return
    context = args.context
    print(f"{context['device']} ({context['platform']}, driver {context['driver']}), torch {context['torch']}, "
          f"CUDA {'available: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'not available'}; "
          f"peers: {' '.join(args.peers)}; {'small' if args.small else 'full'} sizes", flush=True)
    records: list[dict[str, Any]] = []
    out = results_file(args.out, [context])
    for workload in args.workloads:
        with tempfile.TemporaryDirectory(prefix="torch_adreno_workloads_") as tmp:
            caches = None if args.warm_caches else Path(tmp)
            rows = run_child(args, workload, "peers", caches)
            ours_row = next((r for r in rows if r["peer"] == "ours" and "median_ms" in r), None)
            if ours_row is not None and not args.no_warm:
                warm = run_child(args, workload, "warm", caches)
                if "compile_s" in warm[0]:
                    ours_row["compile_warm_s"] = warm[0]["compile_s"]
                    ours_row["warm_loss_first"] = warm[0]["loss_first"]
                else:
                    ours_row["compile_warm_error"] = warm[0].get("error")
        eager = next((r for r in rows if r["peer"] == "eager" and "loss_first" in r), None)
        for r in rows:
            if eager is not None and "loss_first" in r and r is not eager:
                r["loss_first_diff_vs_eager"] = abs(r["loss_first"] - eager["loss_first"])
                r["eager_loss_first"], r["eager_loss_last"] = eager["loss_first"], eager["loss_last"]
                r["eager_label"] = eager["label"]
                r["over_eager"] = r["median_ms"] / eager["median_ms"]  # eager: TF32 off
                if r.get("device_ms") and eager.get("device_ms"):
                    r["device_over_eager"] = r["device_ms"] / eager["device_ms"]
        for peer in ("inductor_cg", "inductor_cg_tf32", "eager_tf32"):
            other = next((r for r in rows if r["peer"] == peer and "median_ms" in r), None)
            if ours_row is not None and other is not None:
                ours_row[f"over_{peer}"] = ours_row["median_ms"] / other["median_ms"]
        out = append_jsonl(args.out, [{**context, **r} for r in rows])
        records += rows
        print(table(rows), flush=True)
    if len(args.workloads) > 1:
        print("\n" + table(records))
    for r in records:
        if r["peer"] == "ours" and "loss_first_diff_vs_eager" in r:
            ratios = ", ".join(f"{fmt(r.get(f'over_{p}'), '.2f')}x {r['eager_label'] if p == 'eager' else LABELS[p]}"
                               for p in ("eager", "eager_tf32", "inductor_cg", "inductor_cg_tf32") if f"over_{p}" in r)
            print(f"{r['workload']}: ours' first loss {r['loss_first']:.6f}, eager's {r['eager_loss_first']:.6f} "
                  f"(|diff| {r['loss_first_diff_vs_eager']:.2e}); last {r['loss_last']:.6f} vs "
                  f"{r['eager_loss_last']:.6f}; replayed steps {r['replayed_steps']}; ours is {ratios}"
                  + (f"; device time {r['device_over_eager']:.2f}x eager's" if "device_over_eager" in r else ""))
    if args.plot is not None:
        path = args.plot if args.plot != Path() else out.with_suffix(".png")
        plot(records, path)
        print(f"plot: {path}")
    print(f"JSON lines: {out}")


if __name__ == "__main__":
    main()
