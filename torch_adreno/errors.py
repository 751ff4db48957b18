"""Errors the user must act on.

TorchDynamo wraps a backend's exceptions in ``BackendCompilerFailed``; it lets its own
``ShortenTraceback`` family through. Our errors join that family where this torch has it, so the
user sees the ValueError or UnsupportedOpError itself, with its message on how to proceed.

Importing Dynamo takes seconds, so this module does not: :class:`AdrenoError` derives from a
stand-in of ``ShortenTraceback`` with the same instance layout, which :func:`join_dynamo_family`
replaces by the real class once Dynamo is loaded (``torch_patches.install`` calls it when the
backend is first imported; no error of ours is raised under Dynamo before then). Every error
class, and every instance already made, is then a ``ShortenTraceback``: Dynamo's ``except`` and
``isinstance`` checks see it, and ``except OptionError`` etc. keep working unchanged.

Dynamo re-raises such an error at the compiled function's call after asking it to drop Dynamo's
frames (``remove_dynamo_frames``), and appends a note on ``TORCHDYNAMO_VERBOSE`` to its message.
Ours keep their own message, and an error the user causes keeps only the frame that raised it
(the user's call is above it): the message says what to do; ``TORCHDYNAMO_VERBOSE=1`` keeps every
frame. An error that is a bug of ours (:class:`KernelBuildError`) keeps torch_adreno's frames.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

_PACKAGE = str(Path(__file__).resolve().parent)

#: The entry points a message's advice is written for.
TORCH_COMPILE = "torch.compile"
TRAINING_STEP = "TrainingStep"


def options_call(api: str, options: str) -> str:
    """How a user of ``api`` passes ``options`` (a dict literal) to the backend."""
    if api == TRAINING_STEP:
        return f"torch_adreno.TrainingStep(model, loss_fn, optimizer, options={options})"
    return f"torch.compile(model, backend='adreno', options={options})"


def _ours(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_PACKAGE)


class _ShortenTracebackStandIn(RuntimeError):
    """Dynamo's ``ShortenTraceback`` until Dynamo is loaded: a Python subclass of RuntimeError
    like it (so that :func:`join_dynamo_family` may swap them), taking the same arguments."""

    def __init__(self, *args: Any, first_useful_frame: types.FrameType | None) -> None:
        super().__init__(*args)
        self.first_useful_frame = first_useful_frame


if TYPE_CHECKING:
    from torch._dynamo.exc import ShortenTraceback as _DynamoPassthrough
else:
    class _DynamoPassthrough(_ShortenTracebackStandIn):
        """The base :func:`join_dynamo_family` rebases from the stand-in onto ``ShortenTraceback``."""


def join_dynamo_family() -> bool:
    """Make every torch_adreno error a Dynamo ``ShortenTraceback`` (see the module docstring);
    imports Dynamo. Returns whether they are one (False on a torch without that class)."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # pragma: no cover - older torch: Dynamo wraps our errors
        return False
    if _DynamoPassthrough.__bases__ != (ShortenTraceback,):
        _DynamoPassthrough.__bases__ = (ShortenTraceback,)
    return True


class AdrenoError(_DynamoPassthrough):
    """Base of torch_adreno's errors."""

    #: Whether the error is the user's to fix (bad input, options, an op without a lowering), so
    #: that torch_adreno's frames are noise to them; False for our bugs.
    users_to_fix = True

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message, first_useful_frame=None)

    def __str__(self) -> str:
        # Dynamo appends its TORCHDYNAMO_VERBOSE note to args[0]: the note is about PyTorch's bugs.
        return self.message

    def remove_dynamo_frames(self) -> AdrenoError:
        """Dynamo's hook before it re-raises the error at the compiled function's call (see the
        module docstring): the traceback from there on without Dynamo's frames."""
        from torch._dynamo import config

        tb = self.__traceback__
        if tb is None or config.verbose:
            return self
        entries = []
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        if self.users_to_fix:
            return self.with_traceback(entries[-1])
        first_ours = next((entry for entry in entries if _ours(entry.tb_frame)), entries[-1])
        return self.with_traceback(first_ours)


class OptionError(AdrenoError, ValueError):
    """A backend option or its environment variable has an unknown name or a bad value."""


class LoweringError(AdrenoError):
    """A graph could not be lowered; the message names the op, FX node and user source line."""


class UnsupportedOpError(LoweringError):
    """An op, or a form of it, has no lowering (see the message for how to proceed).

    With ``host_fallback``, the message ends with the ways on: the option ``fallback='host'``
    written for the entry point in use (:meth:`for_api`), supported ops, or a report."""

    def __init__(self, message: str, *, host_fallback: bool = False, api: str = TORCH_COMPILE) -> None:
        self.problem = message
        self.host_fallback = host_fallback
        self.api = api
        super().__init__(message + (_host_fallback_advice(api) if host_fallback else ""))

    def for_api(self, api: str) -> UnsupportedOpError:
        """The same error with its advice written for ``api`` (:data:`TORCH_COMPILE` or
        :data:`TRAINING_STEP`)."""
        if not self.host_fallback or api == self.api:
            return self
        return type(self)(self.problem, host_fallback=True, api=api)


def _host_fallback_advice(api: str) -> str:
    replayed = " (a TrainingStep with host ops runs, but is not replayed)" if api == TRAINING_STEP else ""
    fallback = options_call(api, "{'fallback': 'host'}")
    return (
        "\nHow to proceed:\n"
        f"  * run this op on the host: {fallback}{replayed}\n"
        "    (warned once per op and counted in torch_adreno.profile().host_fallback_ops);\n"
        "  * or express the computation with supported ops (python -m torch_adreno ops lists them);\n"
        "  * or report the op so that a lowering can be added."
    )


class SymbolicShapeError(LoweringError):
    """A graph input has a symbolic size or value where kernels need concrete ones. The backend
    compiles such a graph once per concrete input shape, at its first calls, instead."""


class ShapeLimitError(AdrenoError):
    """A graph was called with more distinct input shapes than the backend compiles programs for;
    the message names the graph and the shapes seen."""


class BatchError(AdrenoError, ValueError):
    """A TrainingStep's batch differs from the batches of the steps before it (an argument's dtype,
    rank, device or shape) and the step fails on it; the message names the argument, what the
    steps before had and what came, and the failure."""


class DeviceNotFoundError(AdrenoError):
    """No OpenCL device matches the selection; the message lists the available ones."""


class AmbiguousDeviceError(DeviceNotFoundError):
    """A device name substring matches several devices; the message lists them."""


class KernelBuildError(AdrenoError):
    """The OpenCL compiler rejected a generated kernel (a bug: please report it with the message)."""

    users_to_fix = False


class DeviceMemoryError(AdrenoError, MemoryError):
    """A buffer does not fit the device's limits."""


class ReplayMismatchError(AdrenoError):
    """A replayed training step computed other results than the same step run through the compiled
    graphs (option ``verify_replay``); the message names the first kernel whose output differs."""

    users_to_fix = False
