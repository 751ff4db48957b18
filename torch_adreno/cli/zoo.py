"""``zoo``: tiny random configurations of ``transformers`` architectures (causal LMs, encoders,
seq2seq, speech, vision) trained a few steps with a replayed ``TrainingStep`` against eager
PyTorch; a table of how far each came from eager, and why a model that does not pass does not
(:mod:`torch_adreno.tools.testing.zoo_runner`). Nothing is downloaded."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from torch_adreno.cli.arguments import add_device_argument, backend_options, positive_int, refuse_bad_device
from torch_adreno.tools.testing.zoo import ZOO
from torch_adreno.tools.testing.zoo_runner import (
    DEFAULT_STEPS,
    INTERNAL,
    WRONG,
    ZooResult,
    format_results,
    run_zoo,
)


def register(sub: argparse._SubParsersAction) -> None:
    zoo = sub.add_parser("zoo", help="tiny random transformers models trained with a TrainingStep against eager: "
                         "a table of pass / refused / graph break / wrong")
    zoo.add_argument("--models", nargs="+", choices=[m.name for m in ZOO], default=None, metavar="MODEL",
                     help=f"the models to run, of: {', '.join(m.name for m in ZOO)} (default: all)")
    zoo.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                     help="training steps per model; the first compiles, the second captures, the rest replay "
                     "(default: %(default)s)")
    zoo.add_argument("--json", type=Path, default=None, help="also write the results to this file as a JSON list")
    add_device_argument(zoo)
    zoo.set_defaults(fn=cmd_zoo)


def cmd_zoo(args: argparse.Namespace) -> int:
    if refuse_bad_device(args.device):
        return 2
    results: list[ZooResult] = []

    def keep(result: ZooResult) -> None:
        results.append(result)
        if args.json is not None:  # (rewritten after each model: a run cut short keeps what it measured)
            args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")

    run_zoo(args.models, args.steps, backend_options(args), on_result=keep)
    print(format_results(results))
    # Wrong results and internal errors are bugs of ours: they fail the command.
    return 1 if any(r.status in (WRONG, INTERNAL) for r in results) else 0
