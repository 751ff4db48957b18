"""Every allocation within the target (issue 29 item 1): train a workload through ``TrainingStep``
compiled for an Adreno target and record every ``cl.Buffer`` and every image of its own the process
makes, the replay's arena buffers and the step's device footprint against the target's limits.

    python benchmarks/allocation_limits.py                          # MobileNetV2 224x224 batch 32, adreno740
    python benchmarks/allocation_limits.py --workload gpt2_lora --seq 512 --batch 4
    python benchmarks/allocation_limits.py --small --max-alloc-mib 4   # PoCL: a reduced model, a 4 MiB limit

One JSON line per run (``--out``, default benchmarks/results/allocation_limits.jsonl): the largest
buffer and image made, how many, the arena's buffers, the footprint's parts and total, the limits,
and ``within_limits``. Issue 29's done-when: MobileNetV2 at 224x224, batch 32, target adreno740 (and
the GPT-2 LoRA shapes) with no allocation over 1 GiB and a footprint within the global memory.
A benchmark, not a test: it reports, it asserts nothing (the full sizes take far too long on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import pyopencl as cl
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt2_lora
from common import RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.target import profiles

#: The reduced MobileNetV2 of --small (each kind of block at width 0.25), as benchmarks/workloads.py's.
SMALL_MOBILENET_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2], [6, 64, 1, 2]]


class Allocations:
    """Bytes of every ``cl.Buffer`` and every image of its own made while installed (pyopencl's
    Buffer replaced by a subclass that records, ``create_image`` wrapped)."""

    def __init__(self) -> None:
        self.buffers: list[int] = []
        self.images: list[int] = []

    def install(self) -> None:
        made = self
        buffer_class, create_image = cl.Buffer, cl.create_image

        class RecordedBuffer(buffer_class):  # type: ignore[misc, valid-type]
            def __init__(self, context: Any, flags: Any, size: int = 0, hostbuf: Any = None) -> None:
                made.buffers.append(size if hostbuf is None else memoryview(hostbuf).nbytes)
                if hostbuf is None:
                    super().__init__(context, flags, size)
                else:
                    super().__init__(context, flags, size, hostbuf)

        def recorded_image(context: Any, flags: Any, format: Any, shape: Any = None, **kwargs: Any) -> Any:
            texels = 1
            for extent in shape:
                texels *= int(extent)
            made.images.append(format.itemsize * texels)
            return create_image(context, flags, format, shape=shape, **kwargs)

        cl.Buffer = RecordedBuffer  # type: ignore[misc]
        cl.create_image = recorded_image


def mobilenet(args: argparse.Namespace) -> tuple[torch.nn.Module, list[torch.nn.Parameter], tuple[Any, ...], Any]:
    from torch_adreno.models import mobilenet_v2

    classes = 10 if args.small else 1000
    kwargs: dict[str, Any] = {"dropout": 0.0}
    if args.small:
        kwargs.update(width_mult=0.25, inverted_residual_setting=SMALL_MOBILENET_SETTING)
    torch.manual_seed(0)
    model = mobilenet_v2(classes, **kwargs).train()
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(args.batch, 3, args.image, args.image, generator=generator),
             torch.randint(0, classes, (args.batch,), generator=generator))
    return model, list(model.parameters()), batch, lambda m, x, y: F.cross_entropy(m(x), y)


def lora(args: argparse.Namespace) -> tuple[torch.nn.Module, list[torch.nn.Parameter], tuple[Any, ...], Any]:
    base = gpt2_lora.SMALL if args.small else gpt2_lora.FULL
    cfg = dataclasses.replace(base, seq=args.seq, batch=args.batch)
    torch.manual_seed(0)
    model = gpt2_lora.gpt2_lora(cfg).train()
    batch = gpt2_lora.token_batch(cfg, torch.Generator().manual_seed(1))
    return model, gpt2_lora.trainable_parameters(model), batch, gpt2_lora.lm_loss


WORKLOADS = {"mobilenet_v2": mobilenet, "gpt2_lora": lora}


def run(args: argparse.Namespace) -> dict[str, Any]:
    target = args.target
    if args.max_alloc_mib is not None:
        derived = profiles.derive_target(target, f"{target}_{args.max_alloc_mib:g}mib", "--max-alloc-mib",
                                         max_alloc_bytes=int(args.max_alloc_mib * 2**20))
        profiles.register_target(derived)
        target = derived.name
    model, trainable, batch, loss_fn = WORKLOADS[args.workload](args)
    optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)
    allocations = Allocations()
    allocations.install()
    options = {"target": target, **({"device": args.device} if args.device is not None else {})}
    step = torch_adreno.TrainingStep(model, loss_fn, optimizer, options=options)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        loss = float(step(*batch))
        times.append(time.perf_counter() - started)
    footprint = step.device_footprint
    limits = step.memory_limits
    largest_buffer = max(allocations.buffers, default=0)
    largest_image = max(allocations.images, default=0)
    record = {
        **run_context(args.device), "workload": args.workload, "small": args.small, "batch": args.batch,
        "image": args.image if args.workload == "mobilenet_v2" else None, "seq": args.seq, "target": target,
        "max_allocation_bytes": limits.max_allocation_bytes, "global_memory_bytes": limits.global_memory_bytes,
        "buffers_made": len(allocations.buffers), "largest_buffer_bytes": largest_buffer,
        "images_made": len(allocations.images), "largest_image_bytes": largest_image,
        "replayed_steps": step.replayed_steps, "last_loss": loss, "step_seconds": times,
    }
    if footprint is not None:
        record.update(arena_buffers=list(footprint.arena_buffers), persistent_bytes=footprint.persistent_bytes,
                      arena_bytes=footprint.arena_bytes, image_bytes=footprint.image_bytes,
                      graph_arena_bytes=footprint.graph_arena_bytes, footprint_bytes=footprint.total_bytes,
                      footprint=footprint.describe())
    record["within_limits"] = (footprint is not None and footprint.fits
                               and max(largest_buffer, largest_image) <= limits.max_allocation_bytes)
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mobilenet_v2")
    parser.add_argument("--target", default="adreno740", choices=profiles.target_names())
    parser.add_argument("--batch", type=int, default=None, help="default: 32 (MobileNetV2), 4 (GPT-2); --small: 4, 2")
    parser.add_argument("--image", type=int, default=None, help="MobileNetV2's image size (default 224; --small 64)")
    parser.add_argument("--seq", type=int, default=None, help="GPT-2's sequence length (default 512; --small 32)")
    parser.add_argument("--small", action="store_true", help="reduced models that train on PoCL in minutes")
    parser.add_argument("--max-alloc-mib", type=float, default=None,
                        help="hold the run to a copy of the target with this largest allocation (a split on PoCL)")
    parser.add_argument("--steps", type=int, default=3, help="steps: compile, capture, then replays (default 3)")
    parser.add_argument("--device", type=device_arg, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "allocation_limits.jsonl")
    args = parser.parse_args(argv)
    vision = args.workload == "mobilenet_v2"
    if args.batch is None:
        args.batch = (4 if vision else 2) if args.small else (32 if vision else 4)
    if args.image is None:
        args.image = 64 if args.small else 224
    if args.seq is None and not vision:
        args.seq = 32 if args.small else 512
    return args


def main() -> None:
    args = parse_args()
    record = run(args)
    append_jsonl(args.out, [record])
    print(record.get("footprint", "no replay captured"))
    print(f"buffers made {record['buffers_made']} (largest {record['largest_buffer_bytes']:,} bytes), images "
          f"{record['images_made']} (largest {record['largest_image_bytes']:,}), limit "
          f"{record['max_allocation_bytes']:,}: within limits {record['within_limits']}")


if __name__ == "__main__":
    main()
