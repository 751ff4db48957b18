"""What a :class:`~torch_adreno.TrainingStep` says when a batch unlike the ones before it fails.

A step compiles once per batch signature, so a batch of a new dtype, rank, device or shape is
traced anew; where the model cannot take it (float64 images into float32 weights, float targets
where a loss indexes with integers), Dynamo's error is a 150-250-line traceback about fake
tensors. :class:`BatchHistory` remembers the batch of the last step that ran through the compiled
graphs (a replayed step's batch is like the one it was captured from) and turns such a failure
into a :class:`~torch_adreno.errors.BatchError` naming the argument, what the steps before had,
what came, and the failure's own one-line reason. A batch that differs and works is no error:
a model may take several dtypes or ranks. Shape-only differences are explained only where the
model's ops refused them (a new batch size is common; a failure then may be ours to report).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torch_adreno.errors import TRAINING_STEP, AdrenoError, BatchError, UnsupportedOpError

_TORCH = str(Path(torch.__file__).resolve().parent)
_PACKAGE = str(Path(__file__).resolve().parents[1])
#: The logger on which torch's fake tensors print the traceback of a meta kernel that refused its
#: inputs, before the error itself is raised (and explained here).
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


@dataclass(frozen=True)
class ArgumentKind:
    """What a compiled step specialises on in one batch argument (``dtype`` None: not a tensor,
    ``device`` then holds its type's name)."""

    dtype: torch.dtype | None
    shape: tuple[int, ...]
    device: str

    @staticmethod
    def of(value: Any) -> ArgumentKind:
        if isinstance(value, torch.Tensor):
            return ArgumentKind(value.dtype, tuple(value.shape), str(value.device))
        return ArgumentKind(None, (), type(value).__name__)

    def describe(self) -> str:
        if self.dtype is None:
            return f"a {self.device}"
        return f"{str(self.dtype).removeprefix('torch.')} [{', '.join(map(str, self.shape))}] on {self.device}"


def _difference(before: ArgumentKind, now: ArgumentKind) -> tuple[str, str] | None:
    """What changed from ``before`` to ``now`` ("dtype", "rank", "device" or "shape") and how to
    give the argument what the steps before had; None if nothing did."""
    if before.dtype is None or now.dtype is None:
        return None if before == now else ("type", f"pass {before.describe()}")
    if now.device != before.device:
        return "device", f'.to("{before.device}")'
    if now.dtype != before.dtype:
        return "dtype", f".to({before.dtype})"
    if len(now.shape) != len(before.shape):
        return "rank", f"{len(before.shape)} dimensions"
    if now.shape != before.shape:
        return "shape", "a shape the model takes"
    return None


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, outermost first (Dynamo
    raises its TorchRuntimeError ``from None``, the op's own error still its context)."""
    chain = [error]
    while True:
        cause = error.__cause__ if error.__cause__ is not None else error.__context__
        if cause is None or cause in chain:
            return chain
        chain.append(cause)
        error = cause


def _root_reason(error: BaseException) -> str:
    """The innermost cause's type and first line (Dynamo wraps the op's own error twice)."""
    error = _causes(error)[-1]
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    line = line if len(line) <= 300 else line[:297] + "..."
    return f"{type(error).__name__}: {line}"


def _user_line(error: BaseException) -> str | None:
    """The innermost frame of the user's own code in Dynamo's record of where tracing failed."""
    stack = getattr(error, "real_stack", None) or []
    for frame in reversed(list(stack)):
        path = str(Path(frame.filename).resolve()) if frame.filename else ""
        if path and not path.startswith((_TORCH, _PACKAGE)):
            return f"{frame.filename}:{frame.lineno}"
    return None


def _refused_by_the_model(error: BaseException) -> bool:
    """Whether the model's own ops refused the inputs while Dynamo traced them on fake tensors."""
    return any(isinstance(seen, torch._dynamo.exc.TorchRuntimeError) for seen in _causes(error))


class _HeldRecords(logging.Filter):
    """Holds the records of a logger while installed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


class BatchHistory:
    """The last batch a step ran with, and the error for a later batch that differs and fails."""

    def __init__(self) -> None:
        self._last: tuple[ArgumentKind, ...] | None = None

    def explaining(self, batch: tuple[Any, ...]) -> _Explaining:
        """Around one step on ``batch``: remembers the batch if the step ran; if it raised, raises
        what :meth:`explain` makes of the error, or for an error of ours that the user is to fix
        (an op without a lowering, a bad option), the error itself with its advice written for a
        TrainingStep, without the frames of Dynamo and of the step (``TORCHDYNAMO_VERBOSE=1``
        keeps them)."""
        return _Explaining(self, batch)

    def ran(self, batch: tuple[Any, ...]) -> None:
        self._last = tuple(ArgumentKind.of(value) for value in batch)

    def differs(self, batch: tuple[Any, ...]) -> bool:
        return self._last is not None and self._last != tuple(ArgumentKind.of(value) for value in batch)

    def explain(self, batch: tuple[Any, ...], error: BaseException) -> BatchError | None:
        """The error to raise instead of ``error``, raised by a step on ``batch``; None where the
        batch is like the last one, the error is already one of ours, or only shapes changed and
        the model's ops did not refuse them."""
        if self._last is None or isinstance(error, AdrenoError) or not isinstance(error, Exception):
            return None
        if len(batch) != len(self._last):
            changes, kinds = [f"it has {len(batch)} arguments where the steps before had {len(self._last)}"], {"count"}
            advice: list[str] = []
        else:
            changes, kinds, advice = [], set(), []
            for position, (before, value) in enumerate(zip(self._last, batch, strict=True)):
                now = ArgumentKind.of(value)
                difference = _difference(before, now)
                if difference is not None:
                    kinds.add(difference[0])
                    changes.append(f"argument {position} is {now.describe()} where the steps before had "
                                   f"{before.describe()}")
                    advice.append(f"argument {position}: {difference[1]}")
        if not changes or (kinds == {"shape"} and not _refused_by_the_model(error)):
            return None
        where = _user_line(error)
        failure = _root_reason(error) + (f" (at {where})" if where else "")
        return BatchError(f"TrainingStep: this batch differs from the one before, and the step fails on it: {failure}. "
                          + "; ".join(changes) + "." + (f" As before: {'; '.join(advice)}." if advice else ""))


class _Explaining:
    """:meth:`BatchHistory.explaining`. While a differing batch is traced, what torch's fake tensors
    log is held back: a meta kernel refusing its inputs logs a traceback of its own before the error
    explained here; it is printed only where the error is not explained."""

    def __init__(self, history: BatchHistory, batch: tuple[Any, ...]) -> None:
        self._history = history
        self._batch = batch
        self._held = _HeldRecords() if history.differs(batch) else None

    def __enter__(self) -> None:
        if self._held is not None:
            logging.getLogger(_FAKE_TENSOR_LOGGER).addFilter(self._held)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        explained: AdrenoError | None = None
        if error is None:
            self._history.ran(self._batch)
        else:
            explained = self._history.explain(self._batch, error)
            if explained is None and isinstance(error, UnsupportedOpError):
                explained = error.for_api(TRAINING_STEP)
            if explained is None and isinstance(error, AdrenoError) and error.users_to_fix:
                explained = error
            if torch._dynamo.config.verbose and explained is error:
                explained = None
        if self._held is not None:
            logger = logging.getLogger(_FAKE_TENSOR_LOGGER)
            logger.removeFilter(self._held)
            for record in self._held.records if explained is None else ():
                logger.handle(record)
        if explained is not None:
            raise explained.with_traceback(None) from None
