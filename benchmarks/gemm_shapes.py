"""Our GEMM and convolution kernels at the shapes of the real workloads, each kernel on its own.

The workloads (benchmarks/workloads.py) spend most of their device time in GEMM kernels: GPT-2
LoRA's linear layers (1,024 tokens x 768 / 2,304 / 3,072 features, forward and the input
gradient of the frozen weights), its 50,257-word head, and ResNet-18's convolutions (forward,
input gradient, weight gradient). This times every GEMM kernel of each such layer compiled on its
own (forward and backward graphs), with the heuristic's choices, without the split that fills the device (``--variants
unfilled``) and with the tuner's best, next to PyTorch's forward and backward of the same layer on the same GPU (CUDA events; TF32
off). Each kernel's row says its launch geometry (work-groups x work-items), FLOPs, bytes and
achieved GFLOP/s, so that the heuristic's choices can be judged shape by shape.

    python benchmarks/gemm_shapes.py --device NVIDIA [--variants heuristic unfilled tuned] [--cases gpt2 resnet18] [--reps 10]

Appends JSON lines to benchmarks/results/<device>/gemm_shapes.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.fusion import split_k
from torch_adreno.kernels import gemm

#: (case, make(batch) -> (module, input)); the modules are the workloads' layers at full size.
Layer = tuple[str, Callable[[], tuple[torch.nn.Module, torch.Tensor]]]


class FrozenLinear(torch.nn.Module):
    """A frozen linear layer (LoRA's base weights): the backward computes only the input gradient."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(d_in, d_out, bias=bias)
        self.linear.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class FrozenMLP(torch.nn.Module):
    """GPT-2's MLP with frozen weights over [batch, seq, d] inputs, as the LoRA model runs it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc, self.c_proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Conv(torch.nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _linear(tokens: int, d_in: int, d_out: int, bias: bool = True) -> Callable[[], tuple[torch.nn.Module, torch.Tensor]]:
    return lambda: (FrozenLinear(d_in, d_out, bias), torch.randn(tokens, d_in, requires_grad=True))


def _conv(batch: int, c_in: int, c_out: int, size: int, kernel: int, stride: int,
          input_grad: bool = True) -> Callable[[], tuple[torch.nn.Module, torch.Tensor]]:
    return lambda: (Conv(c_in, c_out, kernel, stride),
                    torch.randn(batch, c_in, size, size, requires_grad=input_grad))


CASES: dict[str, list[Layer]] = {
    "gpt2": [
        ("gpt2 c_attn 1024x768->2304", _linear(1024, 768, 2304)),
        ("gpt2 attn c_proj 1024x768->768", _linear(1024, 768, 768)),
        ("gpt2 mlp c_fc 1024x768->3072", _linear(1024, 768, 3072)),
        ("gpt2 mlp c_proj 1024x3072->768", _linear(1024, 3072, 768)),
        ("gpt2 head 1024x768->50257", _linear(1024, 768, 50257, bias=False)),
        ("gpt2 mlp 4x256x768 c_fc gelu c_proj", lambda: (FrozenMLP(768), torch.randn(4, 256, 768, requires_grad=True))),
    ],
    "square": [
        ("square 4096x4096->4096", _linear(4096, 4096, 4096, bias=False)),
    ],
    "resnet18": [
        ("resnet18 stem 3->64 7x7 s2 @224", _conv(16, 3, 64, 224, 7, 2, input_grad=False)),
        ("resnet18 layer1 64->64 3x3 @56", _conv(16, 64, 64, 56, 3, 1)),
        ("resnet18 layer2 64->128 3x3 s2 @56", _conv(16, 64, 128, 56, 3, 2)),
        ("resnet18 layer2 128->128 3x3 @28", _conv(16, 128, 128, 28, 3, 1)),
        ("resnet18 layer2 down 64->128 1x1 s2 @56", _conv(16, 64, 128, 56, 1, 2)),
        ("resnet18 layer3 256->256 3x3 @14", _conv(16, 256, 256, 14, 3, 1)),
        ("resnet18 layer4 512->512 3x3 @7", _conv(16, 512, 512, 7, 3, 1)),
    ],
}


def _l2_flusher(flush_mb: int, device: Any) -> Callable[[], None]:
    """A fill of a ``flush_mb`` MB buffer on the runtime's queue (nothing for 0): what a layer's
    kernels read then comes from device memory, as inside a training step, not from the L2 cache
    that the previous repetition left warm."""
    if not flush_mb:
        return lambda: None
    import pyopencl as cl

    from torch_adreno.runtime.device import get_runtime
    runtime = get_runtime(device)
    buffer = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, flush_mb << 20)
    pattern = np.zeros(1, np.float32)

    def flush() -> None:
        cl.enqueue_fill_buffer(runtime.queue, buffer, pattern, 0, flush_mb << 20)
    return flush


def _our_kernels(module: torch.nn.Module, x: torch.Tensor, reps: int, options: dict[str, Any],
                 flush_mb: int = 0) -> list[dict[str, Any]]:
    """Each kernel of the layer's forward and backward graphs: median device time over ``reps`` calls
    (``flush_mb``: the L2 cache flushed before the forward and before the backward)."""
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="adreno", options=options)
    flush = _l2_flusher(flush_mb, options.get("device"))
    grad = None
    times: dict[tuple[str, str], list[float]] = {}
    records: dict[tuple[str, str], Any] = {}
    for rep in range(reps + 1):
        with torch_adreno.profile() as prof:
            flush()
            y = compiled(x)
            if grad is None:
                grad = torch.randn_like(y)
            flush()
            y.backward(grad)
        if rep == 0:
            continue  # the first call compiles
        for k in prof.kernels:
            key = (k.graph, k.name)
            times.setdefault(key, []).append(k.device_time_us or 0.0)
            records[key] = k
    return _kernel_rows(times, records)


def _kernel_rows(times: dict[Any, list[float]], records: dict[Any, Any]) -> list[dict[str, Any]]:
    """A row per profiled kernel: its median device time over ``times``' samples, launch geometry,
    FLOPs and bytes (``records``: the kernel record under the same key). A kernel belongs to the
    backward where its graph's or its own name says so (a replayed step's graph is the step)."""
    rows = []
    for key, samples in times.items():
        k = records[key]
        us = statistics.median(samples)
        groups = math.prod(g // max(loc, 1) for g, loc in zip(k.global_size, k.local_size, strict=False)) \
            if k.local_size else None
        backward = "backward" in k.graph or k.name.startswith("backward")
        rows.append({"graph": "backward" if backward else "forward", "kernel": k.name, "kind": k.kind,
                     "aten_ops": list(k.aten_ops), "us": us, "gflop": k.flops / 1e9,
                     "gflops": k.flops / us / 1e3 if us else None, "mb": (k.bytes_read + k.bytes_written) / 1e6,
                     "global_size": list(k.global_size), "local_size": list(k.local_size), "work_groups": groups})
    return rows


def _replayed_kernels(module: torch.nn.Module, x: torch.Tensor, reps: int, options: dict[str, Any],
                      arena_kernels: bool) -> list[dict[str, Any]]:
    """Each kernel of the layer inside a replayed ``TrainingStep`` (loss ``(y * g).sum()``, SGD at
    learning rate 0 so that every repetition multiplies the same numbers), with its kernels rebuilt
    for the step's arena or bound as compiled (``replay_arena_kernels``): the layer's GEMMs as a
    training step runs them, to set beside :func:`_our_kernels`' compiled calls."""
    torch._dynamo.reset()
    with torch.no_grad():
        grad = torch.randn_like(module(x))
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.0)
    step = torch_adreno.TrainingStep(module, lambda model, inputs, g: (model(inputs) * g).sum(), optimizer,
                                     options={**options, "replay_arena_kernels": arena_kernels})
    inputs = x.detach().requires_grad_(False)
    times: dict[str, list[float]] = {}
    records: dict[str, Any] = {}
    for rep in range(reps + 2):
        with torch_adreno.profile() as prof:
            float(step(inputs, grad))
        if rep < 2:
            continue  # compiled, then captured
        assert step.replayed_steps, "the layer's step was not replayed"
        for k in prof.kernels:
            times.setdefault(k.name, []).append(k.device_time_us or 0.0)
            records[k.name] = k
    return _kernel_rows(times, records)


