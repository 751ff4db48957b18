"""Gradients inside a :class:`torch_adreno.TrainingStep`: clipped on the device, unreadable after.

A step's gradients exist between its backward and its optimizer step only, on the device. What a
training loop does with gradients in that window (clipping, the one common case) is compiled into
the step here. After the step each parameter's ``.grad`` holds a :class:`GradientOnDevice`
marker instead of ``None``: reading it by mistake (``clip_grad_norm_`` after the step, a gradient
norm for logging) raises an error that says why, where ``None`` would silently mean "no
gradient" (``clip_grad_norm_`` returns 0).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch

from torch_adreno.training.host_sync import METADATA_FUNCTIONS

GRADIENTS_STAY_ON_THE_DEVICE = (
    "this parameter is trained by a torch_adreno.TrainingStep: its gradient existed on the device only, "
    "between the step's backward and its optimizer step, and was cleared after the step. To clip gradients, "
    "pass max_grad_norm= (and norm_type=) to TrainingStep; the step clips between backward and optimizer step, "
    "as clip_grad_norm_ would. (Assigning p.grad = None, or optimizer.zero_grad(), removes this marker.)"
)


def _tracing() -> bool:
    """Whether Dynamo or a fake-tensor trace is describing tensors (not user code reading values)."""
    return torch._guards.TracingContext.try_get() is not None or torch._C._get_dispatch_mode(
        torch._C._TorchDispatchModeKey.FAKE) is not None


#: What ``optimizer.zero_grad(set_to_none=False)`` does to a gradient: to a marker, nothing.
_CLEARING = frozenset({torch.Tensor.zero_, torch.Tensor.detach_, torch.Tensor.requires_grad_, torch._foreach_zero_})


class GradientOnDevice(torch.Tensor):
    """The ``.grad`` of a parameter after a TrainingStep: same shape, dtype and device as the
    parameter, no storage, and every use of its values (an op, ``numpy()``, ``print``) raises a
    RuntimeError explaining where the gradient went; metadata (shape, dtype) reads and zeroing
    (``optimizer.zero_grad(set_to_none=False)``) work. ``p.grad is None`` is false, so code skipping parameters
    without a gradient reaches the error instead of silently skipping all of them."""

    @staticmethod
    def __new__(cls, parameter: torch.Tensor) -> GradientOnDevice:
        # One zero broadcast to the parameter's shape: a real (one-element) storage, so that Dynamo
        # can describe it when it compiles a function reading the parameter between steps (torch
        # 2.11 turns a parameter's .grad into a fake tensor too); its values are never handed out.
        data = torch.zeros((), dtype=parameter.dtype, device=parameter.device).expand(parameter.shape)
        return torch.Tensor._make_subclass(cls, data, False)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _CLEARING:  # optimizer.zero_grad(set_to_none=False): zeroing no gradient is fine
            return args[0] if func is not torch._foreach_zero_ else None
        if func in METADATA_FUNCTIONS or torch.compiler.is_compiling() or _tracing():
            # Shape, dtype, ...: no use of the values (Dynamo describing a parameter it compiles
            # between steps looks at its .grad this way).
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        raise RuntimeError(GRADIENTS_STAY_ON_THE_DEVICE)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        # Below the Python API too (autograd accumulating into it, C++ readers): the same error,
        # except while a trace describes the tensor.
        if not _tracing():
            raise RuntimeError(GRADIENTS_STAY_ON_THE_DEVICE)

        def plain(value: Any) -> Any:
            return value.as_subclass(torch.Tensor) if isinstance(value, GradientOnDevice) else value

        return func(*[plain(a) for a in args], **{k: plain(v) for k, v in (kwargs or {}).items()})

    def __repr__(self, **kwargs: Any) -> str:  # type: ignore[override]
        return "GradientOnDevice(cleared by a torch_adreno.TrainingStep; see the error reading it raises)"

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None  # a copy of the model has no gradient

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (type(None), ())


def mark_gradients_on_device(params: list[torch.Tensor], markers: dict[int, GradientOnDevice]) -> None:
    """Give each parameter that requires grad its marker as ``.grad`` (made once per parameter and
    kept in ``markers``); a frozen parameter has no gradient, and keeps ``None``. Cheap when the
    markers are in place already (a replayed step leaves them)."""
    for p in params:
        if not p.requires_grad:
            continue
        marker = markers.get(id(p))
        if marker is not None and p.grad is marker:
            continue
        if marker is None:
            marker = markers[id(p)] = GradientOnDevice(p)
        p.grad = marker


def clear_gradient_markers(params: list[torch.Tensor]) -> None:
    """Remove the markers before a backward (autograd would accumulate into them)."""
    for p in params:
        if type(p.grad) is GradientOnDevice:
            p.grad = None


_GRAD = operator.attrgetter("grad")


class GradientMarkers:
    """The ``.grad`` of a step's parameters while their gradients live on the device: a marker each
    (:class:`GradientOnDevice`), which a read of the gradient on the host resolves. Invariant after
    :meth:`mark` and :meth:`keep`: every parameter that requires grad has its marker as ``.grad``."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._params = params
        self._markers: dict[int, GradientOnDevice] = {}
        #: Each parameter's ``.grad`` as last marked (None: not marked since the last clear).
        self._marked: tuple[Any, ...] | None = None

    def clear(self) -> None:
        """Before a backward through autograd, which would accumulate into the markers."""
        clear_gradient_markers(self._params)
        self._marked = None

    def mark(self) -> None:
        mark_gradients_on_device(self._params, self._markers)
        self._marked = tuple(map(_GRAD, self._params))

    def keep(self) -> None:
        """After a replay: the markers are still there unless ``zero_grad()`` removed them (compared
        in one pass in C), restored only where one is gone."""
        if self._marked is None or not all(map(operator.is_, map(_GRAD, self._params), self._marked)):
            self.mark()


