"""``modules``: PyTorch's module database (``module_db``) through the backend in training mode.

Forward, input and parameter gradients, one SGD step and a second forward against eager; a sample
that does not pass runs under ``aot_eager`` too, so that PyTorch's own limits are told from ours
(:mod:`torch_adreno.tools.testing.modules`). Needs ``expecttest`` (the ``test`` extra)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from torch_adreno.cli.arguments import add_device_argument, backend_options, refuse_bad_device
from torch_adreno.tools.testing.modules import ModuleOutcome, format_outcomes, summary, sweep


def register(sub: argparse._SubParsersAction) -> None:
    modules = sub.add_parser("modules", help="PyTorch's module_db in training mode: pass / refused / wrong / crash")
    modules.add_argument("--modules", nargs="+", default=None, help="module_db names, e.g. nn.Linear (default: all)")
    modules.add_argument("--samples", type=int, default=None, help="samples per module (default: all)")
    modules.add_argument("--failures", action="store_true", help="list every sample that did not pass")
    modules.add_argument("--jsonl", default=None, help="append one JSON line per sample to this file")
    add_device_argument(modules)
    modules.set_defaults(fn=cmd_modules)


def cmd_modules(args: argparse.Namespace) -> int:
    if refuse_bad_device(args.device):
        return 2

    def write(outcome: ModuleOutcome) -> None:
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps({**dataclasses.asdict(outcome), "counted_as": outcome.counted_as}) + "\n")

    outcomes = sweep(args.modules, args.samples, on_outcome=write, options=backend_options(args))
    print(format_outcomes(outcomes, failures=args.failures))
    counts = summary(outcomes)
    # Wrong results and crashes that aot_eager does not share are ours: they fail the command.
    return 1 if counts["wrong"] or counts["crash"] else 0
