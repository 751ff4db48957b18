"""Training runs in several precisions, eager or compiled, for the half-precision tests and
``benchmarks/precision.py``: the same model, initial weights and batches in every run."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from helpers import LaunchProfile

from torch_adreno.kernels.expressions import STORAGE_CTYPE
from torch_adreno.kernels.params import Role
from torch_adreno.models import MODELS

#: precision -> (autocast dtype or None, parameter dtype, GradScaler or not)
PRECISIONS: dict[str, tuple[torch.dtype | None, torch.dtype, bool]] = {
    "float64": (None, torch.float64, False),
    "float32": (None, torch.float32, False),
    "fp16_autocast": (torch.float16, torch.float32, True),
    "bf16_autocast": (torch.bfloat16, torch.float32, False),
    "half": (None, torch.float16, False),
    "bfloat16": (None, torch.bfloat16, False),
}


@dataclass
class Run:
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    host_fallback_ops: int = 0
    skipped_steps: int = 0
    scales: list[float] = field(default_factory=list)
    #: Compiled runs: kernels launched, and per graph kind ("forward", "backward") and direction
    #: ("read", "write") the OpenCL element types of the buffers the launched kernels took.
    kernel_launches: int = 0
    storage: dict[tuple[str, str], set[str]] = field(default_factory=dict)


def train(model_name: str, precision: str, steps: int, compiled: bool, lr: float = 0.02,
          options: dict[str, Any] | None = None, batches: int = 4, init_scale: float = 2.0**12) -> Run:
    """``steps`` SGD steps (momentum 0.9) of a reference model, the plain loop: forward under
    autocast where the precision asks for it, ``GradScaler`` for float16 autocast."""
    autocast_dtype, param_dtype, scaled = PRECISIONS[precision]
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make().to(param_dtype)
    data = [spec.batch(torch.Generator().manual_seed(i)) for i in range(batches)]
    if not spec.vocabulary:
        data = [(x.to(param_dtype), y) for x, y in data]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if scaled else None
    if compiled:
        torch._dynamo.reset()
        forward = torch.compile(model, backend="adreno", options=options or {})
    else:
        forward = model
    run = Run()
    profile = LaunchProfile() if compiled else contextlib.nullcontext()
    with profile as prof:
        for i in range(steps):
            x, y = data[i % batches]
            start = time.perf_counter()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
                loss = F.cross_entropy(forward(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                run.scales.append(scale)
                run.skipped_steps += int(scaler.get_scale() < scale)
            else:
                loss.backward()
                opt.step()
            run.losses.append(float(loss.detach()))
            run.step_seconds.append(time.perf_counter() - start)
    if compiled:
        run.host_fallback_ops = len(prof.host_fallback_ops)
        run.kernel_launches = prof.kernel_launches
        run.storage = buffer_types(prof)
    return run


#: The OpenCL element type a kernel's buffer of each 16-bit dtype is declared with.
STORAGE_TYPE = {torch.float16: "half", torch.bfloat16: "ushort"}


#: IR buffers of float32 partial sums by design, whatever the model's type: split-K slice sums and
#: split reductions' partial rows (an accumulator's precision, as a GEMM's registers are).
PARTIAL_SUM_SUFFIXES = ("_slices", "_partials")


def buffer_types(prof: LaunchProfile) -> dict[tuple[str, str], set[str]]:
    """Per (graph kind, "read" or "write"), the element types of the ``__global`` buffers the
    launched kernels take (their parameter records): what the device stored, whatever the
    results' dtypes say. Partial sums (:data:`PARTIAL_SUM_SUFFIXES`) are left out."""
    types: dict[tuple[str, str], set[str]] = {}
    for kernel in {k.name: k for k in prof.launched}.values():
        kind = kernel.name.split("_", 1)[0]
        for param in kernel.arguments:
            if (param.address_space != "__global" or param.role is Role.ARENA
                    or param.key.endswith(PARTIAL_SUM_SUFFIXES)):
                continue  # an arena argument holds buffers of several types (each located one counts)
            ctype = STORAGE_CTYPE.get(param.dtype)
            if ctype is not None:
                types.setdefault((kind, "write" if param.written else "read"), set()).add(ctype)
    return types


def distance(losses: list[float], reference: list[float]) -> float:
    """Mean absolute difference of two loss curves."""
    return sum(abs(a - b) for a, b in zip(losses, reference, strict=True)) / len(reference)