def check_norm_type(norm_type: float) -> float:
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"norm_type must be positive (2.0, float('inf'), ...), not {norm_type}")
    return norm_type


def clip_function(max_norm: float, norm_type: float) -> Callable[[list[torch.Tensor]], None]:
    """A function scaling the gradients in place by ``min(1, max_norm / (total_norm + 1e-6))``,
    where ``total_norm`` is the ``norm_type`` norm of all gradients together: the arithmetic of
    ``torch.nn.utils.clip_grad_norm_``. Written with ops the backend lowers
    (``linalg.vector_norm`` is not among them). The norm is not returned: inside a step every graph
    output stays on the device, and a host copy nobody fills in is no value to hand out."""
    max_norm = float(max_norm)
    if not (max_norm > 0) or math.isinf(max_norm):
        raise ValueError(f"max_grad_norm must be a positive finite number, not {max_norm}")
    norm_type = check_norm_type(norm_type)

    def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
        if math.isinf(norm_type):
            return torch.stack([g.abs().amax() for g in grads]).amax()
        if norm_type == 2.0:
            return torch.stack([(g * g).sum() for g in grads]).sum().sqrt()
        if norm_type == 1.0:
            return torch.stack([g.abs().sum() for g in grads]).sum()
        return torch.stack([g.abs().pow(norm_type).sum() for g in grads]).sum().pow(1.0 / norm_type)

    def clip(grads: list[torch.Tensor]) -> None:
        scale = torch.clamp(max_norm / (total_norm(grads) + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale)

    return clip


def gradient_clipper(max_norm: float, norm_type: float,
                     options: Mapping[str, Any]) -> Callable[[list[torch.Tensor]], None]:
    """:func:`clip_function` compiled for the device, as one graph."""
    return torch.compile(clip_function(max_norm, norm_type), backend="adreno", options=dict(options),
                         dynamic=False, fullgraph=True)
