"""Device peaks for the roofline: global-memory bandwidth and arithmetic throughput, measured once
per device and driver by two micro-benchmarks, cached on disk; and the projection of a profiled
step's launches onto an Adreno target's roofline (its published peaks, not measured here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from torch_adreno.config import cache_root
from torch_adreno.runtime.device import DeviceRuntime

_BANDWIDTH = """
__kernel void stream(__global const float4* restrict a, __global float4* restrict b) {
    const size_t i = get_global_id(0);
    b[i] = a[i] * 1.0001f;
}
"""
# Each work-item runs independent multiply-add chains; a float4 multiply-add is 8 flops.
_COMPUTE = """
__kernel void fma_chain(__global float4* out, const float seed) {
    float4 x = (float4)(seed, seed + 1.0f, seed + 2.0f, seed + 3.0f), y = x + 0.5f;
    for (int i = 0; i < 512; ++i) {
        x = x * 0.999f + 0.001f;
        y = y * 0.998f + 0.002f;
    }
    out[get_global_id(0)] = x + y;
}
"""


@dataclass(frozen=True)
class DevicePeaks:
    bandwidth_gbs: float
    gflops: float

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (flop/byte) where a kernel stops being memory-bound."""
        return self.gflops / self.bandwidth_gbs if self.bandwidth_gbs else 0.0


def _cache_file() -> Path:
    root = cache_root()
    return root / "roofline.json"


def _best_time(runtime: DeviceRuntime, kernel: cl.Kernel, global_size: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        event = cl.enqueue_nd_range_kernel(runtime.queue, kernel, (global_size,), None)
        event.wait()
        best = min(best, (event.profile.end - event.profile.start) * 1e-9)
    return best


def measure_peaks(runtime: DeviceRuntime) -> DevicePeaks:
    ctx = runtime.context
    n = 1 << 22  # float4s: 64 MiB read + 64 MiB written
    n = min(n, runtime.profile.max_alloc_bytes // 16)
    a = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(n * 4, np.float32))
    b = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, n * 16)
    stream = cl.Program(ctx, _BANDWIDTH).build().stream
    stream.set_args(a, b)
    bandwidth = 2 * n * 16 / _best_time(runtime, stream, n) / 1e9
    items = max(runtime.profile.compute_units * 4096, 65536)
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, items * 16)
    chain = cl.Program(ctx, _COMPUTE).build().fma_chain
    chain.set_args(out, np.float32(1.0))
    gflops = items * 512 * 2 * 8 / _best_time(runtime, chain, items) / 1e9
    return DevicePeaks(bandwidth, gflops)


def device_peaks(runtime: DeviceRuntime) -> DevicePeaks:
    """The device's peaks, from the on-disk cache or measured now (a second or so) and cached."""
    path = _cache_file()
    key = runtime.profile.key
    cache: dict[str, dict[str, float]] = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
    if key in cache:
        return DevicePeaks(**cache[key])
    peaks = measure_peaks(runtime)
    cache[key] = asdict(peaks)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only home: measured again next time
    return peaks


# -- projection onto a target's roofline ----------------------------------------------------------

#: Assumed cost of one kernel launch on an Adreno (driver enqueue and GPU dispatch), microseconds.
#: Not measured (no Adreno here): an assumption in the range public Adreno OpenCL traces suggest
#: (a few to tens of microseconds per dispatch); ``--launch-us`` changes it.
ASSUMED_LAUNCH_US = 10.0
#: The figures the projection is set against, as the study behind ``seed_mlp`` reports them.
SEED_GEMM_GFLOPS = (40.0, 70.0)  # GPU GEMM on Snapdragon 8-series, GFLOP/s
SEED_DATA_MOVEMENT_SHARE = 0.91  # data movement's share of a training step in MNN's OpenCL backend


