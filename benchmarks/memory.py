"""Device memory and host<->device traffic of a training step, per reference model.

* Peak device memory of the step (forward, then backward while the saved activations live), as
  planned with memory reuse and without, next to eager PyTorch's torch.cuda.max_memory_allocated
  for the same step where CUDA is available.
* Bytes copied host->device and device->host per step with the optimizer on the host and with
  ``torch.compile(opt.step, backend="adreno")``, with copies and with zero-copy sharing, next to
  the minimum (batch + labels + loss).

    python benchmarks/memory.py --models resnet_mini transformer

Appends JSON lines to benchmarks/results/<device>/memory.jsonl (or --out).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.models import MODELS


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x), y)


def measure(model_name: str, options: dict[str, Any], optimizer: str) -> dict[str, Any]:
    """One profiled training step after two warm-up steps, each with a batch the device has not seen
    (a new tensor, as a data loader gives). ``optimizer``: "host" (eager ``opt.step``), "device"
    (``torch.compile(opt.step)``) or "training_step" (:class:`torch_adreno.TrainingStep`)."""
    torch._dynamo.reset()
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if optimizer == "training_step":
        training_step = torch_adreno.TrainingStep(model, _loss, opt, options=options)

        def run() -> torch.Tensor:
            return training_step(x.clone(), y.clone())
    else:
        step_loss = torch.compile(_loss, backend="adreno", options=options, dynamic=False)
        step = torch.compile(opt.step, backend="adreno", options=options) if optimizer == "device" else opt.step

        def run() -> torch.Tensor:
            opt.zero_grad()
            loss = step_loss(model, x.clone(), y.clone())
            loss.backward()
            step()
            return loss

    for _ in range(2):
        run()
    with torch_adreno.profile() as prof:
        loss = run()
    if optimizer == "training_step":
        training_step.close()
    minimum = x.numel() * x.element_size() + y.numel() * y.element_size() + loss.element_size()
    return {
        "model": model_name, "options": options, "optimizer": optimizer,
        "optimizer_on_device": optimizer != "host",
        "bytes_host_to_device": prof.bytes_host_to_device, "bytes_device_to_host": prof.bytes_device_to_host,
        "bytes_shared": prof.bytes_shared, "minimum_bytes": minimum,
        "copied_over_minimum": (prof.bytes_host_to_device + prof.bytes_device_to_host) / minimum,
        "step_peak_planned": prof.step_peak_device_bytes("planned"),
        "step_peak_unshared": prof.step_peak_device_bytes("unshared"),
        "graphs": prof.peak_device_bytes, "saved_activation_bytes_crossing":
            prof.transfer_bytes("d2h", "saved_activation", copied=None) + prof.transfer_bytes("h2d", "saved_activation", copied=None),
    }


def eager_cuda_peak(model_name: str) -> int | None:
    if not torch.cuda.is_available():
        return None
    spec = MODELS[model_name]
    torch.manual_seed(0)
    model = copy.deepcopy(spec.make()).cuda()
    x, y = (t.cuda() for t in spec.batch(torch.Generator().manual_seed(0)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        _loss(model, x, y).backward()
        opt.step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    opt.zero_grad()
    _loss(model, x, y).backward()
    opt.step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--device", default=None, type=device_arg)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "memory.jsonl")
    args = parser.parse_args()
    device = args.device
    base = {"device": device} if device is not None else {}
    context = run_context(device)
    print(f"{'model':<12} {'peak MB reuse/none':>20} {'ratio':>6} {'budget 0.5':>10} {'eager CUDA MB':>14}   "
          f"copied bytes/step over minimum: host opt, device opt, TrainingStep (copies) | device opt (zero-copy where unified)")
    for model in args.models:
        rows = [measure(model, {**base, "zero_copy": False}, "host"),
                measure(model, {**base, "zero_copy": False}, "device"),
                measure(model, {**base, "zero_copy": "auto"}, "device"),
                # Fewer saved activations: BatchNorm/activations recomputed in the backward.
                measure(model, {**base, "zero_copy": False, "activation_memory_budget": 0.5}, "host"),
                measure(model, {**base, "zero_copy": False}, "training_step")]
        eager_peak = eager_cuda_peak(model)
        for r in rows:
            r["eager_cuda_peak_bytes"] = eager_peak
        append_jsonl(args.out, [{**r, **context, "benchmark": "memory"} for r in rows])
        a, budget = rows[0], rows[3]
        eager = f"{eager_peak / 1e6:.1f}" if eager_peak else "n/a"
        print(f"{model:<12} {a['step_peak_planned'] / 1e6:>9.1f}/{a['step_peak_unshared'] / 1e6:<9.1f} "
              f"{a['step_peak_planned'] / a['step_peak_unshared']:>6.2f} "
              f"{budget['step_peak_planned'] / budget['step_peak_unshared']:>10.2f} {eager:>14}   "
              + ", ".join(f"{r['copied_over_minimum']:.2f}x" for r in (rows[0], rows[1], rows[4]))
              + f" | {rows[2]['copied_over_minimum']:.2f}x"
              + f"  (minimum {a['minimum_bytes']} B)")


if __name__ == "__main__":
    main()
