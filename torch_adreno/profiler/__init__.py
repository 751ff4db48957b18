"""``torch_adreno.profile()``: what a compiled training step did on the device.

Records, while active, every kernel launch (name, FX nodes, ATen ops, module paths and user
source lines, device time from OpenCL profiling events, global-memory bytes, FLOPs), every
host<->device transfer (bytes, direction, why, copied or shared in place), every op run on the
host by request, the memory of every compiled graph run, and a replayed TrainingStep's device
footprint (``prof.device_footprint``), and the device's energy over the window where it exposes
power (``prof.energy_joules``, ``prof.energy_per_step_joules``; :mod:`.energy`)::

    with torch_adreno.profile() as prof:
        loss = loss_fn(cmodel(x), y); loss.backward()
    print(prof.kernel_launches, prof.bytes_host_to_device, prof.host_fallback_ops)
    print(prof.table(sort_by="device_time", group_by="module"))
    prof.export_chrome_trace("step.json")     # open in Perfetto or chrome://tracing

The profile collects records and keeps the totals; ``records.py`` turns launches into
:class:`KernelRecord` s and reads their device times, ``report.py`` computes the grouped rows,
the table and the Chrome trace from them, ``roofline.py`` measures the device's peaks, ``energy.py``
reads the device's energy counters.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from torch_adreno.memory.footprint import DeviceFootprint
from torch_adreno.profiler.energy import (
    EnergyReading,
    EnergyTotals,
    Meter,
    Unmeasured,
    not_measured,
    open_device_meter,
    window_energy,
)
from torch_adreno.profiler.records import KernelRecord, resolve_kernel_times, resolve_transfer_times
from torch_adreno.profiler.report import (
    GROUPS,
    SORT_KEYS,
    Row,
    check_choice,
    chrome_trace,
    group_kernels,
    roofline_cells,
    row_lines,
    summary_lines,
)
from torch_adreno.profiler.roofline import DevicePeaks, device_peaks
from torch_adreno.runtime import events
from torch_adreno.runtime.events import GraphRunRecord, HostOpRecord, LaunchRecord, StepRecord, TransferRecord

__all__ = ["DevicePeaks", "EnergyReading", "KernelRecord", "profile"]


class profile(EnergyTotals):  # named like torch.profiler.profile
    """Context manager recording launches, transfers, graph memory and host fallbacks.

    ``device``: whose energy is read (as the ``device`` option takes it; None: the default device,
    ``TORCH_ADRENO_DEVICE``); ``energy=False`` reads none. The energy window runs from entering the
    profile to leaving it, after the device has finished the window's work.

    Invariant: ``_transfer_times[i]`` holds the device times of ``transfers[i]`` for each ``i`` read
    so far; kernel times are read into the records themselves. Both are read when the profile is
    left, and again by whatever needs times of records added since."""

    def __init__(self, device: str | int | None = None, energy: bool = True) -> None:
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
        self._device = device
        self._read_energy = energy
        self._meter: Meter | None = None
        self._remote_launches = 0  # launches timed on a remote device: its power is not read here
        #: The window's energy (:class:`~torch_adreno.profiler.energy.EnergyReading`), once left.
        self.energy: EnergyReading = not_measured("the profile has not been left yet")

    # -- subscriber interface ------------------------------------------------------------------

    def on_graph(self, record: GraphRunRecord) -> None:
        self.graph_runs.append(record)

    def on_launch(self, record: LaunchRecord) -> None:
        self.kernels.append(KernelRecord.from_launch(record))
        self._remote_launches += record.event is None and record.device_time_us is not None

    def on_transfer(self, record: TransferRecord) -> None:
        self.transfers.append(record)

    def on_host_op(self, record: HostOpRecord) -> None:
        self.host_ops.append(record)

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> profile:
        self._meter = open_device_meter(self._device) if self._read_energy else Unmeasured("profile(energy=False)")
        events.subscribe(self)
        self._active = True
        self._meter.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_time_us = (time.perf_counter() - self._start) * 1e6
        events.unsubscribe(self)
        self._active = False
        self._resolve_times()  # waits for the window's launches: their energy is inside the window
        if self._meter is not None:
            self.energy = window_energy(self._meter.stop(), self._remote_launches)
            self._meter = None

    def _resolve_times(self) -> None:
        resolve_kernel_times(self.kernels)
        resolve_transfer_times(self.transfers, self._transfer_times)

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
    def replay_enqueue(self) -> str | None:
        """How the last replayed TrainingStep here enqueues its step when not profiled (a command
        buffer, the C loop, ...; ``ReplayedStep.enqueue_path``). Profiled replays enqueue launch by
        launch, each launch with its event. None: nothing was replayed here."""
        return next((s.enqueue for s in reversed(self.steps) if s.kind == "replay" and s.enqueue), None)

    @property
    def host_time_per_replayed_step_us(self) -> float | None:
        """Median host time of a replayed step's own work (batch, seeds, enqueue loop)."""
        times = sorted(s.host_seconds for s in self.steps if s.kind == "replay")
        return times[len(times) // 2] * 1e6 if times else None

    @property
    def device_footprint(self) -> DeviceFootprint | None:
        """The device memory of the last TrainingStep replayed or captured here (persistent state,
        the replay's arena buffers, images, the compiled graphs' arenas) against the limits of its
        device or target (:class:`~torch_adreno.memory.footprint.DeviceFootprint`: ``total_bytes``,
        ``arena_buffers``, ``largest_allocation_bytes``, ``limits``, ``describe()``); None if no
        step here was replayed or captured."""
        return next((s.footprint for s in reversed(self.steps) if s.footprint is not None), None)

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

    def grouped(self, group_by: str = "kernel") -> dict[str, dict[str, Any]]:
        """Totals per kernel, ATen op, module path or graph. A kernel fused from several ops or
        modules is attributed to each of them, its time and bytes split evenly."""
        check_choice("group_by", group_by, GROUPS)
        if self._active:
            self._resolve_times()
        return group_kernels(self.kernels, group_by)

    def table(self, sort_by: str = "device_time", group_by: str = "kernel", row_limit: int = 30,
              roofline: bool = False) -> str:
        """A readable summary: totals, then rows grouped by ``group_by`` sorted by ``sort_by``
        ("device_time", "calls", "bytes", "flops"). ``roofline=True`` adds each kernel's achieved
        GB/s and GFLOP/s and whether it is memory- or compute-bound (group_by="kernel")."""
        check_choice("sort_by", sort_by, SORT_KEYS)
        key = SORT_KEYS[sort_by]
        rows = self.grouped(group_by)
        ordered = sorted(rows.items(), key=lambda kv: -kv[1][key])
        lines = summary_lines(self)
        if self.replayed_steps:
            lines.insert(-1, f"replayed steps: {self.replayed_steps}, enqueued launch by launch here (each launch "
                             f"timed); unprofiled: {self.replay_enqueue}")
        # Only a roofline table needs the peaks: measured on the device the first time, then cached.
        peaks = self.device_peaks() if roofline else None
        lines += row_lines(ordered, group_by, row_limit, peaks)
        return "\n".join(lines)

    @staticmethod
    def _roofline_cells(row: Row, peaks: DevicePeaks) -> str:
        return roofline_cells(row, peaks)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices the recorded kernels ran on, in the order of their first launch: labels as
        ``python -m torch_adreno devices`` lists them, or ``remote:HOST:PORT``."""
        return tuple(dict.fromkeys(k.device for k in self.kernels))

    def device_peaks(self) -> DevicePeaks:
        """Bandwidth and FLOP/s peaks of the device the recorded kernels ran on (the default device
        while none ran), measured once and cached (the roofline)."""
        from torch_adreno.runtime import get_runtime

        if self._runtime is None:
            if len(self.devices) > 1 or any(d.startswith("remote:") for d in self.devices):
                raise ValueError(f"the profiled kernels ran on {', '.join(self.devices)}: a roofline is of one device "
                                 "of this machine; profile each device's steps apart")
            self._runtime = get_runtime(self.devices[0] if self.devices else None)
        return device_peaks(self._runtime)

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write a trace Perfetto and chrome://tracing open: a lane of kernels and a lane of copies
        on the device's clock, each event carrying its FX nodes, ops, modules and bytes."""
        self._resolve_times()
        out = Path(path)
        out.write_text(json.dumps(chrome_trace(self.kernels, self.transfers, self._transfer_times)))
        return out
