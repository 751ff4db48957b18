"""The command line, ``python -m torch_adreno <command>``: devices, ops, train (the digits demo),
finetune (LoRA on a causal LM, MobileNetV2 transfer learning), bench (the fusion-gain suite),
project (step times on Adreno targets), export (a training step as ONNX), opinfo (PyTorch's
OpInfo samples through the backend), modules (PyTorch's module database in training mode), zoo
(tiny transformers models trained against eager), federated (Flower) and native (build the native step runtime).

Each command lives in a module of this package that registers its parser (``register``) and runs
it (``cmd_<command>``). Every argument is checked when it is parsed
(:mod:`torch_adreno.cli.arguments`), and a device named on the command line is looked up before
any work starts, so bad input ends in one line saying what was wrong, with exit status 2, never
in a traceback or in a result computed from nothing."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

from torch_adreno.cli import bench, federated, finetune, info, modules, native, opinfo, train, zoo

DESCRIPTION = "torch_adreno, a torch.compile backend for OpenCL GPUs: its devices, ops, demo and benchmarks."
EPILOG = "Run `python -m torch_adreno <command> --help` for a command's options and their defaults."

#: The command modules, in the order ``--help`` lists their commands.
COMMANDS = (info, train, finetune, bench, opinfo, modules, zoo, federated, native)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_adreno", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for command in COMMANDS:
        command.register(sub)
    args = parser.parse_args(argv)
    with _progress_shown():
        return int(args.fn(args))


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a line is logged (a stream bound once may have been
    replaced and closed since: the command run in-process, its output captured)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


@contextlib.contextmanager
def _progress_shown() -> Iterator[None]:
    """The package's INFO lines (a step compiling or capturing, and what it cost) on stderr while a
    command runs, where the commands' progress goes, unless the process configured that logger
    itself; as it was afterwards (a command run in-process leaves the caller's logging alone)."""
    logger = logging.getLogger("torch_adreno")
    if logger.handlers or logger.level != logging.NOTSET:
        yield
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


if __name__ == "__main__":
    sys.exit(main())
