"""``bench``: the fusion-gain suite (reference models x configurations -> JSON lines and plots)."""

from __future__ import annotations

import argparse
from pathlib import Path

from torch_adreno.cli.arguments import (
    add_device_argument,
    address,
    output_dir,
    positive_int,
    refuse_bad_device,
)
from torch_adreno.models import MODELS
from torch_adreno.tools.bench.measure import SUITE_VARIANTS
from torch_adreno.tools.bench.suite import run_suite, summary_table


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="the fusion-gain suite: reference models x configurations -> JSON + plots")
    bench.add_argument("--models", nargs="+", choices=sorted(MODELS),
                       default=["mlp", "lenet", "resnet_mini", "transformer"], metavar="MODEL",
                       help=f"reference models to measure, of: {', '.join(sorted(MODELS))} "
                       "(default: %(default)s)")
    bench.add_argument("--variants", nargs="+", choices=list(SUITE_VARIANTS), default=None, metavar="VARIANT",
                       help=f"configurations to measure, of: {', '.join(SUITE_VARIANTS)} (default: all)")
    bench.add_argument("--steps", type=positive_int, default=20, help="timed training steps per model and variant (default: %(default)s)")
    where = bench.add_mutually_exclusive_group()
    add_device_argument(where)
    where.add_argument("--remote", type=address, default=None, metavar="HOST:PORT",
                       help="run the suite on the device of a step server (`torch-adreno-step serve`; adb forward "
                            "for a phone): each configuration as a TrainingStep compiled here and replayed there "
                            "(eager and CUDA peers are not run: they would measure this machine)")
    bench.add_argument("--out", type=output_dir, default=Path("benchmarks/results"),
                       help="directory for suite.jsonl (appended to) and suite.png (default: %(default)s)")
    bench.set_defaults(fn=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    device = f"remote:{args.remote}" if args.remote else args.device
    if args.remote is None and refuse_bad_device(args.device):
        return 2
    records = run_suite(args.models, args.steps, args.out, device, args.variants)
    print(summary_table(records))
    print(f"JSON lines: {args.out / 'suite.jsonl'}; plot: {args.out / 'suite.png'}")
    return 0
