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

#: What a plain ``bench`` measures: about a minute on two CPU cores (PoCL), most of it compiling.
QUICK_MODELS, QUICK_STEPS = ["mlp", "lenet"], 10
#: What ``bench --full`` measures (the suite's recorded results): several minutes on a CPU.
FULL_MODELS, FULL_STEPS = ["mlp", "lenet", "resnet_mini", "transformer"], 20
#: Where results go unless ``--out`` says: a folder of the current directory.
DEFAULT_OUT = Path("torch_adreno_bench")


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="the fusion-gain suite: reference models x configurations -> JSON + plots")
    bench.add_argument("--full", action="store_true",
                       help=f"the whole suite: models {' '.join(FULL_MODELS)}, {FULL_STEPS} steps each (several "
                            f"minutes on a CPU; default: {' '.join(QUICK_MODELS)}, {QUICK_STEPS} steps, about a minute)")
    bench.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None, metavar="MODEL",
                       help=f"reference models to measure, of: {', '.join(sorted(MODELS))} "
                       f"(default: {' '.join(QUICK_MODELS)}; with --full: {' '.join(FULL_MODELS)})")
    bench.add_argument("--variants", nargs="+", choices=list(SUITE_VARIANTS), default=None, metavar="VARIANT",
                       help=f"configurations to measure, of: {', '.join(SUITE_VARIANTS)} (default: all)")
    bench.add_argument("--steps", type=positive_int, default=None,
                       help=f"timed training steps per model and variant (default: {QUICK_STEPS}; with --full: "
                            f"{FULL_STEPS})")
    where = bench.add_mutually_exclusive_group()
    add_device_argument(where)
    where.add_argument("--remote", type=address, default=None, metavar="HOST:PORT",
                       help="run the suite on the device of a step server (`torch-adreno-step serve`; adb forward "
                            "for a phone): each configuration as a TrainingStep compiled here and replayed there "
                            "(eager and CUDA peers are not run: they would measure this machine)")
    bench.add_argument("--out", type=output_dir, default=DEFAULT_OUT,
                       help="directory for suite.jsonl (appended to) and suite.png, made if missing "
                            "(default: %(default)s in the current directory)")
    bench.set_defaults(fn=cmd_bench)


def measured(args: argparse.Namespace) -> tuple[list[str], int]:
    """The models and timed steps a ``bench`` run measures: those named, else the quick run's or,
    with ``--full``, the whole suite's."""
    return (args.models or (FULL_MODELS if args.full else QUICK_MODELS),
            args.steps or (FULL_STEPS if args.full else QUICK_STEPS))


def cmd_bench(args: argparse.Namespace) -> int:
    device = f"remote:{args.remote}" if args.remote else args.device
    if args.remote is None and refuse_bad_device(args.device):
        return 2
    models, steps = measured(args)
    records = run_suite(models, steps, args.out, device, args.variants)
    print(summary_table(records))
    print(f"JSON lines: {args.out / 'suite.jsonl'}; plot: {args.out / 'suite.png'}")
    return 0
