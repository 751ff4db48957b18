"""What a driver charges to enqueue a kernel, in two situations a replayed step meets.

- ``subbuffers``: a kernel bound to a buffer that has N live sub-buffers. The device heap
  (``torch_adreno/runtime/heap.py``) makes parameters' device copies sub-buffers of a slab and has
  a replay's kernels take the slab itself. On NVIDIA's OpenCL driver (H200 host, 2026-12-01) an
  enqueue bound to a buffer with N live sub-buffers took 6.2 us for N = 0, 7.2 us for 100 and
  9.8 us for 300 (about 12 ns per sub-buffer); bound to one of those sub-buffers or to another
  buffer it stayed at 5.8-6.0 us: hence one heap group (slabs of its own) per TrainingStep.
- ``depth``: each launch spinning ``n`` iterations, so that the device falls behind and the queue
  fills. Issue #14's floor is a trivial kernel, which the device finishes as fast as the host
  enqueues it; a replayed step's device time (0.2-1.4 ms on the H200) exceeds its enqueue loop.
  NVIDIA's driver charged 9.8 us per enqueue behind a full queue against 7.8 us with it shallow.

Device busy in both, as a replay enqueues: the launches run meanwhile, on a queue without profiling.

    python benchmarks/enqueue_cost.py [--device NVIDIA] [--study subbuffers depth]
        [--counts 0 10 30 100 300] [--spins 1 1000 10000 30000 100000]

Appends JSON lines to benchmarks/results/enqueue_cost.jsonl. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, append_jsonl, device_arg, run_context

from torch_adreno.runtime import get_runtime

KERNEL = """__kernel void spin(__global float* a, int n) {
    float x = a[get_global_id(0)];
    for (int i = 0; i < n; ++i) x = x * 0.999f + 0.001f;
    a[get_global_id(0)] = x;
}"""
LAUNCHES = 84  # resnet_mini's replayed step


def enqueue_us(context: cl.Context, buffer: cl.Buffer, spins: int = 0, repeats: int = 30) -> tuple[float, float]:
    """Median host microseconds per enqueue of :data:`LAUNCHES` launches of the kernel bound to
    ``buffer``, and per launch until the queue drained."""
    queue = cl.CommandQueue(context)
    program = cl.Program(context, KERNEL).build()
    kernels = []
    for _ in range(LAUNCHES):
        kernel = cl.Kernel(program, "spin")
        kernel.set_arg(0, buffer)
        kernel.set_arg(1, np.int32(spins))
        kernels.append(kernel)
    enqueued, drained = [], []
    for _ in range(repeats):
        queue.finish()
        start = time.perf_counter()
        for kernel in kernels:
            cl.enqueue_nd_range_kernel(queue, kernel, (256,), (64,))
        enqueued.append(time.perf_counter() - start)
        queue.finish()
        drained.append(time.perf_counter() - start)
    return statistics.median(enqueued) / LAUNCHES * 1e6, statistics.median(drained) / LAUNCHES * 1e6


def subbuffers(context: cl.Context, count: int) -> dict[str, Any]:
    slab = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 << 20)
    subs = [slab.get_sub_region(4096 * (i + 1), 2048) for i in range(count)]
    other = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 << 20)
    return {"study": "subbuffers", "sub_buffers": count, "parent_us": enqueue_us(context, slab)[0],
            "one_sub_buffer_us": enqueue_us(context, subs[0])[0] if subs else None,
            "other_buffer_us": enqueue_us(context, other)[0]}


def depth(context: cl.Context, spins: int) -> dict[str, Any]:
    per_enqueue, per_launch = enqueue_us(context, cl.Buffer(context, cl.mem_flags.READ_WRITE, 1 << 20), spins)
    return {"study": "depth", "spins": spins, "enqueue_us": per_enqueue, "drained_us_per_launch": per_launch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, type=device_arg, help="OpenCL device (index or name part)")
    parser.add_argument("--study", nargs="+", choices=["subbuffers", "depth"], default=["subbuffers", "depth"])
    parser.add_argument("--counts", nargs="+", type=int, default=[0, 10, 30, 100, 300])
    parser.add_argument("--spins", nargs="+", type=int, default=[1, 1000, 10000, 30000, 100000])
    parser.add_argument("--out", type=Path, default=RESULTS / "enqueue_cost.jsonl")
    args = parser.parse_args()
    context = run_context(args.device)
    ctx = get_runtime(args.device).context
    enqueue_us(ctx, cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 20), repeats=5)  # the first timed loop runs slow
    rows = []
    if "subbuffers" in args.study:
        for count in args.counts:
            row = subbuffers(ctx, count)
            print(f"{count:4d} live sub-buffers: bound parent {row['parent_us']:.2f} us, one sub-buffer "
                  f"{row['one_sub_buffer_us'] or 0:.2f} us, another buffer {row['other_buffer_us']:.2f} us", flush=True)
            rows.append(row)
    if "depth" in args.study:
        for spins in args.spins:
            row = depth(ctx, spins)
            print(f"spin {spins:6d}: enqueue {row['enqueue_us']:.2f} us, until drained "
                  f"{row['drained_us_per_launch']:.2f} us per launch", flush=True)
            rows.append(row)
    append_jsonl(args.out, [{**row, **context, "benchmark": "enqueue_cost"} for row in rows])


if __name__ == "__main__":
    main()
