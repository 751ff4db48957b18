"""Observing what each compiled-graph call enqueued: the hook a step capture records through.

An :class:`~torch_adreno.runtime.executable.Executable` call reports a :class:`GraphCall` to the
observer active on its thread (:func:`observing`), after it enqueued everything and before it
returns. The runtime knows nothing of who observes (a training step's capture,
:mod:`torch_adreno.replay.capture`): the dependency points from the training step to the
runtime, never back. With no observer the cost of a call is one context-variable read.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyopencl as cl
import torch

from torch_adreno.kernels import HostStep, KernelProgram, KernelSource

if TYPE_CHECKING:
    from torch_adreno.runtime.device import DeviceRuntime


@dataclass(frozen=True)
class GraphCall:
    """One call of a compiled graph, as enqueued.

    ``launches`` are the kernels the call enqueued, in order, each with the kernel object it ran
    through (its arguments bound to the buffers in ``storage`` for this call); launches with an
    empty range are left out. ``host_steps`` are the ops it ran on the host instead. ``storage``
    holds the device buffer bound to each IR buffer of the graph (inputs included);
    ``host_outputs`` the host tensors some of them were read back into; ``input_positions`` the
    position of each named input in ``args``; ``host_copies``, by output position, the tensor over
    the output's own memory where ``outputs`` holds a host copy of it instead (an output returned
    in eager's strides)."""

    runtime: DeviceRuntime
    program: KernelProgram
    args: list[Any]
    storage: Mapping[str, cl.Buffer]
    host_outputs: Mapping[str, torch.Tensor]
    outputs: list[Any]
    launches: tuple[tuple[cl.Kernel, KernelSource], ...]
    host_steps: tuple[HostStep, ...]
    input_positions: Mapping[str, int]
    host_copies: Mapping[int, torch.Tensor] = field(default_factory=dict)


class GraphCallObserver(Protocol):
    def graph_called(self, call: GraphCall) -> None:
        """Called once per graph call on the observing thread, after the call enqueued its work."""


_OBSERVER: contextvars.ContextVar[GraphCallObserver | None] = contextvars.ContextVar(
    "torch_adreno_graph_call_observer", default=None)


@contextlib.contextmanager
def observing(observer: GraphCallObserver) -> Iterator[None]:
    """Report every graph call on this thread to ``observer`` while the block runs (nested
    observers shadow outer ones)."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def active_observer() -> GraphCallObserver | None:
    return _OBSERVER.get()
