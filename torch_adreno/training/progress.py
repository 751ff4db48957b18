"""What a TrainingStep's slow calls are doing, said in the ``torch_adreno`` log (level INFO).

The first call with a batch geometry compiles the step (Dynamo, AOTAutograd, our stages and the
OpenCL compiler: seconds, most of them the driver's compiler), the second captures its replay; a
user waiting on either should be told which, and what it cost. The command-line tools show these
lines; a program shows them with ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Hashable, Iterator

from torch_adreno.runtime.binary_cache import build_stats

_log = logging.getLogger("torch_adreno")


def describe_signature(signature: Hashable) -> str:
    """A call's replay key in words: the batch arguments' shapes (and the accumulation phase)."""
    batch, phase = signature if isinstance(signature, tuple) and len(signature) == 2 else (signature, None)
    shapes = [list(part[2]) for part in batch if isinstance(part, tuple) and len(part) == 6] \
        if isinstance(batch, tuple) else []
    words = "batch " + ", ".join(map(str, shapes)) if shapes else "this batch"
    return words if phase in (None, "whole") else f"{words} ({phase} call of an accumulation)"


@contextlib.contextmanager
def reported(kind: str, signature: Hashable | None) -> Iterator[None]:
    """Log the start and the cost of ``kind`` ("compiling" or "capturing") for ``signature``."""
    if not _log.isEnabledFor(logging.INFO):
        yield
        return
    what = describe_signature(signature) if signature is not None else "this batch"
    _log.info("TrainingStep: %s the step for %s ...", kind, what)
    before, start = build_stats(), time.perf_counter()
    yield
    after = build_stats()
    compiler = (after.source_seconds + after.store_seconds) - (before.source_seconds + before.store_seconds)
    built = after.programs_from_source - before.programs_from_source
    cached = after.programs_from_cache - before.programs_from_cache
    _log.info("TrainingStep: %s took %.1f s; %d OpenCL program(s) compiled (%.1f s in the driver's compiler), "
              "%d loaded from the binary cache", kind, time.perf_counter() - start, built, compiler, cached)


def slow_work(warm: bool, capturing: bool) -> str | None:
    """What a call through the compiled graphs will spend its time on, if anything slow."""
    if not warm:
        return "compiling"
    return "capturing" if capturing else None
