"""Device peaks for the roofline: global-memory bandwidth and arithmetic throughput, measured once
per device and driver by two micro-benchmarks, cached on disk."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

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
