"""Errors the user must act on.

TorchDynamo wraps a backend's exceptions in ``BackendCompilerFailed``; it lets its own
``ShortenTraceback`` family through. Our errors join that family where this torch has it, so the
user sees the ValueError or UnsupportedOpError itself, with its message on how to proceed.
"""

from __future__ import annotations

try:
    from torch._dynamo.exc import ShortenTraceback as _Passthrough

    _PASSTHROUGH = True
except ImportError:  # pragma: no cover - older torch
    _Passthrough = RuntimeError  # type: ignore[assignment,misc]
    _PASSTHROUGH = False


class AdrenoError(_Passthrough):
    """Base of torch_adreno's errors."""

    def __init__(self, message: str) -> None:
        if _PASSTHROUGH:
            super().__init__(message, first_useful_frame=None)
        else:
            super().__init__(message)  # type: ignore[call-arg]


class OptionError(AdrenoError, ValueError):
    """A backend option or its environment variable has an unknown name or a bad value."""


class LoweringError(AdrenoError):
    """A graph could not be lowered; the message names the op, FX node and user source line."""


class UnsupportedOpError(LoweringError):
    """An op, or a form of it, has no lowering (see the message for how to proceed)."""


class SymbolicShapeError(LoweringError):
    """A graph input has a symbolic size or value where kernels need concrete ones. The backend
    compiles such a graph once per concrete input shape, at its first calls, instead."""


class ShapeLimitError(AdrenoError):
    """A graph was called with more distinct input shapes than the backend compiles programs for;
    the message names the graph and the shapes seen."""


class DeviceNotFoundError(AdrenoError):
    """No OpenCL device matches the selection; the message lists the available ones."""


class AmbiguousDeviceError(DeviceNotFoundError):
    """A device name substring matches several devices; the message lists them."""


class KernelBuildError(AdrenoError):
    """The OpenCL compiler rejected a generated kernel (a bug: please report it with the message)."""


class DeviceMemoryError(AdrenoError, MemoryError):
    """A buffer does not fit the device's limits."""


class ReplayMismatchError(AdrenoError):
    """A replayed training step computed other results than the same step run through the compiled
    graphs (option ``verify_replay``); the message names the first kernel whose output differs."""
