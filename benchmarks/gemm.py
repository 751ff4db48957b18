"""SGEMM and convolution throughput of torch_adreno's kernels next to peers on the same hardware.

For square SGEMM (256 ... 4096) and the convolutions of resnet_mini (forward), each kernel's
device time comes from OpenCL profiling events (median of --reps launches; host transfers are not
part of it). Peers, in the same run:
  * CLBlast's SGEMM on the same OpenCL device, called through ctypes, where libclblast is found
    ($TORCH_ADRENO_CLBLAST, the system's library path, or .gpu/lib); skipped with a message if not.
    Its time is the whole call until the queue is idle (it may launch several kernels), which
    includes launch overhead ours does not pay: at small sizes that favours us;
  * PyTorch on the same machine: torch.mm / conv2d on the CUDA GPU where there is one, else on
    the host CPU.
Ours runs with images off (``adreno``) and, with --images, on (``adreno_images``: both operands read
through image2d_t, ``images_mode`` says whether the images shared the buffers' memory or were
copies, whose refresh copies are not in the kernel time). A desktop GPU's numbers say nothing of
an Adreno's texture cache, the reason the image path exists.

    python benchmarks/gemm.py [--sizes 256 1024 4096] [--reps 20] [--device NVIDIA] [--images]

Appends JSON lines to benchmarks/results/<device>/gemm.jsonl and draws benchmarks/results/<device>/gemm.png.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.runtime import get_runtime
from torch_adreno.runtime.images import image_views

#: (name, batch, in channels, out channels, spatial size, kernel, stride) of resnet_mini's convolutions.
RESNET_MINI_CONVS = [
    ("stem 3->16 3x3", 32, 3, 16, 32, 3, 1),
    ("stage1 16->16 3x3", 32, 16, 16, 32, 3, 1),
    ("stage2 16->32 3x3 s2", 32, 16, 32, 32, 3, 2),
    ("stage2 32->32 3x3", 32, 32, 32, 16, 3, 1),
    ("stage3 32->64 3x3 s2", 32, 32, 64, 16, 3, 2),
    ("stage3 64->64 3x3", 32, 64, 64, 8, 3, 1),
]


def _median_kernel_us(fn: Any, args: list[torch.Tensor], reps: int) -> float:
    """Median device time of the compiled graph's kernels per call (all its launches summed)."""
    fn(*args)
    times = []
    for _ in range(reps):
        with torch_adreno.profile() as prof:
            fn(*args)
        times.append(sum(k.device_time_us for k in prof.kernels))
    return statistics.median(times)


def _torch_us(fn: Any, args: list[torch.Tensor], reps: int) -> tuple[float, str]:
    if torch.cuda.is_available():
        args = [a.cuda() for a in args]
        fn(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times), f"torch {torch.__version__} CUDA"
    fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times), f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads)"


def _find_clblast() -> ctypes.CDLL | None:
    candidates = [os.environ.get("TORCH_ADRENO_CLBLAST"), ctypes.util.find_library("clblast"), "libclblast.so.1",
                  str(Path(__file__).resolve().parents[1] / ".gpu" / "lib" / "libclblast.so.1")]
    for path in candidates:
        if not path:
            continue
        # A libOpenCL.so.1 (ICD loader) beside the library serves it when the system has none.
        loader = Path(path).parent / "libOpenCL.so.1"
        if loader.exists():
            ctypes.CDLL(str(loader), mode=ctypes.RTLD_GLOBAL)
        try:
            return ctypes.CDLL(path)
        except OSError as err:
            print(f"CLBlast: cannot load {path}: {err}")
    return None


class CLBlast:
    """CLBlastSgemm on our runtime's context and queue (row-major, no transposes)."""

    ROW_MAJOR, NO_TRANS = 101, 111

    def __init__(self, lib: ctypes.CDLL, runtime: Any) -> None:
        self.lib, self.runtime = lib, runtime
        size_t, vp = ctypes.c_size_t, ctypes.c_void_p
        lib.CLBlastSgemm.restype = ctypes.c_int
        lib.CLBlastSgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, size_t, size_t, size_t, ctypes.c_float,
                                     vp, size_t, size_t, vp, size_t, size_t, ctypes.c_float, vp, size_t, size_t,
                                     ctypes.POINTER(vp), ctypes.POINTER(vp)]

    def sgemm_us(self, n: int, reps: int) -> float:
        ctx, queue = self.runtime.context, self.runtime.queue
        mf = cl.mem_flags
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        b_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
        c_buf = cl.Buffer(ctx, mf.READ_WRITE, size=a.nbytes)
        queue_ptr = ctypes.c_void_p(queue.int_ptr)
        times = []
        for rep in range(reps + 1):
            queue.finish()
            start = time.perf_counter()
            # CLBlast may run several kernels (padding, transposes, the GEMM) and its event covers
            # only the last: time the whole call until the queue is idle.
            status = self.lib.CLBlastSgemm(self.ROW_MAJOR, self.NO_TRANS, self.NO_TRANS, n, n, n, 1.0,
                                           a_buf.int_ptr, 0, n, b_buf.int_ptr, 0, n, 0.0, c_buf.int_ptr, 0, n,
                                           ctypes.byref(queue_ptr), None)
            if status != 0:
                raise RuntimeError(f"CLBlastSgemm returned status {status}")
            queue.finish()
            if rep:  # the first call compiles CLBlast's kernels
                times.append((time.perf_counter() - start) * 1e6)
        c = np.empty_like(a)
        cl.enqueue_copy(queue, c, c_buf)
        err = np.abs(c - a @ b).max() / np.abs(a @ b).max()
        if err > 1e-4:
            raise RuntimeError(f"CLBlast result is wrong (relative error {err:.2e})")
        return statistics.median(times)


