"""What binding a buffer that has live sub-buffers costs a driver at every enqueue.

The device heap (``torch_adreno/runtime/heap.py``) makes parameters' device copies sub-buffers of
a slab and has a replay's kernels take the slab itself. On NVIDIA's OpenCL driver (H200 host,
2026-12-01) an enqueue of a one-argument kernel bound to a buffer with N live sub-buffers took
6.2 us for N = 0, 7.2 us for 100 and 9.8 us for 300 (about 12 ns per sub-buffer), and the same
bound to one of those sub-buffers or to another buffer stayed at 5.8-6.0 us: hence one heap group
(slabs of its own) per TrainingStep. Device busy, as a replay enqueues: the launches run meanwhile.

    python benchmarks/enqueue_subbuffers.py [--device NVIDIA] [--counts 0 10 30 100 300]

Appends JSON lines to benchmarks/results/enqueue_subbuffers.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyopencl as cl

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.runtime import get_runtime


def busy_enqueue_us(context: cl.Context, queue: cl.CommandQueue, buffer: cl.Buffer, launches: int = 84,
                    repeats: int = 30) -> float:
    """Median host microseconds per enqueue of a trivial kernel bound to ``buffer``."""
    program = cl.Program(context, "__kernel void touch(__global float* a) { a[get_global_id(0)] += 1.0f; }").build()
    kernels = []
    for _ in range(launches):
        kernel = cl.Kernel(program, "touch")
        kernel.set_arg(0, buffer)
        kernels.append(kernel)
    times = []
    for _ in range(repeats):
        queue.finish()
        start = time.perf_counter()
        for kernel in kernels:
            cl.enqueue_nd_range_kernel(queue, kernel, (64,), (64,))
        times.append(time.perf_counter() - start)
    queue.finish()
    return statistics.median(times) / launches * 1e6


def measure(context: cl.Context, count: int) -> dict[str, Any]:
    queue = cl.CommandQueue(context)  # no profiling, as a replay's own queue
    slab = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 << 20)
    subs = [slab.get_sub_region(4096 * (i + 1), 2048) for i in range(count)]
    other = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 << 20)
    busy_enqueue_us(context, queue, other, repeats=5)  # warm-up: the first timed loop runs slow
    return {"sub_buffers": count, "parent_us": busy_enqueue_us(context, queue, slab),
            "one_sub_buffer_us": busy_enqueue_us(context, queue, subs[0]) if subs else None,
            "other_buffer_us": busy_enqueue_us(context, queue, other)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, type=device_arg, help="OpenCL device (index or name part)")
    parser.add_argument("--counts", nargs="+", type=int, default=[0, 10, 30, 100, 300])
    parser.add_argument("--out", type=Path, default=RESULTS / "enqueue_subbuffers.jsonl")
    args = parser.parse_args()
    context = run_context(args.device)
    runtime = get_runtime(args.device)
    rows = []
    for count in args.counts:
        row = {**measure(runtime.context, count), **context, "benchmark": "enqueue_subbuffers"}
        print(f"{count:4d} live sub-buffers: bound parent {row['parent_us']:.2f} us, one sub-buffer "
              f"{row['one_sub_buffer_us'] or 0:.2f} us, another buffer {row['other_buffer_us']:.2f} us", flush=True)
        rows.append(row)
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
