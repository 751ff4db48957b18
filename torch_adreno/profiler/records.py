"""What the profile keeps of each launch, and the device times it reads from OpenCL events.

A launch is recorded when it is enqueued, with its event; its device time is read from the event
later (:func:`resolve_kernel_times`), when the profile is left or a summary asks, so that
recording never waits for the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from torch_adreno.runtime.events import LaunchRecord, TransferRecord


@dataclass
class KernelRecord:
    """One kernel launch as the profile reports it."""

    name: str
    graph: str
    kind: str
    fx_nodes: tuple[str, ...]
    aten_ops: tuple[str, ...]
    modules: tuple[str, ...]
    source_lines: tuple[str, ...]
    bytes_read: int
    bytes_written: int
    flops: int
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    #: Where it ran: the device's label in ``python -m torch_adreno devices``, or ``remote:HOST:PORT``.
    device: str
    device_time_us: float | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    _event: Any = field(default=None, repr=False)

    @classmethod
    def from_launch(cls, record: LaunchRecord) -> KernelRecord:
        """The launch's kernel, its origins each named once in order; times still to be read."""
        k = record.kernel
        return cls(
            name=k.name, graph=record.graph, kind=k.kind, fx_nodes=k.fx_nodes,
            aten_ops=tuple(dict.fromkeys(o.op for o in k.origins)),
            modules=tuple(dict.fromkeys(o.module for o in k.origins if o.module)),
            source_lines=tuple(dict.fromkeys(o.source for o in k.origins if o.source)),
            bytes_read=k.bytes_read, bytes_written=k.bytes_written, flops=k.flops,
            global_size=k.global_size, local_size=k.local_size, device=record.device,
            device_time_us=record.device_time_us,
            _event=record.event,
        )

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def achieved_gbs(self) -> float | None:
        return self.bytes / (self.device_time_us * 1e3) if self.device_time_us else None

    @property
    def achieved_gflops(self) -> float | None:
        return self.flops / (self.device_time_us * 1e3) if self.device_time_us else None


def event_times(event: Any) -> tuple[int, int] | None:
    """Start and end of ``event`` on the device clock, in ns; None when the queue does not profile."""
    try:
        event.wait()
        return int(event.profile.start), int(event.profile.end)
    except (cl.Error, AttributeError):
        return None


def resolve_kernel_times(kernels: Sequence[KernelRecord]) -> None:
    """Read the times of the launches not read yet. Each event is read once and then dropped (a
    launch whose queue does not profile keeps ``device_time_us`` None)."""
    for k in kernels:
        if k._event is not None and k.device_time_us is None:
            times = event_times(k._event)
            if times is not None:
                k.start_ns, k.end_ns = times
                k.device_time_us = (times[1] - times[0]) / 1e3
            k._event = None


def resolve_transfer_times(transfers: Sequence[TransferRecord], times: list[tuple[int, int] | None]) -> None:
    """Extend ``times`` (the times of ``transfers``' first ``len(times)``) to all of ``transfers``.
    Invariant after: ``times[i]`` belongs to ``transfers[i]``, None for one without an event."""
    while len(times) < len(transfers):
        t = transfers[len(times)]
        times.append(event_times(t.event) if t.event is not None else None)