def _torch_times(module: torch.nn.Module, x: torch.Tensor, reps: int) -> dict[str, float]:
    """PyTorch's forward and backward of the layer (CUDA events, TF32 off), microseconds."""
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module = module.cuda()
    x = x.detach().cuda().requires_grad_(x.requires_grad)
    y = module(x)
    grad = torch.randn_like(y)
    forward, backward = [], []
    for _ in range(reps + 2):
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        y = module(x)
        mid.record()
        y.backward(grad)
        end.record()
        torch.cuda.synchronize()
        forward.append(start.elapsed_time(mid) * 1e3)
        backward.append(mid.elapsed_time(end) * 1e3)
    return {"torch_forward_us": statistics.median(forward[2:]), "torch_backward_us": statistics.median(backward[2:])}


VARIANTS = ("heuristic", "unfilled", "tuned", "wide_n", "wide_m", "items_8x8", "narrow_k_step", "slices_2",
            "slices_3", "half_filled_k16", "full_tiles", "wide_k_step_8", "unsplit_64")


def _wide_tiling(wide_n: bool) -> Any:
    """``choose_tiling`` with 128 x 256 (``wide_n``) or 256 x 128 output tiles, 8 x 16 (16 x 8)
    outputs per work-item, where the extents fill them and the tiles still number the compute
    units; the heuristic's choice elsewhere."""
    heuristic = gemm.choose_tiling

    def choose(m: int, n: int, batch: int, profile: Any, choices: Any = None) -> gemm.GemmTiling:
        tile_m, tile_n = (128, 256) if wide_n else (256, 128)
        if m >= tile_m and n >= tile_n and math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch >= profile.compute_units:
            return gemm.GemmTiling(tile_m, tile_n, 8, tile_m // 16, tile_n // 16)
        return heuristic(m, n, batch, profile, choices)

    return choose


#: A rewrite of the heuristic's tiling: (its tiling, m, n, batch, profile) -> the tiling to use.
Rewrite = Callable[[gemm.GemmTiling, int, int, int, Any], gemm.GemmTiling]


def _rewritten_tiling(rewrite: Rewrite) -> Any:
    """``choose_tiling`` as the heuristic chooses, then passed through ``rewrite``."""
    heuristic = gemm.choose_tiling

    def choose(m: int, n: int, batch: int, profile: Any, choices: Any = None) -> gemm.GemmTiling:
        return rewrite(heuristic(m, n, batch, profile, choices), m, n, batch, profile)

    return choose


def _items_8x8(t: gemm.GemmTiling, m: int, n: int, batch: int, profile: Any) -> gemm.GemmTiling:
    """8 x 8 outputs per work-item wherever the heuristic's tile is 128 x 64 with fewer (128
    work-items in place of 256; 64 x 128 tiles so were slower at every ResNet-18 layer, 128 x 64
    ones faster on the H200, 2026-12-03)."""
    if (t.tile_m, t.tile_n) == (128, 64) and (t.wpt_m, t.wpt_n) != (8, 8):
        return gemm.GemmTiling(t.tile_m, t.tile_n, t.tile_k, 8, 8)
    return t


def _narrow_k_step(t: gemm.GemmTiling, m: int, n: int, batch: int, profile: Any) -> gemm.GemmTiling:
    """A K step of 8 in 64 x 128 tiles (the 64-channel convolutions' tile)."""
    return gemm.GemmTiling(64, 128, 8, t.wpt_m, t.wpt_n) if (t.tile_m, t.tile_n) == (64, 128) else t


def _half_filled_k16(t: gemm.GemmTiling, m: int, n: int, batch: int, profile: Any) -> gemm.GemmTiling:
    """A K step of 16 in the half-filled 128 x 64 tiles (8 x 4 per work-item)."""
    return gemm.GemmTiling(128, 64, 16, t.wpt_m, t.wpt_n) if (t.tile_m, t.tile_n, t.wpt_n) == (128, 64, 4) else t


def _full_tiles(t: gemm.GemmTiling, m: int, n: int, batch: int, profile: Any) -> gemm.GemmTiling:
    """128 x 128 tiles where the heuristic takes half-filled 128 x 64 ones for under 1.5 per compute unit."""
    if ((t.tile_m, t.tile_n, t.wpt_n) == (128, 64, 4) and n >= 128
            and math.ceil(m / 128) * math.ceil(n / 128) * batch >= profile.compute_units):
        return gemm.GemmTiling(128, 128, 8, 8, 8)
    return t


def _wide_k_step_8(t: gemm.GemmTiling, m: int, n: int, batch: int, profile: Any) -> gemm.GemmTiling:
    """A K step of 8 in every 128 x 64 tile (those the heuristic picks outright, not as half-filled
    128 x 128 ones, have a K step of 16)."""
    if (t.tile_m, t.tile_n) == (128, 64) and t.tile_k != 8:
        return gemm.GemmTiling(128, 64, 8, t.wpt_m, t.wpt_n)
    return t


#: The variants that rewrite the heuristic's tiling, by the prefix of their name.
TILING_REWRITES: dict[str, Rewrite] = {
    "items_8x8": _items_8x8, "narrow_k_step": _narrow_k_step, "half_filled_k16": _half_filled_k16,
    "full_tiles": _full_tiles, "wide_k_step_8": _wide_k_step_8,
}


def _unsplit_where_64_tiles_fill() -> Any:
    """``split_k.choose_large_tile_split`` leaving whole every GEMM whose 64 x 64 tiles number the
    compute units (multiplied in those tiles, no slice sums: fewer bytes, for 16-bit operands)."""
    heuristic = split_k.choose_large_tile_split

    def choose(g: Any, compute_units: int) -> int:
        return 1 if split_k.output_tiles(g) >= compute_units else heuristic(g, compute_units)

    return choose


def _at_most_slices(most: int) -> Any:
    """``split_k.choose_large_tile_split`` cutting k into at most ``most`` slices."""
    heuristic = split_k.choose_large_tile_split

    def choose(g: Any, compute_units: int) -> int:
        return min(most, heuristic(g, compute_units))

    return choose


def unfilled() -> None:
    """No GEMM split to fill the compute units (the split policy's fill rules return one slice)."""
    split_k.choose_large_tile_split = split_k.choose_small_output_split = lambda g, compute_units: 1


@contextlib.contextmanager
def heuristics(variant: str) -> Iterator[None]:
    """The compiler with one of its choices replaced (the functions that make them; the templates'
    code paths are fixed). ``unfilled``: GEMMs of few 128 x 128 tiles (or too narrow for them) not
    split to fill the device (``fusion.split_k.choose_large_tile_split``, ``choose_small_output_split``). ``wide_n`` / ``wide_m``: 128 x 256 / 256 x 128
    tiles, 8 x 16 / 16 x 8 outputs per work-item, where they fit (``_wide_tiling``). ``items_8x8``:
    8 x 8 outputs per work-item in 128 x 64 tiles (``_items_8x8``); ``narrow_k_step``: a K step of 8
    in 64 x 128 tiles. ``slices_2`` / ``slices_3``: GEMMs of few 128 x 128 tiles cut into at most 2 /
    3 slices (``_at_most_slices``). ``half_filled_k16``: the half-filled 128 x 64 tiles with a K step
    of 16; ``full_tiles``: 128 x 128 tiles in their place; ``wide_k_step_8``: a K step of 8 in every
    128 x 64 tile (``TILING_REWRITES``). ``unsplit_64``: no k split where 64 x 64 tiles number the
    compute units, those tiles instead (``_unsplit_where_64_tiles_fill``)."""
    original = gemm.choose_tiling
    large_tile_split, small_output_split = split_k.choose_large_tile_split, split_k.choose_small_output_split
    if variant.startswith("slices_"):
        split_k.choose_large_tile_split = _at_most_slices(int(variant.split("_")[1]))
    if variant == "unsplit_64":
        split_k.choose_large_tile_split = _unsplit_where_64_tiles_fill()
    rewrite = next((r for prefix, r in TILING_REWRITES.items() if variant.startswith(prefix)), None)
    if rewrite is not None:
        gemm.choose_tiling = _rewritten_tiling(rewrite)
    if variant == "unfilled":
        unfilled()
    if variant in ("wide_n", "wide_m"):
        gemm.choose_tiling = _wide_tiling(variant == "wide_n")
    try:
        yield
    finally:
        gemm.choose_tiling = original
        split_k.choose_large_tile_split, split_k.choose_small_output_split = large_tile_split, small_output_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--only", nargs="*", default=None, help="substrings of the layer names to run")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--variants", nargs="+", default=["heuristic"], choices=list(VARIANTS),
                        help="heuristic: as compiled today; unfilled: without the split of GEMMs of few "
                             "128 x 128 tiles; tuned: the tuner's choice")
    parser.add_argument("--label", default="", help="a label recorded with each row (the variant measured)")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                        help="the layers' weights and inputs in these types (16-bit: the GEMMs of a 16-bit "
                             "frozen base; PyTorch's 16-bit GEMMs use tensor cores, ours cannot through OpenCL)")
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "gemm_shapes.jsonl")
    parser.add_argument("--sources", type=Path, default=None,
                        help="write each compiled kernel's OpenCL source, its build options in its first line, "
                             "under this folder (the debug_dir option), one subfolder per layer and variant")
    parser.add_argument("--flush-l2", type=int, default=0, metavar="MB",
                        help="fill a buffer of this many MB before each forward and backward, so that the "
                             "kernels read from device memory as inside a step (0: off, L2 warm from the last rep)")
    parser.add_argument("--replayed", nargs="+", default=["compiled"], choices=["compiled", "arena", "bound"],
                        help="how the layer runs: compiled (forward and backward calls), arena (a replayed "
                             "TrainingStep, kernels rebuilt for its arena), bound (replayed, kernels bound as compiled)")
    args = parser.parse_args()
    base = {"device": args.device} if args.device is not None else {}
    context = run_context(base.get("device"))
    for case in args.cases:
        for name, make in CASES[case]:
            if args.only and not any(s in name for s in args.only):
                continue
            for dtype_name in args.dtypes:
                dtype = getattr(torch, dtype_name)
                torch.manual_seed(0)
                module, x = make()
                module, x = module.to(dtype), x.detach().to(dtype).requires_grad_(x.requires_grad)
                reference = _torch_times(module, x, args.reps)
                module = module.cpu()
                for variant in args.variants:
                    options = {**base, "compile_cache": False, **({"tune": True} if variant == "tuned" else {})}
                    if args.sources is not None:
                        folder = "".join(c if c.isalnum() else "_" for c in f"{name}_{dtype_name}_{variant}")
                        options["debug_dir"] = str(args.sources / folder)
                    for how in args.replayed:
                        if how != "compiled" and not any(p.requires_grad for p in module.parameters()):
                            print(f"{name}: not run as {how}: a training step needs a trainable parameter", flush=True)
                            continue
                        with heuristics(variant):
                            if how == "compiled":
                                kernels = _our_kernels(module, x, args.reps, options, args.flush_l2)
                            else:
                                kernels = _replayed_kernels(copy.deepcopy(module), x, args.reps, options, how == "arena")
                        gemm = [k for k in kernels if k["kind"] == "gemm"]
                        row = {**context, "benchmark": "gemm_shapes", "label": args.label, "flush_l2_mb": args.flush_l2, "layer": name,
                               "variant": variant, "run_as": how, "dtype": dtype_name,
                               **reference, "ours_forward_us": sum(k["us"] for k in kernels if k["graph"] == "forward"),
                               "ours_backward_us": sum(k["us"] for k in kernels if k["graph"] == "backward"),
                               "gemm_us": sum(k["us"] for k in gemm), "gemm_gflop": sum(k["gflop"] for k in gemm),
                               "kernels": kernels}
                        row["gemm_gflops"] = row["gemm_gflop"] / row["gemm_us"] * 1e6 if row["gemm_us"] else None
                        append_jsonl(args.out, [row])
                        print(f"{name:<42} {dtype_name:<8} {variant:<9} {how:<8} ours fwd {row['ours_forward_us']:8.1f} bwd {row['ours_backward_us']:8.1f} us"
                              f"  torch fwd {reference.get('torch_forward_us', float('nan')):8.1f} "
                              f"bwd {reference.get('torch_backward_us', float('nan')):8.1f}  gemm {row['gemm_gflops'] or 0:8.0f} GFLOP/s",
                              flush=True)
                        for k in gemm:
                            print(f"    {k['graph']:<8} {k['kernel'][:60]:<60} {k['us']:8.1f} us {k['gflops'] or 0:8.0f} GFLOP/s"
                                  f" groups {k['work_groups']} local {k['local_size']}", flush=True)


if __name__ == "__main__":
    main()
