"""Training loops as people write them, timed: what a schedule, varying lengths and a first call
cost a replayed TrainingStep.

    python benchmarks/training_loops.py --device Intel      # to benchmarks/results/<device>/training_loops.jsonl

Studies (JSON lines, one record each; no assertions, these machines are shared):

- ``schedule``: a small causal LM, AdamW, 40 steps of one batch geometry with and without a
  ``CosineAnnealingLR`` stepped every step (float and tensor learning rates): replayed steps and
  the median replayed step time; ``ratio_to_no_schedule`` compares the two.
- ``lengths``: six sequence lengths cycling over 36 steps, as they come and padded to three
  buckets (:class:`torch_adreno.Buckets`): replayed steps, total seconds, and the seconds of each
  geometry's first call (compile) and second call (capture).
- ``first_calls``: the same LM's first call (compile), second (capture) and third (replay).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno

VOCAB = 64


class TinyLM(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(VOCAB, width), nn.Embedding(128, width)
        self.block = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True,
                                                norm_first=True)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        hidden = self.tokens(ids) + self.positions(torch.arange(length))
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        return self.head(self.block(hidden, src_mask=mask, is_causal=True))


def lm_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)


def _timed(step: torch_adreno.TrainingStep, batch: tuple[torch.Tensor, ...]) -> float:
    start = time.perf_counter()
    step(*batch)
    return time.perf_counter() - start


def schedule_study(options: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    records = []
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 32), generator=generator)
    for kind in ("none", "float", "tensor"):
        torch._dynamo.reset()
        model = TinyLM()
        lr: float | torch.Tensor = torch.tensor(1e-3) if kind == "tensor" else 1e-3
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if kind != "none" else None
        times = []
        with torch_adreno.TrainingStep(model, lm_loss, opt, options=options) as step:
            for index in range(steps):
                seconds = _timed(step, (ids, ids))
                if index >= 2:
                    times.append(seconds)
                if sched is not None:
                    sched.step()
            replayed = step.replayed_steps
        records.append({"study": "schedule", "schedule": kind, "steps": steps, "replayed": replayed,
                        "median_replayed_ms": 1e3 * statistics.median(times)})
    baseline = records[0]["median_replayed_ms"]
    for record in records:
        record["ratio_to_no_schedule"] = record["median_replayed_ms"] / baseline
    return records


def lengths_study(options: dict[str, Any]) -> list[dict[str, Any]]:
    lengths = [12, 16, 20, 24, 28, 32]
    records = []
    for bucketed in (False, True):
        torch._dynamo.reset()
        model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        buckets = torch_adreno.Buckets((16, 24, 32), pad={0: 0, 1: -100}) if bucketed else None
        generator = torch.Generator().manual_seed(0)
        seconds: list[float] = []
        start = time.perf_counter()
        with torch_adreno.TrainingStep(model, lm_loss, opt, options=options) as step:
            for index in range(36):
                ids = torch.randint(0, VOCAB, (4, lengths[index % len(lengths)]), generator=generator)
                batch = buckets((ids, ids)) if buckets is not None else (ids, ids)
                seconds.append(_timed(step, batch))
            replayed = step.replayed_steps
        records.append({"study": "lengths", "bucketed": bucketed, "steps": 36, "replayed": replayed,
                        "total_s": time.perf_counter() - start, "first_12_calls_s": seconds[:12],
                        "median_last_12_ms": 1e3 * statistics.median(seconds[-12:])})
    return records


def first_calls_study(options: dict[str, Any]) -> list[dict[str, Any]]:
    torch._dynamo.reset()
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (8, 32), generator=torch.Generator().manual_seed(0))
    with torch_adreno.TrainingStep(model, lm_loss, opt, options=options) as step:
        calls = [_timed(step, (ids, ids)) for _ in range(3)]
    return [{"study": "first_calls", "compile_s": calls[0], "capture_s": calls[1], "replay_s": calls[2],
             "options": options}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="OpenCL device (index or name substring)")
    parser.add_argument("--steps", type=int, default=40, help="steps of the schedule study")
    parser.add_argument("--studies", nargs="+", default=["schedule", "lengths", "first_calls"],
                        choices=["schedule", "lengths", "first_calls"])
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "training_loops.jsonl", help="JSON lines file")
    args = parser.parse_args()
    device = device_arg(args.device)
    options: dict[str, Any] = {} if device is None else {"device": device}
    context = run_context(device)
    records: list[dict[str, Any]] = []
    if "first_calls" in args.studies:
        records += first_calls_study(options)
    if "schedule" in args.studies:
        records += schedule_study(options, args.steps)
    if "lengths" in args.studies:
        records += lengths_study(options)
    records = [{**context, **r} for r in records]
    out = append_jsonl(args.out, records)
    for r in records:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k not in context})
    print(f"written to {out}")


if __name__ == "__main__":
    main()