PEERS = ("adreno", "adreno_images", "adreno_tuned", "clblast", "torch")


def _ours(fn: Any, args: list[torch.Tensor], reps: int, options: dict[str, Any]) -> tuple[float, Any]:
    """Median device time of ``fn`` compiled with ``options``, and its output."""
    torch._dynamo.reset()  # a fresh compile per configuration: options differ, the function does not
    compiled = torch.compile(fn, backend="adreno", options=options)
    return _median_kernel_us(compiled, args, reps), compiled(*args)


def _measure(row: dict[str, Any], fn: Any, args: list[torch.Tensor], reps: int, options: dict[str, Any],
             tune: bool, images: bool = False) -> Any:
    """Fill ``row`` with ours (with images, if ``images``; tuned, if ``tune``) and PyTorch's times;
    returns our output (images off)."""
    row["adreno_us"], out = _ours(fn, args, reps, {**options, "images": False})
    if images:
        views = image_views(get_runtime(options.get("device")))
        shared, copies = views.shared_made, views.copies_made
        row["adreno_images_us"], with_images = _ours(fn, args, reps, {**options, "images": True})
        made_shared, made_copies = views.shared_made - shared, views.copies_made - copies
        row["images_mode"] = "shared" if made_shared and not made_copies else "copied" if made_copies and not made_shared \
            else f"{made_shared} shared, {made_copies} copied"
        row["images_max_abs_diff"] = (with_images - out).abs().max().item()
    if tune:
        row["adreno_tuned_us"], _ = _ours(fn, args, reps, {**options, "tune": True})
    row["torch_us"], row["torch_peer"] = _torch_us(fn, args, reps)
    return out


def _add_gflops(row: dict[str, Any]) -> None:
    for key in PEERS:
        if f"{key}_us" in row:
            row[f"{key}_gflops"] = row["flops"] / row[f"{key}_us"] / 1e3


def gemm_records(sizes: list[int], reps: int, device: Any, clblast: CLBlast | None,
                 tune: bool, images: bool = False) -> list[dict[str, Any]]:
    records = []
    options = {"device": device} if device is not None else {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        row: dict[str, Any] = {"kind": "sgemm", "shape": f"{n}x{n}x{n}", "flops": 2 * n**3}
        out = _measure(row, torch.mm, [a, b], reps, options, tune, images)
        row["adreno_rel_error"] = ((out - a @ b).abs().max() / (a @ b).abs().max()).item()
        if clblast is not None:
            row["clblast_us"] = clblast.sgemm_us(n, reps)
        _add_gflops(row)
        records.append(row)
        print(_format(row))
    return records


def conv_records(reps: int, device: Any, tune: bool, images: bool = False) -> list[dict[str, Any]]:
    records = []
    options = {"device": device} if device is not None else {}
    for name, batch, cin, cout, size, kernel, stride in RESNET_MINI_CONVS:
        x, w = torch.randn(batch, cin, size, size), torch.randn(cout, cin, kernel, kernel)

        def conv(x: torch.Tensor, w: torch.Tensor, stride: int = stride, padding: int = kernel // 2) -> torch.Tensor:
            return F.conv2d(x, w, stride=stride, padding=padding)

        out_size = (size + 2 * (kernel // 2) - kernel) // stride + 1
        row: dict[str, Any] = {"kind": "conv2d", "shape": name,
                               "flops": 2 * batch * cout * out_size * out_size * cin * kernel * kernel}
        _measure(row, conv, [x, w], reps, options, tune, images)
        _add_gflops(row)
        records.append(row)
        print(_format(row))
    return records


def _format(row: dict[str, Any]) -> str:
    peers = "  ".join(f"{k}: {row[f'{k}_gflops']:8.1f}" for k in PEERS if f"{k}_gflops" in row)
    mode = f"  (images {row['images_mode']})" if "images_mode" in row else ""
    return f"{row['kind']:<7} {row['shape']:<22} GFLOP/s  {peers}{mode}"


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [r["shape"] for r in records]
    peers = [k for k in PEERS if any(f"{k}_gflops" in r for r in records)]
    width = 0.8 / len(peers)
    for i, key in enumerate(peers):
        values = [r.get(f"{key}_gflops", 0.0) for r in records]
        ax.bar([j + i * width for j in range(len(records))], values, width, label=key)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(records))], labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GFLOP/s (device time)")
    ax.set_title(f"SGEMM and resnet_mini convolutions on {records[0].get('device', '')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--no-conv", action="store_true")
    parser.add_argument("--tune", action="store_true",
                        help="also time ours with tune=True (the verified fastest launch per kernel)")
    parser.add_argument("--images", action="store_true",
                        help="also time ours with images=True (operands read through image2d_t)")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "gemm.jsonl")
    args = parser.parse_args()
    device = args.device
    context = run_context(device)
    lib = _find_clblast()
    clblast = CLBlast(lib, get_runtime(device)) if lib is not None else None
    if clblast is None:
        print("CLBlast: libclblast not found (set TORCH_ADRENO_CLBLAST to its path), skipped")
    records = gemm_records(args.sizes, args.reps, device, clblast, args.tune, args.images)
    if not args.no_conv:
        records += conv_records(args.reps, device, args.tune, args.images)
    records = [{**context, **r} for r in records]
    out = append_jsonl(args.out, records)
    plot(records, out.with_suffix(".png"))
    print(f"JSON lines: {out}; plot: {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
