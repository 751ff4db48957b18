"""What the profile computes from its records: rows grouped by kernel, op, module or graph, the
readable table, the roofline cells, and the Chrome trace.

Everything here is a pure function of records and totals; reading device times from events is
the profile's job (``records.py``), done before these are called.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from torch_adreno.profiler.energy import EnergyReading
from torch_adreno.profiler.records import KernelRecord
from torch_adreno.profiler.roofline import DevicePeaks
from torch_adreno.runtime.events import HostOpRecord, TransferRecord

GROUPS = ("kernel", "op", "module", "graph")
SORT_KEYS = {"device_time": "time", "calls": "calls", "bytes": "bytes", "flops": "flops"}

#: One row of :func:`group_kernels`: calls, time (us), bytes, flops, kernel names, source lines.
Row = dict[str, Any]


class Totals(Protocol):
    """The totals the table's header reports (a ``profile`` has them all)."""

    @property
    def kernel_launches(self) -> int: ...
    @property
    def device_time_us(self) -> float: ...
    @property
    def wall_time_us(self) -> float: ...
    @property
    def host_overhead_us(self) -> float: ...
    @property
    def bytes_kernel_read(self) -> int: ...
    @property
    def bytes_kernel_written(self) -> int: ...
    @property
    def flops(self) -> int: ...
    @property
    def bytes_host_to_device(self) -> int: ...
    @property
    def bytes_device_to_host(self) -> int: ...
    @property
    def bytes_shared(self) -> int: ...
    @property
    def host_ops(self) -> Sequence[HostOpRecord]: ...
    @property
    def host_fallback_ops(self) -> list[str]: ...
    @property
    def energy(self) -> EnergyReading: ...
    @property
    def steps(self) -> Sequence[Any]: ...


def check_choice(argument: str, value: str, choices: Iterable[str]) -> None:
    """Raise ValueError naming ``argument`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _keys(k: KernelRecord, group_by: str) -> list[str]:
    if group_by == "kernel":
        return [k.name]
    if group_by == "graph":
        return [k.graph]
    if group_by == "op":
        return list(k.aten_ops) or ["(none)"]
    return list(k.modules) or ["(no module)"]


def group_kernels(kernels: Iterable[KernelRecord], group_by: str) -> dict[str, Row]:
    """Totals per kernel, ATen op, module path or graph. A kernel fused from several ops or
    modules is attributed to each of them, its time and bytes split evenly: the rows' times and
    bytes add up to the kernels'."""
    rows: dict[str, Row] = defaultdict(
        lambda: {"calls": 0, "time": 0.0, "bytes": 0.0, "flops": 0.0, "kernels": set(), "sources": set()})
    for k in kernels:
        keys = _keys(k, group_by)
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


def energy_line(energy: EnergyReading, steps: int) -> str:
    """The energy over the window and per TrainingStep call in it, or why it was not measured."""
    if energy.joules is None:
        return f"energy: not measured: {energy.reason}"
    per_step = (f"{energy.joules / steps:.4g} J per step ({steps} steps)" if steps
                else "per step: no TrainingStep call in the window")
    return f"energy: {energy.describe()}; {per_step}"


def summary_lines(totals: Totals) -> list[str]:
    """The table's header: launches and times, kernel bytes and FLOPs, copies and host fallbacks,
    energy, then a blank line (rows start at line 6)."""
    return [
        f"kernel launches: {totals.kernel_launches}   device time: {totals.device_time_us / 1e3:.3f} ms   "
        f"wall: {totals.wall_time_us / 1e3:.3f} ms (host overhead {totals.host_overhead_us / 1e3:.3f} ms)",
        f"kernel bytes read/written: {totals.bytes_kernel_read}/{totals.bytes_kernel_written}   "
        f"GFLOP: {totals.flops / 1e9:.3f}",
        f"host->device: {totals.bytes_host_to_device} B   device->host: {totals.bytes_device_to_host} B   "
        f"shared in place: {totals.bytes_shared} B   "
        f"host fallback ops: {len(totals.host_ops)} {sorted(set(totals.host_fallback_ops)) or ''}",
        energy_line(totals.energy, len(totals.steps)),
        "",
    ]


def row_lines(ordered: Sequence[tuple[str, Row]], group_by: str, row_limit: int, peaks: DevicePeaks | None) -> list[str]:
    """The column header and the first ``row_limit`` rows of ``ordered``, names cut at 44
    characters; with ``peaks``, each row's roofline cells."""
    header = f"{group_by:<44} {'calls':>6} {'time us':>10} {'bytes':>12} {'MFLOP':>9}"
    if peaks is not None:
        header += f" {'GB/s':>8} {'GFLOP/s':>8}  bound (of roof)"
    lines = [header + "  source"]
    for name, row in ordered[:row_limit]:
        line = (f"{name[:44]:<44} {row['calls']:>6} {row['time']:>10.1f} {row['bytes']:>12.0f} "
                f"{row['flops'] / 1e6:>9.2f}")
        if peaks is not None:
            line += " " + roofline_cells(row, peaks)
        source = sorted(row["sources"])[0].split("/")[-1] if row["sources"] else ""
        lines.append(f"{line}  {source[:70]}")
    if len(ordered) > row_limit:
        lines.append(f"... {len(ordered) - row_limit} more")
    return lines


def roofline_cells(row: Row, peaks: DevicePeaks) -> str:
    """Achieved GB/s and GFLOP/s of ``row``, and which roof bounds it (the side of the ridge its
    arithmetic intensity falls on) with the fraction of that roof reached; "-" without time."""
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


def chrome_trace(kernels: Sequence[KernelRecord], transfers: Sequence[TransferRecord],
                 transfer_times: Sequence[tuple[int, int] | None]) -> dict[str, Any]:
    """The trace Perfetto and chrome://tracing open: a lane of kernels and a lane of copies on the
    device's clock, from its earliest event, each event carrying its FX nodes, ops, modules and
    bytes. Launches and copies without device times are left out."""
    starts = [k.start_ns for k in kernels if k.start_ns is not None]
    starts += [t[0] for t in transfer_times if t is not None]
    origin = min(starts) if starts else 0
    trace: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "OpenCL device"}},
        {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "kernels"}},
        {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name", "args": {"name": "copies"}},
    ]
    for k in kernels:
        if k.start_ns is None or k.end_ns is None:
            continue
        trace.append({
            "name": k.name, "cat": k.kind, "ph": "X", "pid": 0, "tid": 0,
            "ts": (k.start_ns - origin) / 1e3, "dur": max((k.end_ns - k.start_ns) / 1e3, 0.001),
            "args": {"graph": k.graph, "fx_nodes": list(k.fx_nodes), "aten_ops": list(k.aten_ops),
                     "modules": list(k.modules), "source": list(k.source_lines), "bytes": k.bytes,
                     "flops": k.flops, "global_size": list(k.global_size), "local_size": list(k.local_size)},
        })
    for t, times in zip(transfers, transfer_times, strict=True):
        if times is None:
            continue
        trace.append({
            "name": f"{t.direction} {t.reason}", "cat": "copy", "ph": "X", "pid": 0, "tid": 1,
            "ts": (times[0] - origin) / 1e3, "dur": max((times[1] - times[0]) / 1e3, 0.001),
            "args": {"graph": t.graph, "buffer": t.buffer, "bytes": t.nbytes},
        })
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
