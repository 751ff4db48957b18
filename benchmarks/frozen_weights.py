"""GPT-2 LoRA (benchmarks/gpt2_lora.py) through TrainingStep per precision of its frozen base: kernel
bytes per replayed step, the frozen copies made, the device bytes of the persistent state.

Variants, each in the same process from the same initial weights and batch:

- ``float32``: no autocast;
- ``bf16_casts_in_kernels``: bfloat16 autocast, ``frozen_casts=False``: every step casts the frozen
  base weights again (in the GEMMs' operand loads: they read float32);
- ``bf16_frozen_copies``: bfloat16 autocast, the default: each frozen weight cast once and kept;
- ``bf16_freeze`` / ``fp16_freeze``: ``torch_adreno.freeze(model, dtype)``, then autocast of that
  dtype: the base stored in 16 bits from the start (float16 without a GradScaler: a LoRA's loss
  and gradients stay far from float16's range here).

Per variant: kernel bytes read/written of one replayed step (``torch_adreno.profile()``), their
ratio to float32's, launches, the median wall time of ``--steps`` replayed steps, the frozen
copies made during them (0: made once, before), host-to-device bytes per step, the persistent
device bytes the replay binds (parameters, copies, optimizer state; copy mode only: with zero-copy
they are host memory) and the losses.

    python benchmarks/frozen_weights.py --small                 # PoCL: 4 layers, d 256, 256 tokens
    python benchmarks/frozen_weights.py --small --layers 2 --vocab 50257 --steps 1   # GPT-2's vocabulary
    source .gpu/env.sh && python benchmarks/frozen_weights.py --device NVIDIA    # GPT-2 124M, seq 256, batch 4
    python benchmarks/frozen_weights.py --plan-as h200 --layers 1 --steps 1     # the H200's plan, bytes only, on a CPU

Appends JSON lines to benchmarks/results/<device>/frozen_weights.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import gemm_shapes
from common import DEVICE, PLANS, RESULTS, append_jsonl, device_arg, plan_as, run_context
from gpt2_lora import FULL, GPT2Config, gpt2_lora, lm_loss, token_batch, trainable_parameters
from workloads import breakdown

import torch_adreno
from torch_adreno.replay.capture import PERSISTENT
from torch_adreno.runtime.frozen import FROZEN_COPIES

#: On PoCL: GPT-2's shape at a size a 2-core CPU compiles and runs in a few minutes.
SMALL = GPT2Config(layers=4, d=256, heads=4, vocab=4096, positions=128, seq=128, batch=2)

#: variant -> (autocast dtype or None, freeze the base to that dtype, frozen_casts option)
VARIANTS: dict[str, tuple[torch.dtype | None, bool, bool]] = {
    "float32": (None, False, True),
    "bf16_casts_in_kernels": (torch.bfloat16, False, False),
    "bf16_frozen_copies": (torch.bfloat16, False, True),
    "bf16_freeze": (torch.bfloat16, True, True),
    "fp16_freeze": (torch.float16, True, True),
}


def measure(cfg: GPT2Config, variant: str, steps: int, options: dict[str, Any], kernel_rows: int = 12) -> dict[str, Any]:
    torch._dynamo.reset()
    dtype, freeze, frozen_casts = VARIANTS[variant]
    torch.manual_seed(0)
    model = gpt2_lora(cfg)
    if freeze:
        assert dtype is not None
        torch_adreno.freeze(model, dtype)

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return lm_loss(m, x, y)

    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    step = torch_adreno.TrainingStep(model, loss_fn, optimizer, {**options, "frozen_casts": frozen_casts})
    batch = token_batch(cfg, torch.Generator().manual_seed(0))
    started = time.perf_counter()
    losses = [float(step(*batch)) for _ in range(2)]  # compile, then capture
    warm_s = time.perf_counter() - started
    made = FROZEN_COPIES.copies_made
    times = []
    with torch_adreno.profile() as prof:
        losses.append(float(step(*batch)))
    for _ in range(steps):
        begin = time.perf_counter()
        losses.append(float(step(*batch)))
        times.append(time.perf_counter() - begin)
    replay = step.replay
    persistent = sum(i.nbytes for i in replay.recording.identities if i.kind is PERSISTENT) if replay else None
    step.close()
    return {
        "variant": variant, "autocast": str(dtype) if dtype else None, "freeze": freeze, "frozen_casts": frozen_casts,
        "replayed": prof.replayed_steps == 1, "launches": prof.kernel_launches,
        "kernel_bytes_read": prof.bytes_kernel_read, "kernel_bytes_written": prof.bytes_kernel_written,
        "h2d_bytes": prof.bytes_host_to_device, "device_ms": prof.device_time_us / 1e3,
        "median_step_ms": 1e3 * statistics.median(times), "copies_made_in_timed_steps": FROZEN_COPIES.copies_made - made,
        "persistent_device_bytes": persistent, "compile_and_capture_s": warm_s, "losses": losses,
        **{key: value for key, value in breakdown(prof, kernel_rows).items() if key.startswith("by_")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="the PoCL-sized model (SMALL) instead of GPT-2 124M")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--zero-copy", default="auto", choices=["auto", "true", "false"],
                        help="the zero_copy option (false: device copies, whose bytes persistent_device_bytes counts)")
    parser.add_argument("--unfilled", action="store_true",
                        help="without the k split of GEMMs of few 128 x 128 tiles (fusion.split_k's fill): its "
                             "float32 slice sums are bytes both precisions move")
    parser.add_argument("--heuristics", default="heuristic", choices=list(gemm_shapes.VARIANTS),
                        help="compile under one of benchmarks/gemm_shapes.py's GEMM heuristic variants")
    parser.add_argument("--tune", action="store_true", help="compile with tune=True (each kernel's tiling measured)")
    parser.add_argument("--kernel-rows", type=int, default=12,
                        help="the ops and kernels the breakdown lists, the most time-consuming first")
    parser.add_argument("--layers", type=int, default=None, help="the chosen model's blocks, this many instead")
    parser.add_argument("--vocab", type=int, default=None, help="the chosen model's vocabulary, this large instead")
    parser.add_argument("--plan-as", choices=sorted(PLANS), default=None,
                        help="plan the kernels for this device while running them on --device: its kernel bytes "
                             "and launches (a CPU's run of the H200's plan; times mean nothing then)")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "frozen_weights.jsonl")
    args = parser.parse_args()
    cfg = SMALL if args.small else FULL
    cfg = dataclasses.replace(cfg, **{k: v for k, v in (("layers", args.layers), ("vocab", args.vocab)) if v is not None})
    options = {"device": device_arg(args.device), "zero_copy": args.zero_copy}
    plan_as(options["device"], args.plan_as)
    if args.tune:
        options["tune"] = True
    if args.heuristics != "heuristic" or args.unfilled:
        options["compile_cache"] = False  # (the disk cache's keys do not see the patched heuristics)
    context = {**run_context(options["device"]), "benchmark": "frozen_weights", "shape": dataclasses.asdict(cfg),
               "small": args.small, "zero_copy": args.zero_copy, "plan_as": args.plan_as}
    if args.unfilled:
        gemm_shapes.unfilled()
    context["unfilled"] = args.unfilled
    context["heuristics"], context["tune"] = args.heuristics, args.tune
    rows = []
    with gemm_shapes.heuristics(args.heuristics):
        for variant in args.variants:
            row = {**context, **measure(cfg, variant, args.steps, options, args.kernel_rows)}
            rows.append(row)
    base = next((r for r in rows if r["variant"] == "float32"), None)
    print(f"{'variant':24s} {'read MB':>9s} {'written MB':>10s} {'x f32':>6s} {'launches':>8s} {'step ms':>8s} "
          f"{'copies':>6s} {'state MB':>9s}")
    for r in rows:
        total = r["kernel_bytes_read"] + r["kernel_bytes_written"]
        ratio = total / (base["kernel_bytes_read"] + base["kernel_bytes_written"]) if base else float("nan")
        r["bytes_over_float32"] = ratio
        state = r["persistent_device_bytes"]
        print(f"{r['variant']:24s} {r['kernel_bytes_read'] / 1e6:9.2f} {r['kernel_bytes_written'] / 1e6:10.2f} "
              f"{ratio:6.3f} {r['launches']:8d} {r['median_step_ms']:8.1f} {r['copies_made_in_timed_steps']:6d} "
              f"{state / 1e6 if state is not None else float('nan'):9.2f}")
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