@dataclass(frozen=True)
class KernelProjection:
    """One launch placed on a target's roofline: ``memory_us`` = bytes / bandwidth, ``compute_us``
    = FLOPs / fp32 peak; the launch takes the larger of the two plus the per-launch cost."""

    name: str
    kind: str
    bytes: int
    flops: int
    memory_us: float
    compute_us: float
    launch_us: float

    @property
    def memory_bound(self) -> bool:
        return self.memory_us >= self.compute_us

    @property
    def roofline_us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def total_us(self) -> float:
        return self.roofline_us + self.launch_us


@dataclass(frozen=True)
class StepProjection:
    """A training step's launches and host<->device copies projected onto one target.

    *Data movement* is the time the step spends moving bytes rather than computing: every
    memory-bound kernel's roofline time (its bytes decide it) plus the copies (on a phone's unified
    memory a copy reads and writes DRAM: 2 x bytes / bandwidth). Launch costs are counted apart."""

    target: str
    kernels: tuple[KernelProjection, ...]
    copied_bytes: int
    bandwidth_gbs: float
    launch_us: float

    @property
    def copy_us(self) -> float:
        return 2 * self.copied_bytes / (self.bandwidth_gbs * 1e3)

    @property
    def kernel_us(self) -> float:
        return sum(k.roofline_us for k in self.kernels)

    @property
    def launches_us(self) -> float:
        return sum(k.launch_us for k in self.kernels)

    @property
    def total_us(self) -> float:
        return self.kernel_us + self.launches_us + self.copy_us

    @property
    def data_movement_us(self) -> float:
        return sum(k.roofline_us for k in self.kernels if k.memory_bound) + self.copy_us

    @property
    def compute_us(self) -> float:
        return sum(k.roofline_us for k in self.kernels if not k.memory_bound)

    def total_us_with_gemm_rate(self, gflops: float) -> float:
        """The step with every GEMM kernel at most ``gflops`` fast (the seed's measured GEMM rate
        instead of the roofline): how far below the roofline real kernels may land."""
        gemm_us = sum(max(k.roofline_us, k.flops / (gflops * 1e3)) - k.roofline_us
                      for k in self.kernels if k.kind == "gemm")
        return self.total_us + gemm_us

    def share(self, part_us: float) -> float:
        return part_us / self.total_us if self.total_us else 0.0

    @property
    def gemm_gflops(self) -> float:
        """The projected rate of the step's GEMM kernels (FLOPs over their time with launches), the
        figure the seed's 40-70 GFLOP/s is comparable to."""
        gemms = [k for k in self.kernels if k.kind == "gemm"]
        seconds_us = sum(k.total_us for k in gemms)
        return sum(k.flops for k in gemms) / (seconds_us * 1e3) if seconds_us else 0.0


def project_kernel(name: str, kind: str, nbytes: int, flops: int, bandwidth_gbs: float, peak_gflops: float,
                   launch_us: float = ASSUMED_LAUNCH_US) -> KernelProjection:
    if bandwidth_gbs <= 0 or peak_gflops <= 0:
        raise ValueError(f"a roofline needs positive peaks, got {bandwidth_gbs} GB/s and {peak_gflops} GFLOP/s")
    return KernelProjection(name, kind, nbytes, flops, nbytes / (bandwidth_gbs * 1e3), flops / (peak_gflops * 1e3),
                            launch_us)


def project_step(kernels: Sequence[Any], target: Any, copied_bytes: int = 0,
                 launch_us: float = ASSUMED_LAUNCH_US) -> StepProjection:
    """``kernels``: launch records with ``name``, ``kind``, ``bytes`` and ``flops`` (the profiler's
    :class:`~torch_adreno.profiler.KernelRecord`); ``target``: an
    :class:`~torch_adreno.targets.profiles.AdrenoTarget`; ``copied_bytes``: host<->device bytes the
    step copies (on a phone, the batch in and the loss out)."""
    if launch_us < 0:
        raise ValueError(f"the per-launch cost must be >= 0 microseconds, got {launch_us}")
    projected = tuple(project_kernel(k.name, k.kind, k.bytes, k.flops, target.bandwidth_gbs, target.peak_fp32_gflops,
                                     launch_us) for k in kernels)
    return StepProjection(target.name, projected, copied_bytes, target.bandwidth_gbs, launch_us)
