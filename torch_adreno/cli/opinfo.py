"""``opinfo``: PyTorch's OpInfo samples (and error inputs) of every claimed op through the backend.

The harness (:mod:`torch_adreno.tools.testing`) reads PyTorch's OpInfo database when a sweep starts,
which needs ``expecttest`` (the ``test`` extra)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from torch_adreno.cli.arguments import add_device_argument, backend_options, refuse_bad_device
from torch_adreno.tools.testing.opinfo import (
    INTERNAL_ERROR,
    SWEEP_DTYPES,
    WRONG_RESULT,
    OpReport,
    format_reports,
    sweep,
)
from torch_adreno.tools.testing.opinfo_errors import ErrorOutcome, error_sweep, format_error_reports


def register(sub: argparse._SubParsersAction) -> None:
    opinfo = sub.add_parser("opinfo", help="PyTorch's OpInfo samples for every claimed op: pass/fail per op")
    opinfo.add_argument("--ops", nargs="+", default=None, help="OpInfo names (default: every claimed op)")
    opinfo.add_argument("--samples", type=int, default=None, help="samples per op (default: all)")
    opinfo.add_argument("--failures", action="store_true", help="list every failing sample with its reason")
    opinfo.add_argument("--all-samples", action="store_true",
                        help="every sample, also of entries whose grid the sweep strides over (max pooling)")
    opinfo.add_argument("--shard", default="0/1", help="i/n: run every n-th op from the i-th (parallel sweeps)")
    opinfo.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="dtype of the samples (default: %(default)s); float16/bfloat16 take the claimed ops "
                             "whose OpInfo lists that dtype on the CPU, judged against eager in that dtype")
    opinfo.add_argument("--jsonl", default=None, help="append one JSON line per sample to this file")
    opinfo.add_argument("--database", action="store_true",
                        help="every OpInfo entry, claimed or not: counts pass / clear error / not traceable / "
                             "internal error / wrong result apart; fails on internal errors and wrong results")
    opinfo.add_argument("--error-inputs", action="store_true",
                        help="OpInfo's error inputs and mixed-dtype operands of every claimed op: the compiled "
                             "call must raise what eager raises (same exception type)")
    add_device_argument(opinfo)
    opinfo.set_defaults(fn=cmd_opinfo)


def cmd_opinfo(args: argparse.Namespace) -> int:
    if refuse_bad_device(args.device):
        return 2
    options = backend_options(args)
    index, _, count = args.shard.partition("/")
    if args.error_inputs:
        def write_case(outcome: ErrorOutcome) -> None:
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(dataclasses.asdict(outcome)) + "\n")

        error_reports = error_sweep(args.ops, shard=(int(index), int(count or 1)), on_case=write_case,
                                    options=options)
        print(format_error_reports(error_reports, failures=args.failures))
        return 1 if any(not o.agrees and not o.known for r in error_reports for o in r) else 0

    def write_jsonl(report: OpReport) -> None:
        with open(args.jsonl, "a") as f:
            for o in report.outcomes:
                f.write(json.dumps(dataclasses.asdict(o)) + "\n")

    reports = sweep(args.ops, args.samples, shard=(int(index), int(count or 1)),
                    on_report=write_jsonl if args.jsonl else None, all_samples=args.all_samples,
                    database=args.database, dtype=SWEEP_DTYPES[args.dtype], options=options)
    print(format_reports(reports))
    if args.failures:
        for r in reports:
            for o in r.counted:
                if not o.passed and (not args.database or o.kind in (INTERNAL_ERROR, WRONG_RESULT)):
                    print(f"{o.op}[{o.index}] {o.kind}: {o.reason}")
    if args.database:
        # Over the whole database unclaimed ops end in clear errors; only bugs fail the command.
        return 1 if any(o.kind in (INTERNAL_ERROR, WRONG_RESULT) for r in reports for o in r.outcomes) else 0
    # Unexpected failures make the command fail, so that it can gate a change.
    return 1 if any(r.unexpected for r in reports) else 0
