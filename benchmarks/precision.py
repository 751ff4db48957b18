"""Kernel DRAM bytes and step time of a training step per precision, per reference model.

Precisions: float32; float16 autocast with ``torch.amp.GradScaler``; bfloat16 autocast
(``torch.autocast(device_type="cpu", ...)``). Each row is one plain compiled training step (loss
and backward compiled, ``torch.compile(opt.step)`` for the SGD step, through ``scaler.step`` where
there is a scaler): the kernels' global-memory bytes (read + written, each buffer a kernel touches
counted once, from ``torch_adreno.profile()``), their ratio to float32's, and the median wall
time of ``--steps`` steps after two warm-up steps, all in the same process and run.

    python benchmarks/precision.py --models resnet_mini transformer
    source .gpu/env.sh && python benchmarks/precision.py --device NVIDIA --steps 30    # the H200

Appends JSON lines to benchmarks/results/<device>/precision.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS

#: precision -> (autocast dtype or None, GradScaler or not)
PRECISIONS: dict[str, tuple[torch.dtype | None, bool]] = {
    "float32": (None, False),
    "fp16_autocast": (torch.float16, True),
    "bf16_autocast": (torch.bfloat16, False),
}


def training_step(model_name: str, precision: str,
                  options: dict[str, Any]) -> tuple[Callable[[], torch.Tensor], torch.amp.GradScaler | None]:
    """One plain compiled training step of the model in the precision (see the module doc), and
    its GradScaler (None without one)."""
    torch._dynamo.reset()
    autocast_dtype, scaled = PRECISIONS[precision]
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu") if scaled else None
    forward = torch.compile(model, backend="adreno", options=options, dynamic=False)
    opt.step = torch.compile(opt.step, backend="adreno", options=options)  # type: ignore[method-assign]

    def step() -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
            loss = F.cross_entropy(forward(x.clone()), y.clone())
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    return step, scaler


def measure(model_name: str, precision: str, steps: int, options: dict[str, Any]) -> dict[str, Any]:
    step, scaler = training_step(model_name, precision, options)
    for _ in range(2):
        step()
    scale = scaler.get_scale() if scaler is not None else None
    with torch_adreno.profile() as prof:
        profiled_loss = float(step().detach())
    # A step GradScaler skips (a gradient overflowed) runs no optimizer kernels: its bytes are not a step's.
    skipped = scaler is not None and scale is not None and scaler.get_scale() < scale
    if skipped or not math.isfinite(profiled_loss):
        print(f"warning: {model_name} {precision}: the profiled step was skipped or its loss is {profiled_loss}: "
              "its kernel bytes leave out the optimizer step", file=sys.stderr)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        float(step().detach())
        times.append(time.perf_counter() - start)
    return {
        "model": model_name, "precision": precision, "options": options,
        "kernel_bytes": prof.bytes_kernel_read + prof.bytes_kernel_written,
        "kernel_bytes_read": prof.bytes_kernel_read, "kernel_bytes_written": prof.bytes_kernel_written,
        "kernel_launches": prof.kernel_launches, "host_fallback_ops": len(prof.host_fallback_ops),
        "step_ms_median": 1e3 * statistics.median(times), "steps_timed": steps,
        "profiled_loss": profiled_loss, "profiled_step_skipped": skipped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet", "resnet_mini", "transformer"])
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row (default: %(default)s)")
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "precision.jsonl")
    args = parser.parse_args()
    options = {"device": args.device} if args.device is not None else {}
    context = run_context(args.device)
    print(f"device: {context['device']} ({context['platform']})")
    print(f"{'model':<12} {'precision':<14} {'kernel MB/step':>14} {'vs float32':>10} {'launches':>8} "
          f"{'step ms':>9} {'vs float32':>10} {'fallbacks':>9}")
    for model in args.models:
        rows = [measure(model, p, args.steps, options) for p in args.precisions]
        base = next((r for r in rows if r["precision"] == "float32"), None)
        for r in rows:
            r["bytes_vs_float32"] = r["kernel_bytes"] / base["kernel_bytes"] if base else None
            r["time_vs_float32"] = r["step_ms_median"] / base["step_ms_median"] if base else None
            ratio = f"{r['bytes_vs_float32']:.2f}x" if base else "n/a"
            time_ratio = f"{r['time_vs_float32']:.2f}x" if base else "n/a"
            print(f"{model:<12} {r['precision']:<14} {r['kernel_bytes'] / 1e6:>14.2f} {ratio:>10} "
                  f"{r['kernel_launches']:>8} {r['step_ms_median']:>9.1f} {time_ratio:>10} {r['host_fallback_ops']:>9}")
        append_jsonl(args.out, [{**r, **context, "benchmark": "precision"} for r in rows])


if __name__ == "__main__":
    main()
