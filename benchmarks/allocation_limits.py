"""Every allocation within the target (issue 29 item 1): train a workload through ``TrainingStep``
compiled for an Adreno target and record every ``cl.Buffer`` and every image of its own the process
makes, the replay's arena buffers and the step's device footprint against the target's limits.
One command per workload, each self-contained (issue 29's done-when sizes are the defaults):

    python benchmarks/allocation_limits.py --workload mobilenet_v2   # 224x224, batch 32, every layer trained
    python benchmarks/allocation_limits.py --workload gpt2_lora      # GPT-2 124M, seq 512, batch 4, fp16 base
    python benchmarks/allocation_limits.py --workload qwen2_lora     # Qwen2.5-0.5B's shapes, seq 256, batch 4, fp16 base
    python benchmarks/allocation_limits.py --small --max-alloc-mib 4   # PoCL: a reduced model, a 4 MiB limit

The language models' frozen base is stored in ``--base`` (default float16: ``torch_adreno.freeze``,
the forward under autocast of that type; ``float32``: no autocast), their LoRA adapters and SGD
momentum in float32. ``--train-last N`` makes MobileNetV2 transfer learning proper (the classifier
and the last N feature blocks trained, the frozen rest in eval mode); by default every layer trains,
the larger footprint.

It prints as it goes (the model, each step's loss and time, then the footprint and the largest
allocations) and appends one JSON line (``--out``, default benchmarks/results/<device>/allocation_limits.jsonl):
the largest buffer and image made, how many, the arena's buffers, the footprint's parts and total,
the limits, the losses, the step times and ``within_limits``. A benchmark, not a test: it reports,
it asserts nothing (``tests/memory/test_allocation_limits_full.py`` asserts the same sizes, marked slow).
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
from common import DEVICE, RESULTS, append_jsonl, device_arg, run_context

import torch_adreno
from torch_adreno.targets import profiles

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
        cl.create_image = recorded_image  # type: ignore[assignment]


#: A workload: the model, the parameters the optimizer trains, one batch, the loss function and a
#: line saying what was built.
Workload = tuple[torch.nn.Module, list[torch.nn.Parameter], tuple[Any, ...], Any, str]

BASE_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def mobilenet(args: argparse.Namespace) -> Workload:
    from torch_adreno.models import mobilenet_v2

    classes = 10 if args.small else 1000
    kwargs: dict[str, Any] = {"dropout": 0.0}
    if args.small:
        kwargs.update(width_mult=0.25, inverted_residual_setting=SMALL_MOBILENET_SETTING)
    torch.manual_seed(0)
    model = mobilenet_v2(classes, **kwargs).train()
    trained = "every layer"
    if args.train_last is not None:  # transfer learning: the classifier and the last blocks train
        blocks = list(model.features)
        model.requires_grad_(False)
        model.eval()
        for module in (model.classifier, *blocks[len(blocks) - args.train_last:]):
            module.requires_grad_(True)
            module.train()
        trained = f"the classifier and the last {args.train_last} of {len(blocks)} feature blocks"
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(args.batch, 3, args.image, args.image, generator=generator),
             torch.randint(0, classes, (args.batch,), generator=generator))
    trainable = [p for p in model.parameters() if p.requires_grad]
    return (model, trainable, batch, lambda m, x, y: F.cross_entropy(m(x), y),
            f"MobileNetV2 {'(reduced) ' if args.small else ''}{args.image}x{args.image}, batch {args.batch}, "
            f"{classes} classes; {trained} trained")


def language_model(model: torch.nn.Module, cfg: Any, batch: tuple[Any, ...], args: argparse.Namespace,
                   name: str) -> Workload:
    """A LoRA model with its frozen base stored in ``--base`` (16 bits: ``torch_adreno.freeze``, the
    loss computed under autocast of that type)."""
    dtype = BASE_DTYPES[args.base]
    if dtype is not None:
        torch_adreno.freeze(model, dtype)

    def loss_fn(m: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=dtype or torch.float16, enabled=dtype is not None):
            return gpt2_lora.lm_loss(m, tokens, targets)

    trainable = gpt2_lora.trainable_parameters(model)
    base = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return (model, trainable, batch, loss_fn,
            f"{name}: {cfg.layers} layers, d {cfg.d}, vocab {cfg.vocab:,}; seq {cfg.seq}, batch {cfg.batch}; "
            f"base {base:,} parameters in {args.base}, {sum(p.numel() for p in trainable):,} LoRA parameters")


def lora(args: argparse.Namespace) -> Workload:
    base = gpt2_lora.SMALL if args.small else gpt2_lora.FULL
    cfg = dataclasses.replace(base, seq=args.seq, batch=args.batch)
    torch.manual_seed(0)
    model = gpt2_lora.gpt2_lora(cfg).train()
    batch = gpt2_lora.token_batch(cfg, torch.Generator().manual_seed(1))
    return language_model(model, cfg, batch, args, "GPT-2 LoRA" + (" (reduced)" if args.small else " 124M"))


def qwen2(args: argparse.Namespace) -> Workload:
    from torch_adreno.models import qwen2_lora

    base = qwen2_lora.TINY if args.small else qwen2_lora.FULL
    cfg = dataclasses.replace(base, seq=args.seq, batch=args.batch, positions=max(base.positions, args.seq))
    torch.manual_seed(0)
    model = qwen2_lora.qwen2_lora(cfg).train()
    batch = qwen2_lora.token_batch(cfg, torch.Generator().manual_seed(1))
    return language_model(model, cfg, batch, args,
                          "Qwen2 LoRA" + (" (tiny)" if args.small else " (Qwen2.5-0.5B's shapes)"))


WORKLOADS = {"mobilenet_v2": mobilenet, "gpt2_lora": lora, "qwen2_lora": qwen2}
#: Per workload: (batch, sequence length) of issue 29's done-when, and of --small.
DEFAULTS = {"mobilenet_v2": ((32, None), (4, None)), "gpt2_lora": ((4, 512), (2, 32)),
            "qwen2_lora": ((4, 256), (2, 16))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    target = args.target
    if args.max_alloc_mib is not None:
        derived = profiles.derive_target(target, f"{target}_{args.max_alloc_mib:g}mib", "--max-alloc-mib",
                                         max_alloc_bytes=int(args.max_alloc_mib * 2**20))
        profiles.register_target(derived)
        target = derived.name
    started = time.perf_counter()
    model, trainable, batch, loss_fn, what = WORKLOADS[args.workload](args)
    print(f"{what} (built in {time.perf_counter() - started:.1f} s); target {target}", flush=True)
    optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)
    allocations = Allocations()
    allocations.install()
    options = {"target": target, **({"device": args.device} if args.device is not None else {})}
    step = torch_adreno.TrainingStep(model, loss_fn, optimizer, options=options)
    times, losses = [], []
    for index in range(args.steps):
        started = time.perf_counter()
        losses.append(float(step(*batch)))
        times.append(time.perf_counter() - started)
        stage = "compiled" if index == 0 else "replayed" if step.replayed_steps else "captured"
        print(f"step {index + 1}/{args.steps} ({stage}): loss {losses[-1]:.4f}, {times[-1]:.2f} s; buffers made so far "
              f"{len(allocations.buffers)} (largest {max(allocations.buffers, default=0):,} bytes)", flush=True)
    footprint = step.device_footprint
    limits = step.memory_limits
    largest_buffer = max(allocations.buffers, default=0)
    largest_image = max(allocations.images, default=0)
    record = {
        **run_context(args.device), "workload": args.workload, "small": args.small, "batch": args.batch,
        "image": args.image if args.workload == "mobilenet_v2" else None, "seq": args.seq, "target": target,
        "base": None if args.workload == "mobilenet_v2" else args.base,
        "train_last": args.train_last if args.workload == "mobilenet_v2" else None, "model": what,
        "max_allocation_bytes": limits.max_allocation_bytes, "global_memory_bytes": limits.global_memory_bytes,
        "buffers_made": len(allocations.buffers), "largest_buffer_bytes": largest_buffer,
        "images_made": len(allocations.images), "largest_image_bytes": largest_image,
        "replayed_steps": step.replayed_steps, "losses": losses, "last_loss": losses[-1], "step_seconds": times,
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
    parser.add_argument("--batch", type=int, default=None,
                        help="default: 32 (MobileNetV2), 4 (GPT-2, Qwen2); --small: 4, 2, 2")
    parser.add_argument("--image", type=int, default=None, help="MobileNetV2's image size (default 224; --small 64)")
    parser.add_argument("--seq", type=int, default=None,
                        help="the language models' sequence length (default 512 GPT-2, 256 Qwen2; --small 32, 16)")
    parser.add_argument("--base", choices=sorted(BASE_DTYPES), default="float16",
                        help="the language models' frozen base: stored in 16 bits by torch_adreno.freeze, the "
                             "forward under autocast of that type (default float16), or float32 without autocast")
    parser.add_argument("--train-last", type=int, default=None,
                        help="MobileNetV2 transfer learning: train the classifier and the last N feature blocks "
                             "(default: every layer)")
    parser.add_argument("--small", action="store_true", help="reduced models that train on PoCL in minutes")
    parser.add_argument("--max-alloc-mib", type=float, default=None,
                        help="hold the run to a copy of the target with this largest allocation (a split on PoCL)")
    parser.add_argument("--steps", type=int, default=3, help="steps: compile, capture, then replays (default 3)")
    parser.add_argument("--device", type=device_arg, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / DEVICE / "allocation_limits.jsonl")
    args = parser.parse_args(argv)
    (batch, seq), (small_batch, small_seq) = DEFAULTS[args.workload]
    if args.batch is None:
        args.batch = small_batch if args.small else batch
    if args.image is None:
        args.image = 64 if args.small else 224
    if args.seq is None:
        args.seq = small_seq if args.small else seq
    return args


def main() -> None:
    args = parse_args()
    record = run(args)
    append_jsonl(args.out, [record])
    print(record.get("footprint", "no replay captured"))
    print(f"buffers made {record['buffers_made']} (largest {record['largest_buffer_bytes']:,} bytes), images "
          f"{record['images_made']} (largest {record['largest_image_bytes']:,}), limit "
          f"{record['max_allocation_bytes']:,}; footprint {record.get('footprint_bytes', 0):,} of "
          f"{record['global_memory_bytes']:,} bytes of global memory: within limits {record['within_limits']}")
    print(f"losses {', '.join(f'{x:.4f}' for x in record['losses'])}; step seconds "
          f"{', '.join(f'{t:.2f}' for t in record['step_seconds'])}")


if __name__ == "__main__":
    main()
