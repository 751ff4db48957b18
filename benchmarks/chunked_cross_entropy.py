"""GPT-2 LoRA (benchmarks/gpt2_lora.py) with its tied 50,257-word head and cross-entropy fused and
chunked (``chunked_cross_entropy``) or not: memory and kernel bytes of a replayed TrainingStep.

Variants, each in the same process from the same initial weights and batch: ``unfused``
(``chunked_cross_entropy=False``: the head's GEMM writes the ``tokens x vocab`` float32 logits,
which the forward keeps for the backward) and ``fused`` (the default chunk budget, 32 MB of
float32 logits per chunk); ``--budgets`` adds fused runs with other budgets (bytes per chunk).
Per variant: the replay's arena bytes and the whole step's device footprint
(``TrainingStep.device_footprint``: persistent state, the replay's arena, and the compiled graphs'
own arenas, which stay allocated beside the replay), the compiled graphs' planned peak (``profile()``'s
``step_peak_device_bytes``, the captured step's graphs run in order), the largest bytes one
kernel wrote, kernel bytes read and written per replayed step, launches, the median step time
and the losses. ``--autocast bf16`` runs the model under bfloat16 autocast (the head's GEMM in
16 bits reading the frozen copy of the table).

    python benchmarks/chunked_cross_entropy.py                 # PoCL: 2 layers, d 128, full vocabulary, 512 tokens
    python benchmarks/chunked_cross_entropy.py --full          # GPT-2 124M, seq 256, batch 4 (a GPU)

Appends JSON lines to benchmarks/results/<device>/chunked_cross_entropy.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context
from gpt2_lora import FULL, GPT2Config, gpt2_lora, lm_loss, token_batch, trainable_parameters

import torch_adreno

#: On PoCL: GPT-2's full vocabulary behind a model a 2-core CPU compiles and runs in minutes.
REDUCED = GPT2Config(layers=2, d=128, heads=4, positions=128, seq=128, batch=4)


def _loss(autocast: torch.dtype | None, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        return lm_loss(model, x, y)


def measure(cfg: GPT2Config, option: bool | int | str, steps: int, options: dict[str, Any],
            autocast: torch.dtype | None) -> dict[str, Any]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = gpt2_lora(cfg)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    step = torch_adreno.TrainingStep(model, functools.partial(_loss, autocast), optimizer,
                                     {**options, "chunked_cross_entropy": option})
    batch = token_batch(cfg, torch.Generator().manual_seed(0))
    started = time.perf_counter()
    with torch_adreno.profile() as compiled:
        losses = [float(step(*batch))]  # compile (the graphs run once, their plans in the profile)
    losses.append(float(step(*batch)))  # capture
    warm_s = time.perf_counter() - started
    with torch_adreno.profile() as prof:
        losses.append(float(step(*batch)))
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        losses.append(float(step(*batch)))
        times.append(time.perf_counter() - begin)
    footprint = step.device_footprint
    step.close()
    loss_graphs = [k for k in compiled.kernels if k.graph.startswith(("forward", "backward"))]
    return {
        "chunked_cross_entropy": option, "autocast": str(autocast) if autocast else None,
        "logits_bytes_float32": cfg.batch * cfg.seq * cfg.vocab * 4,
        "replayed": prof.replayed_steps == 1, "launches": prof.kernel_launches,
        "graphs_planned_peak_bytes": compiled.step_peak_device_bytes(),
        "largest_kernel_write_bytes": max(k.bytes_written for k in loss_graphs),
        "replay_arena_bytes": footprint.arena_bytes if footprint else None,
        "step_footprint_bytes": footprint.total_bytes if footprint else None,
        "persistent_bytes": footprint.persistent_bytes if footprint else None,
        "compiled_graph_arena_bytes": footprint.graph_arena_bytes if footprint else None,
        "kernel_bytes_read": prof.bytes_kernel_read, "kernel_bytes_written": prof.bytes_kernel_written,
        "device_ms": prof.device_time_us / 1e3, "median_step_ms": 1e3 * statistics.median(times),
        "compile_and_capture_s": warm_s, "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="GPT-2 124M (FULL) instead of the reduced model")
    parser.add_argument("--budgets", nargs="*", type=int, default=[], help="more fused runs, bytes of logits per chunk")
    parser.add_argument("--autocast", choices=["bf16"], default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "chunked_cross_entropy.jsonl")
    args = parser.parse_args()
    cfg = FULL if args.full else REDUCED
    autocast = torch.bfloat16 if args.autocast == "bf16" else None
    options = {"device": device_arg(args.device)}
    context = {**run_context(options["device"]), "benchmark": "chunked_cross_entropy",
               "shape": dataclasses.asdict(cfg), "full": args.full}
    rows = [{**context, **measure(cfg, option, args.steps, options, autocast)}
            for option in (False, True, *args.budgets)]
    base = rows[0]
    print(f"{'option':>10s} {'arena MB':>9s} {'footprint MB':>12s} {'peak MB':>8s} {'largest write MB':>16s} "
          f"{'kernel MB':>9s} {'x unfused':>9s} {'step ms':>8s}")
    for r in rows:
        total = r["kernel_bytes_read"] + r["kernel_bytes_written"]
        r["kernel_bytes_over_unfused"] = total / (base["kernel_bytes_read"] + base["kernel_bytes_written"])
        print(f"{r['chunked_cross_entropy']!s:>10s} {r['replay_arena_bytes'] / 1e6:9.2f} "
              f"{r['step_footprint_bytes'] / 1e6:12.2f} {r['graphs_planned_peak_bytes'] / 1e6:8.2f} "
              f"{r['largest_kernel_write_bytes'] / 1e6:16.2f} {total / 1e6:9.1f} {r['kernel_bytes_over_unfused']:9.3f} "
              f"{r['median_step_ms']:8.1f}")
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
