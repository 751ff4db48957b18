"""``torch_adreno.profile()``: what a compiled training step did on the device.

Records, while active, every kernel launch (name, FX nodes, device time from OpenCL profiling
events, global-memory bytes), every host<->device copy (bytes, direction, why) and every op that
ran on the host by request::

    with torch_adreno.profile() as prof:
        loss = loss_fn(cmodel(x), y); loss.backward()
    print(prof.kernel_launches, prof.bytes_host_to_device, prof.host_fallback_ops)
    print(prof.table())
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from torch_adreno.runtime import events
from torch_adreno.runtime.events import GraphRunRecord, HostOpRecord, LaunchRecord, TransferRecord


@dataclass
class KernelRecord:
    """One kernel launch as the profile reports it."""

    name: str
    graph: str
    kind: str
    fx_nodes: tuple[str, ...]
    aten_ops: tuple[str, ...]
    modules: tuple[str, ...]
    bytes_read: int
    bytes_written: int
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    device_time_us: float | None = None
    _event: Any = field(default=None, repr=False)


class profile:
    """Context manager recording kernel launches, transfers and host fallbacks (see module doc)."""

    def __init__(self) -> None:
        self.kernels: list[KernelRecord] = []
        self.transfers: list[TransferRecord] = []
        self.host_ops: list[HostOpRecord] = []
        self.graph_runs: list[GraphRunRecord] = []
        self._active = False

    # -- subscriber interface ------------------------------------------------------------------

    def on_graph(self, record: GraphRunRecord) -> None:
        self.graph_runs.append(record)

    def on_launch(self, record: LaunchRecord) -> None:
        k = record.kernel
        self.kernels.append(KernelRecord(
            name=k.name, graph=record.graph, kind=k.kind, fx_nodes=k.fx_nodes,
            aten_ops=tuple(dict.fromkeys(o.op for o in k.origins)),
            modules=tuple(dict.fromkeys(o.module for o in k.origins if o.module)),
            bytes_read=k.bytes_read, bytes_written=k.bytes_written,
            global_size=k.global_size, local_size=k.local_size, _event=record.event,
        ))

    def on_transfer(self, record: TransferRecord) -> None:
        self.transfers.append(record)

    def on_host_op(self, record: HostOpRecord) -> None:
        self.host_ops.append(record)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> profile:
        events.subscribe(self)
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        events.unsubscribe(self)
        self._active = False
        self._resolve_times()

    def _resolve_times(self) -> None:
        for k in self.kernels:
            if k._event is not None and k.device_time_us is None:
                try:
                    k._event.wait()
                    k.device_time_us = (k._event.profile.end - k._event.profile.start) / 1e3
                except cl.Error:
                    k.device_time_us = None
                k._event = None

    # -- results -------------------------------------------------------------------------------

    @property
    def kernel_launches(self) -> int:
        return len(self.kernels)

    @property
    def bytes_host_to_device(self) -> int:
        """Bytes copied from host to device (zero-copy sharing moves none)."""
        return sum(t.nbytes for t in self.transfers if t.direction == "h2d" and t.copied)

    @property
    def bytes_device_to_host(self) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction == "d2h" and t.copied)

    @property
    def bytes_shared(self) -> int:
        """Bytes the device used in host memory in place (zero-copy), both directions."""
        return sum(t.nbytes for t in self.transfers if not t.copied)

    @property
    def host_fallback_ops(self) -> list[str]:
        return [r.op for r in self.host_ops]

    @property
    def bytes_kernel_read(self) -> int:
        return sum(k.bytes_read for k in self.kernels)

    @property
    def bytes_kernel_written(self) -> int:
        return sum(k.bytes_written for k in self.kernels)

    @property
    def peak_device_bytes(self) -> dict[str, dict[str, int]]:
        """Per compiled graph run here: ``planned`` (with reuse), ``unshared`` (what the same
        buffers need without reuse) and ``allocated`` device bytes."""
        out: dict[str, dict[str, int]] = {}
        for r in self.graph_runs:
            out[r.graph] = {"planned": r.planned_bytes, "unshared": r.unshared_bytes, "allocated": r.allocated_bytes,
                            "escaping": r.escaping_bytes}
        return out

    def step_peak_device_bytes(self, which: str = "planned") -> int:
        """Peak device bytes of the graphs run here, in order, taking ``which`` ("planned" or
        "unshared") bytes for each and keeping what each leaves on the device (saved activations,
        freed when the backward that uses them is done: the graphs after it) alive meanwhile."""
        peak, carried = 0, 0
        for r in self.graph_runs:
            own = r.planned_bytes if which == "planned" else r.unshared_bytes
            peak = max(peak, carried + own)
            carried = r.escaping_bytes if r.escaping_bytes else 0
        return peak

    @property
    def device_time_us(self) -> float:
        return sum(k.device_time_us or 0.0 for k in self.kernels)

    def transfer_bytes(self, direction: str, reason: str | None = None, copied: bool | None = True) -> int:
        """Bytes of transfers in ``direction`` for ``reason``: copied ones (default), shared ones
        (``copied=False``) or both (``copied=None``)."""
        return sum(t.nbytes for t in self.transfers if t.direction == direction
                   and (reason is None or t.reason == reason) and (copied is None or t.copied == copied))

    def table(self, sort_by: str = "device_time", row_limit: int = 30) -> str:
        """A readable summary: totals, then kernels grouped by name."""
        if self._active:
            self._resolve_times()
        rows: dict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "time": 0.0, "bytes": 0, "nodes": ""})
        for k in self.kernels:
            row = rows[k.name]
            row["calls"] += 1
            row["time"] += k.device_time_us or 0.0
            row["bytes"] += k.bytes_read + k.bytes_written
            row["nodes"] = ", ".join(k.fx_nodes)
        key = {"device_time": "time", "calls": "calls", "bytes": "bytes"}.get(sort_by)
        if key is None:
            raise ValueError(f"sort_by must be 'device_time', 'calls' or 'bytes', got {sort_by!r}")
        ordered = sorted(rows.items(), key=lambda kv: -kv[1][key])
        lines = [
            f"kernel launches: {self.kernel_launches}   device time: {self.device_time_us / 1e3:.3f} ms   "
            f"kernel bytes read/written: {self.bytes_kernel_read}/{self.bytes_kernel_written}",
            f"host->device: {self.bytes_host_to_device} B   device->host: {self.bytes_device_to_host} B   "
            f"shared in place: {self.bytes_shared} B   "
            f"host fallback ops: {len(self.host_ops)} {sorted(set(self.host_fallback_ops)) or ''}",
            "",
            f"{'kernel':<44} {'calls':>6} {'time us':>10} {'bytes':>12}  fx nodes",
        ]
        for name, row in ordered[:row_limit]:
            lines.append(f"{name[:44]:<44} {row['calls']:>6} {row['time']:>10.1f} {row['bytes']:>12}  {row['nodes'][:60]}")
        if len(ordered) > row_limit:
            lines.append(f"... {len(ordered) - row_limit} more kernels")
        return "\n".join(lines)
