"""What a driver charges to enqueue a kernel while the device falls behind (the queue fills).

Issue #14's floor is a bare enqueue of a trivial kernel, which the device finishes as fast as the
host enqueues it. A replayed step's kernels run longer than their enqueues (its device time, 0.2-1.4
ms on the H200, exceeds its enqueue loop), so its queue fills; NVIDIA's OpenCL driver (H200 host,
2026-12-01) then charged 9.8 us per enqueue of the same kernel against 7.8 us with the queue
shallow. Each launch here spins ``n`` iterations per work-item.

    python benchmarks/enqueue_queue_depth.py [--device NVIDIA] [--spins 1 1000 10000 30000 100000]

Appends JSON lines to benchmarks/results/enqueue_queue_depth.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.runtime import get_runtime

SPIN = """__kernel void spin(__global float* a, int n) {
    float x = a[get_global_id(0)];
    for (int i = 0; i < n; ++i) x = x * 0.999f + 0.001f;
    a[get_global_id(0)] = x;
}"""


def enqueue_us(context: cl.Context, spins: int, launches: int = 84, repeats: int = 30) -> tuple[float, float]:
    """Median host microseconds per enqueue, and per launch until the queue drained."""
    queue = cl.CommandQueue(context)  # no profiling, as a replay's own queue
    program = cl.Program(context, SPIN).build()
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, 1 << 20)
    kernels = []
    for _ in range(launches):
        kernel = cl.Kernel(program, "spin")
        kernel.set_arg(0, buffer)
        kernel.set_arg(1, np.int32(spins))
        kernels.append(kernel)
    enqueue, drained = [], []
    for _ in range(repeats):
        queue.finish()
        start = time.perf_counter()
        for kernel in kernels:
            cl.enqueue_nd_range_kernel(queue, kernel, (256,), (64,))
        enqueue.append(time.perf_counter() - start)
        queue.finish()
        drained.append(time.perf_counter() - start)
    return statistics.median(enqueue) / launches * 1e6, statistics.median(drained) / launches * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, type=device_arg, help="OpenCL device (index or name part)")
    parser.add_argument("--spins", nargs="+", type=int, default=[1, 1000, 10000, 30000, 100000])
    parser.add_argument("--out", type=Path, default=RESULTS / "enqueue_queue_depth.jsonl")
    args = parser.parse_args()
    context = run_context(args.device)
    runtime = get_runtime(args.device)
    enqueue_us(runtime.context, 1, repeats=5)  # warm-up: the first timed loop runs slow
    rows = []
    for spins in args.spins:
        per_enqueue, per_launch = enqueue_us(runtime.context, spins)
        print(f"spin {spins:6d}: enqueue {per_enqueue:.2f} us per launch, until drained {per_launch:.2f} us", flush=True)
        rows.append({"spins": spins, "enqueue_us": per_enqueue, "drained_us_per_launch": per_launch, **context,
                     "benchmark": "enqueue_queue_depth"})
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
