"""Argument types of the command line: every argument is checked when it is parsed, so bad input
ends in one line saying what was wrong (exit status 2), never in a traceback."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_adreno.errors import AdrenoError
from torch_adreno.runtime.device import select_device

DEVICE_HELP = "device index or name substring (`devices` lists them; default: the first GPU)"


def bounded(kind: Callable[[str], int | float], name: str, low: float, inclusive: bool = True
             ) -> Callable[[str], int | float]:
    """An argparse type: ``kind`` (int or float) of ``text`` that is finite and >= ``low``
    (> ``low`` unless ``inclusive``); anything else is refused with what was expected."""
    bound = f">= {low:g}" if inclusive else f"> {low:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name} {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {name} {bound}, got {text!r}")
        return value

    parse.__name__ = name  # argparse names the type in its own messages
    return parse


positive_int = bounded(int, "an integer", 1)
seed_int = bounded(int, "an integer", 0)
positive_float = bounded(float, "a number", 0.0, inclusive=False)


def device_spec(text: str) -> str | int:
    """A device index (digits) or a non-empty name substring, as the ``device`` option takes it."""
    text = text.strip()
    if not text:
        raise argparse.ArgumentTypeError(
            "expected a device index or a name substring; `python -m torch_adreno devices` lists them")
    return int(text) if text.isdigit() else text


def output_dir(text: str) -> Path:
    """A directory to write into: it may not exist yet, but it may not be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory")
    return path


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--device``: the OpenCL device everything the command compiles and runs uses."""
    parser.add_argument("--device", type=device_spec, default=None, help=DEVICE_HELP)


def backend_options(args: argparse.Namespace, target: str | None = None) -> dict[str, Any]:
    """The backend options a command's arguments choose: its ``--device`` and a compile ``target``.

    The one place where the command line's device becomes options: every ``torch.compile``,
    ``TrainingStep`` and sweep a command runs takes these (never the default device), so that all
    its kernels run on the device named. Without ``--device`` the option is left out, and the
    backend's own rule picks (``TORCH_ADRENO_DEVICE``, then the first GPU)."""
    options: dict[str, Any] = {}
    if args.device is not None:
        options["device"] = args.device
    if target is not None:
        options["target"] = target
    return options


def refuse_bad_device(spec: str | int | None) -> bool:
    """Whether ``spec`` names no OpenCL device (None: the default rule); if so the reason is printed.
    Checked before anything starts: a bad device would otherwise surface inside Dynamo's first compile."""
    try:
        select_device(spec)
    except AdrenoError as e:
        print(f"error: {e}", file=sys.stderr)
        return True
    return False


def address(text: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6) with a port in 1..65535."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return text.strip()


def share(text: str) -> float:
    """A number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value
