"""What the runtime reports while it runs: kernel launches and host<->device transfers.

The runtime publishes records here; the profiler (a later stage) subscribes. With no subscriber,
publishing costs one attribute check per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import pyopencl as cl

from torch_adreno.kernels import KernelSource
from torch_adreno.memory.footprint import DeviceFootprint


@dataclass
class LaunchRecord:
    """One kernel launch; ``event`` times it when the queue has profiling enabled, or
    ``device_time_us`` holds its time measured elsewhere (on a remote device, by its own events).
    ``device``: where it ran, the label ``python -m torch_adreno devices`` lists ("platform:
    device"), or ``remote:HOST:PORT`` for a step server's device."""

    graph: str
    kernel: KernelSource
    event: cl.Event | None
    device: str
    device_time_us: float | None = None


@dataclass(frozen=True)
class TransferRecord:
    """Data crossing between host and device. ``direction`` is "h2d" or "d2h"; ``reason`` says what:
    "input", "parameter", "output", "saved_activation", "mutation" or "host_fallback". ``copied``
    is False when the device used the host memory in place (zero-copy): no bytes moved."""

    graph: str
    direction: str
    nbytes: int
    buffer: str
    reason: str
    copied: bool = True
    #: The copy's OpenCL event (times the copy lane of a trace), when there was one.
    event: Any = None


@dataclass(frozen=True)
class GraphRunRecord:
    """One call of a compiled graph, with its memory: planned bytes (arenas + what escapes the call
    + outputs written to host memory), the same without any sharing, and device bytes allocated
    (arenas, once per graph, plus this call's escaping buffers)."""

    graph: str
    planned_bytes: int
    unshared_bytes: int
    allocated_bytes: int
    #: Of ``planned_bytes``: what outlives the call on the device (saved activations).
    escaping_bytes: int = 0


@dataclass(frozen=True)
class HostOpRecord:
    graph: str
    op: str
    node: str


@dataclass(frozen=True)
class StepRecord:
    """One call of a :class:`~torch_adreno.TrainingStep`. ``kind``: "replay" (the recorded launch
    list), "capture" (the compiled graphs, recorded for replay) or "full" (the compiled graphs);
    ``reason`` says why a step was not replayed, or why its capture cannot be replayed.
    ``host_seconds``: a replay's own host work before it waits for the loss (batch, seeds, the
    enqueue loop); for the other kinds, the whole call."""

    kind: str
    host_seconds: float
    launches: int
    reason: str | None = None
    #: The step's device memory against its limits, once captured (a
    #: :class:`~torch_adreno.memory.footprint.DeviceFootprint`; None before).
    footprint: DeviceFootprint | None = None
    #: A replay: how its unprofiled calls enqueue it (``ReplayedStep.enqueue_path``); a profiled
    #: call, as this one, enqueues launch by launch, each with its event.
    enqueue: str | None = None


class Subscriber(Protocol):
    def on_graph(self, record: GraphRunRecord) -> None: ...
    def on_launch(self, record: LaunchRecord) -> None: ...
    def on_transfer(self, record: TransferRecord) -> None: ...
    def on_host_op(self, record: HostOpRecord) -> None: ...


class _Bus:
    def __init__(self) -> None:
        self.subscribers: list[Subscriber] = []

    @property
    def active(self) -> bool:
        return bool(self.subscribers)

    def graph(self, record: GraphRunRecord) -> None:
        for s in self.subscribers:
            s.on_graph(record)

    def launch(self, record: LaunchRecord) -> None:
        for s in self.subscribers:
            s.on_launch(record)

    def transfer(self, graph: str, direction: str, nbytes: int, buffer: str, reason: str,
                 copied: bool = True, event: Any = None) -> None:
        if self.subscribers:
            record = TransferRecord(graph, direction, nbytes, buffer, reason, copied, event)
            for s in self.subscribers:
                s.on_transfer(record)

    def host_op(self, record: HostOpRecord) -> None:
        for s in self.subscribers:
            s.on_host_op(record)

    def step(self, record: StepRecord) -> None:
        for s in self.subscribers:
            handler = getattr(s, "on_step", None)
            if handler is not None:
                handler(record)


BUS = _Bus()


def subscribe(subscriber: Any) -> None:
    BUS.subscribers.append(subscriber)


def unsubscribe(subscriber: Any) -> None:
    BUS.subscribers.remove(subscriber)
