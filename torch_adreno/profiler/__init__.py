"""``torch_adreno.profile()``: what a compiled training step did on the device.

Records, while active, every kernel launch (name, FX nodes, ATen ops, module paths and user
source lines, device time from OpenCL profiling events, global-memory bytes, FLOPs), every
host<->device transfer (bytes, direction, why, copied or shared in place), every op run on the
host by request, and the memory of every compiled graph run::

    with torch_adreno.profile() as prof:
        loss = loss_fn(cmodel(x), y); loss.backward()
    print(prof.kernel_launches, prof.bytes_host_to_device, prof.host_fallback_ops)
    print(prof.table(sort_by="device_time", group_by="module"))
    prof.export_chrome_trace("step.json")     # open in Perfetto or chrome://tracing
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyopencl as cl

from torch_adreno.profiler.roofline import DevicePeaks, device_peaks
from torch_adreno.runtime import events
from torch_adreno.runtime.events import GraphRunRecord, HostOpRecord, LaunchRecord, StepRecord, TransferRecord

__all__ = ["DevicePeaks", "KernelRecord", "profile"]

GROUPS = ("kernel", "op", "module", "graph")
SORT_KEYS = {"device_time": "time", "calls": "calls", "bytes": "bytes", "flops": "flops"}


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
    device_time_us: float | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    _event: Any = field(default=None, repr=False)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def achieved_gbs(self) -> float | None:
        return self.bytes / (self.device_time_us * 1e3) if self.device_time_us else None

    @property
    def achieved_gflops(self) -> float | None:
        return self.flops / (self.device_time_us * 1e3) if self.device_time_us else None


def _event_times(event: Any) -> tuple[int, int] | None:
    try:
        event.wait()
        return int(event.profile.start), int(event.profile.end)
    except (cl.Error, AttributeError):
        return None


class profile:  # named like torch.profiler.profile
    """Context manager recording launches, transfers, graph memory and host fallbacks."""

    def __init__(self) -> None:
        self.kernels: list[KernelRecord] = []
        self.transfers: list[TransferRecord] = []
        self.host_ops: list[HostOpRecord] = []
        self.graph_runs: list[GraphRunRecord] = []
        #: One record per TrainingStep call: replayed, captured or run through the compiled graphs.
        self.steps: list[StepRecord] = []
        self._transfer_times: list[tuple[int, int] | None] = []
        self._active = False
        self._runtime: Any = None
        self.wall_time_us = 0.0
        self._start = 0.0

    # -- subscriber interface ------------------------------------------------------------------

    def on_graph(self, record: GraphRunRecord) -> None:
        self.graph_runs.append(record)

    def on_launch(self, record: LaunchRecord) -> None:
        k = record.kernel
        self.kernels.append(KernelRecord(
            name=k.name, graph=record.graph, kind=k.kind, fx_nodes=k.fx_nodes,
            aten_ops=tuple(dict.fromkeys(o.op for o in k.origins)),
            modules=tuple(dict.fromkeys(o.module for o in k.origins if o.module)),
            source_lines=tuple(dict.fromkeys(o.source for o in k.origins if o.source)),
            bytes_read=k.bytes_read, bytes_written=k.bytes_written, flops=k.flops,
            global_size=k.global_size, local_size=k.local_size, _event=record.event,
        ))

    def on_transfer(self, record: TransferRecord) -> None:
        self.transfers.append(record)

    def on_host_op(self, record: HostOpRecord) -> None:
        self.host_ops.append(record)

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> profile:
        events.subscribe(self)
        self._active = True
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_time_us = (time.perf_counter() - self._start) * 1e6
        events.unsubscribe(self)
        self._active = False
        self._resolve_times()

    def _resolve_times(self) -> None:
        for k in self.kernels:
            if k._event is not None and k.device_time_us is None:
                times = _event_times(k._event)
                if times is not None:
                    k.start_ns, k.end_ns = times
                    k.device_time_us = (times[1] - times[0]) / 1e3
                k._event = None
        while len(self._transfer_times) < len(self.transfers):
            t = self.transfers[len(self._transfer_times)]
            self._transfer_times.append(_event_times(t.event) if t.event is not None else None)

    # -- totals ---------------------------------------------------------------------------------

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
    def replayed_steps(self) -> int:
        """TrainingStep calls that ran the recorded launch list (no Dynamo, AOTAutograd or autograd)."""
        return sum(1 for s in self.steps if s.kind == "replay")

    @property
    def step_captures(self) -> int:
        """TrainingStep calls that ran the compiled graphs and recorded them for replay."""
        return sum(1 for s in self.steps if s.kind == "capture")

    @property
    def replay_fallbacks(self) -> list[str]:
        """Why TrainingStep calls did not replay (a guard failed, a capture could not be replayed)."""
        return [s.reason for s in self.steps if s.reason is not None]

    @property
    def host_time_per_replayed_step_us(self) -> float | None:
        """Median host time of a replayed step's own work (batch, seeds, enqueue loop)."""
        times = sorted(s.host_seconds for s in self.steps if s.kind == "replay")
        return times[len(times) // 2] * 1e6 if times else None

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
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def device_time_us(self) -> float:
        return sum(k.device_time_us or 0.0 for k in self.kernels)

    @property
    def transfer_time_us(self) -> float:
        self._resolve_times()
        return sum((t[1] - t[0]) / 1e3 for t in self._transfer_times if t is not None)

    @property
    def host_overhead_us(self) -> float:
        """Wall time not spent in kernels or copies on the device: Python, Dynamo, AOTAutograd,
        the enqueueing itself, and whatever the host computed meanwhile."""
        return max(0.0, self.wall_time_us - self.device_time_us - self.transfer_time_us)

    def transfer_bytes(self, direction: str, reason: str | None = None, copied: bool | None = True) -> int:
        """Bytes of transfers in ``direction`` for ``reason``: copied ones (default), shared ones
        (``copied=False``) or both (``copied=None``)."""
        return sum(t.nbytes for t in self.transfers if t.direction == direction
                   and (reason is None or t.reason == reason) and (copied is None or t.copied == copied))

    @property
    def peak_device_bytes(self) -> dict[str, dict[str, int]]:
        """Per compiled graph run here: ``planned`` (with reuse), ``unshared`` (what the same
        buffers need without reuse), ``allocated`` and ``escaping`` device bytes."""
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
            carried = r.escaping_bytes
        return peak

    # -- summaries --------------------------------------------------------------------------------

    def _keys(self, k: KernelRecord, group_by: str) -> list[str]:
        if group_by == "kernel":
            return [k.name]
        if group_by == "graph":
            return [k.graph]
        if group_by == "op":
            return list(k.aten_ops) or ["(none)"]
        return list(k.modules) or ["(no module)"]

    def grouped(self, group_by: str = "kernel") -> dict[str, dict[str, Any]]:
        """Totals per kernel, ATen op, module path or graph. A kernel fused from several ops or
        modules is attributed to each of them, its time and bytes split evenly."""
        if group_by not in GROUPS:
            raise ValueError(f"group_by must be one of {', '.join(map(repr, GROUPS))}, got {group_by!r}")
        if self._active:
            self._resolve_times()
        rows: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"calls": 0, "time": 0.0, "bytes": 0.0, "flops": 0.0, "kernels": set(), "sources": set()})
        for k in self.kernels:
            keys = self._keys(k, group_by)
            share = 1.0 / len(keys)
            for key in keys:
                row = rows[key]
                row["calls"] += 1
                row["time"] += (k.device_time_us or 0.0) * share
                row["bytes"] += k.bytes * share
                row["flops"] += k.flops * share
                row["kernels"].add(k.name)
                row["sources"].update(k.source_lines)
        return dict(rows)

    def table(self, sort_by: str = "device_time", group_by: str = "kernel", row_limit: int = 30,
              roofline: bool = False) -> str:
        """A readable summary: totals, then rows grouped by ``group_by`` sorted by ``sort_by``
        ("device_time", "calls", "bytes", "flops"). ``roofline=True`` adds each kernel's achieved
        GB/s and GFLOP/s and whether it is memory- or compute-bound (group_by="kernel")."""
        key = SORT_KEYS.get(sort_by)
        if key is None:
            raise ValueError(f"sort_by must be one of {', '.join(map(repr, SORT_KEYS))}, got {sort_by!r}")
        rows = self.grouped(group_by)
        ordered = sorted(rows.items(), key=lambda kv: -kv[1][key])
        lines = [
            f"kernel launches: {self.kernel_launches}   device time: {self.device_time_us / 1e3:.3f} ms   "
            f"wall: {self.wall_time_us / 1e3:.3f} ms (host overhead {self.host_overhead_us / 1e3:.3f} ms)",
            f"kernel bytes read/written: {self.bytes_kernel_read}/{self.bytes_kernel_written}   "
            f"GFLOP: {self.flops / 1e9:.3f}",
            f"host->device: {self.bytes_host_to_device} B   device->host: {self.bytes_device_to_host} B   "
            f"shared in place: {self.bytes_shared} B   "
            f"host fallback ops: {len(self.host_ops)} {sorted(set(self.host_fallback_ops)) or ''}",
            "",
        ]
        peaks = self.device_peaks() if roofline else None
        header = f"{group_by:<44} {'calls':>6} {'time us':>10} {'bytes':>12} {'MFLOP':>9}"
        if peaks is not None:
            header += f" {'GB/s':>8} {'GFLOP/s':>8}  bound (of roof)"
        lines.append(header + "  source")
        for name, row in ordered[:row_limit]:
            line = (f"{name[:44]:<44} {row['calls']:>6} {row['time']:>10.1f} {row['bytes']:>12.0f} "
                    f"{row['flops'] / 1e6:>9.2f}")
            if peaks is not None:
                line += " " + self._roofline_cells(row, peaks)
            source = sorted(row["sources"])[0].split("/")[-1] if row["sources"] else ""
            lines.append(f"{line}  {source[:70]}")
        if len(ordered) > row_limit:
            lines.append(f"... {len(ordered) - row_limit} more")
        return "\n".join(lines)

    @staticmethod
    def _roofline_cells(row: dict[str, Any], peaks: DevicePeaks) -> str:
        seconds = row["time"] * 1e-6
        if not seconds:
            return f"{'':>8} {'':>8}  -"
        gbs, gflops = row["bytes"] / seconds / 1e9, row["flops"] / seconds / 1e9
        intensity = row["flops"] / row["bytes"] if row["bytes"] else float("inf")
        if intensity < peaks.ridge:
            bound, fraction = "memory", gbs / peaks.bandwidth_gbs
        else:
            bound, fraction = "compute", gflops / peaks.gflops
        return f"{gbs:>8.1f} {gflops:>8.2f}  {bound} ({fraction:.0%})"

    def device_peaks(self) -> DevicePeaks:
        """Bandwidth and FLOP/s peaks of the device, measured once and cached (the roofline)."""
        from torch_adreno.runtime import get_runtime

        if self._runtime is None:
            self._runtime = get_runtime(None)
        return device_peaks(self._runtime)

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write a trace Perfetto and chrome://tracing open: a lane of kernels and a lane of copies
        on the device's clock, each event carrying its FX nodes, ops, modules and bytes."""
        self._resolve_times()
        starts = [k.start_ns for k in self.kernels if k.start_ns is not None]
        starts += [t[0] for t in self._transfer_times if t is not None]
        origin = min(starts) if starts else 0
        trace: list[dict[str, Any]] = [
            {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "OpenCL device"}},
            {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "kernels"}},
            {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "copies"}},
        ]
        for k in self.kernels:
            if k.start_ns is None or k.end_ns is None:
                continue
            trace.append({
                "name": k.name, "cat": k.kind, "ph": "X", "pid": 0, "tid": 0,
                "ts": (k.start_ns - origin) / 1e3, "dur": max((k.end_ns - k.start_ns) / 1e3, 0.001),
                "args": {"graph": k.graph, "fx_nodes": list(k.fx_nodes), "aten_ops": list(k.aten_ops),
                         "modules": list(k.modules), "source": list(k.source_lines), "bytes": k.bytes,
                         "flops": k.flops, "global_size": list(k.global_size), "local_size": list(k.local_size)},
            })
        for t, times in zip(self.transfers, self._transfer_times, strict=True):
            if times is None:
                continue
            trace.append({
                "name": f"{t.direction} {t.reason}", "cat": "copy", "ph": "X", "pid": 0, "tid": 1,
                "ts": (times[0] - origin) / 1e3, "dur": max((times[1] - times[0]) / 1e3, 0.001),
                "args": {"graph": t.graph, "buffer": t.buffer, "bytes": t.nbytes},
            })
        out = Path(path)
        out.write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
        return out
