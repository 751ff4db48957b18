"""``train`` (the digits demo) and ``export`` (a training step as one ONNX file)."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from tqdm import tqdm

from torch_adreno.cli.arguments import (
    add_device_argument,
    backend_options,
    positive_float,
    positive_int,
    refuse_bad_device,
    seed_int,
)
from torch_adreno.data import digits_split
from torch_adreno.export import ExportError, export_step, reset_state
from torch_adreno.export.data_file import save_batches
from torch_adreno.models import MODELS, LeNet
from torch_adreno.profiler import profile
from torch_adreno.runner.data import Batches
from torch_adreno.training.optimizers import OPTIMIZERS, describe_optimizers, make_optimizer
from torch_adreno.training.step import TrainingStep


def register(sub: argparse._SubParsersAction) -> None:
    """The ``train`` and ``export`` commands."""
    train = sub.add_parser("train", help="train LeNet on the bundled UCI digits and report accuracy and costs")
    add_device_argument(train)
    train.add_argument("--epochs", type=positive_int, default=8, help="passes over the training digits (default: %(default)s)")
    train.add_argument("--batch-size", type=positive_int, default=64,
                       help="digits per step; full batches only, so that shapes stay static (default: %(default)s)")
    train.add_argument("--lr", type=positive_float, default=2e-3, help="learning rate (default: %(default)s)")
    train.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam",
                       help=f"{describe_optimizers()} (default: %(default)s)")
    train.add_argument("--seed", type=seed_int, default=0,
                       help="seeds the initial weights, the train/test split and the batch order (default: %(default)s)")
    train.add_argument("--table", action="store_true", help="print the per-kernel profile of the last step")
    train.add_argument("--no-replay", action="store_true",
                       help="run every step through the compiled graphs instead of replaying the recorded step")
    train.set_defaults(fn=cmd_train)
    export = sub.add_parser("export", help="export a model's compiled training step as one ONNX file "
                            "(run it with onnxruntime, view it in Netron, train it with `python -m torch_adreno.runner`)")
    export.add_argument("output", type=Path, help="the .onnx file to write")
    export.add_argument("--model", choices=[*sorted(MODELS), "digits"], default="digits",
                        help="a reference model, or digits: the `train` demo's LeNet on the bundled digits (default: %(default)s)")
    export.add_argument("--batch-size", type=positive_int, default=64, help="digits per step (--model digits; default: %(default)s)")
    export.add_argument("--lr", type=positive_float, default=0.01, help="initial learning rate, an input of the step (default: %(default)s)")
    export.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                        help=f"{describe_optimizers()} (default: %(default)s)")
    export.add_argument("--seed", type=seed_int, default=0, help="seeds the initial weights and the batch (default: %(default)s)")
    export.add_argument("--data", type=Path, default=None,
                        help="also write the digits as .npz (x, y, x_test, y_test) for the runner's --data")
    export.add_argument("--data-out", type=Path, default=None,
                        help="also write --data-steps batches as .safetensors for `torch-adreno-step train --data` "
                        "(one tensor per batch input, stacked over steps: torch_adreno/export/data_file.py)")
    export.add_argument("--data-steps", type=positive_int, default=30,
                        help="batches --data-out writes; a longer run takes them again (default: %(default)s)")
    add_device_argument(export)
    export.set_defaults(fn=cmd_export)


def cmd_train(args: argparse.Namespace) -> int:
    if refuse_bad_device(args.device):
        return 2
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = digits_split(args.seed)
    if args.batch_size > len(y_train):
        print(f"error: --batch-size {args.batch_size} is larger than the {len(y_train)} training digits; "
              f"pass at most {len(y_train)}", file=sys.stderr)
        return 2
    model = LeNet()
    options = backend_options(args)

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    opt = make_optimizer(args.optimizer, model.parameters(), lr=args.lr)
    # The whole step on the device; from its third call on, replayed (unless --no-replay).
    step = TrainingStep(model, loss_fn, opt, options, replay=not args.no_replay)
    predict = torch.compile(model, backend="adreno", options=options, dynamic=False)

    steps_per_epoch = len(y_train) // args.batch_size  # full batches only: shapes stay static
    step_times: list[float] = []
    profiled: profile | None = None
    bar = tqdm(total=args.epochs * steps_per_epoch, desc="training", unit="step")
    for epoch in range(args.epochs):
        order = torch.randperm(len(y_train))
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            x, y = x_train[idx], y_train[idx]
            measure = epoch == args.epochs - 1 and s == steps_per_epoch - 1
            prof_ctx = profile() if measure else None
            start = time.perf_counter()
            if prof_ctx is not None:
                prof_ctx.__enter__()
            loss = step(x, y)
            if prof_ctx is not None:
                prof_ctx.__exit__(None, None, None)
                profiled = prof_ctx
            elif epoch > 0 or s > 1:  # the first step compiles, the second captures the replay
                step_times.append(time.perf_counter() - start)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
            bar.update(1)
    bar.close()
    step.close()  # host copies of the trained weights current for the evaluation
    replayed = step.replayed_steps

    correct = 0
    with torch.no_grad():
        for s in range(0, len(y_test), args.batch_size):
            xb, yb = x_test[s:s + args.batch_size], y_test[s:s + args.batch_size]
            correct += int((predict(xb).argmax(1) == yb).sum())
    accuracy = correct / len(y_test)
    print(f"test accuracy: {accuracy:.2%} ({correct}/{len(y_test)} digits)")
    if step_times:
        how = ("replayed: one recorded launch list per step" if replayed else
               "through the compiled graphs" + (" (--no-replay)" if args.no_replay else ""))
        print(f"step time: median {statistics.median(step_times) * 1e3:.1f} ms over {len(step_times)} steps "
              f"(TrainingStep: forward, backward and optimizer step on the device; {replayed} of "
              f"{args.epochs * steps_per_epoch} steps {how})")
    if profiled is not None:
        print(f"per training step: {profiled.kernel_launches} kernel launches, "
              f"{profiled.bytes_host_to_device} B host->device, {profiled.bytes_device_to_host} B device->host, "
              f"{len(profiled.host_fallback_ops)} host fallback ops")
        if args.table:
            print(profiled.table())
    return 0 if accuracy > 0.9 else 2


def cmd_export(args: argparse.Namespace) -> int:
    """Export a reference model's (or the digits demo's) training step as ONNX."""
    if refuse_bad_device(args.device):
        return 2
    torch.manual_seed(args.seed)
    if args.model == "digits":
        x_train, y_train, x_test, y_test = digits_split(args.seed)
        batch: tuple[torch.Tensor, ...] = (x_train[:args.batch_size].contiguous(), y_train[:args.batch_size].contiguous())
        make: Callable[[], torch.nn.Module] = LeNet
        if args.data is not None:
            np.savez(args.data, x=x_train.numpy(), y=y_train.numpy(), x_test=x_test.numpy(), y_test=y_test.numpy())
    else:
        spec = MODELS[args.model]
        batch, make = spec.batch(torch.Generator().manual_seed(args.seed)), spec.make
        if args.data is not None:
            print("error: --data writes the digits data set; it goes with --model digits", file=sys.stderr)
            return 2
    if args.data_out is not None and args.data_out.suffix != ".safetensors":
        print(f"error: --data-out writes safetensors: name the file .safetensors, not {args.data_out.name}", file=sys.stderr)
        return 2
    options = backend_options(args)
    try:
        model = export_reference_model(args.model, args.output, batch, make, args.lr, args.optimizer, options)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    kernels = sum(1 for n in model.graph.node if n.domain == "torch_adreno" and n.op_type != "copy")
    plan = json.loads({p.key: p.value for p in model.metadata_props}["torch_adreno.step"])
    predict = plan["predict"]["operations"]
    print(f"{args.output}: the training step of {args.model}: {kernels - predict} kernel launches (and {predict} "
          f"of the eval-mode forward, output logits), {len(model.graph.input)} inputs, {len(model.graph.output)} outputs")
    if args.data is not None:
        print(f"{args.data}: the digits (x, y for training; x_test, y_test held out)")
    if args.data_out is not None:
        save_batches(args.data_out, run_batches(args.model, args.seed, args.data_steps, len(batch[0])))
        print(f"{args.data_out}: {args.data_steps} batches, one tensor per batch input stacked over steps")
    return 0


def run_batches(name: str, seed: int, steps: int, batch_size: int) -> list[tuple[np.ndarray, ...]]:
    """``steps`` training batches of reference model ``name`` (or the digits demo's, shuffled epoch
    after epoch as `python -m torch_adreno.runner` draws them), seeded by ``seed``."""
    if name == "digits":
        x_train, y_train, _, _ = digits_split(seed)
        examples = Batches([x_train.numpy(), y_train.numpy()], stacked=False, batch_size=batch_size, seed=seed)
        return list(itertools.islice(examples, steps))
    generator = torch.Generator().manual_seed(seed)
    return [tuple(t.numpy() for t in MODELS[name].batch(generator)) for _ in range(steps)]


def export_reference_model(name: str, path: str | Path, batch: tuple[torch.Tensor, ...], make: Any,
                           lr: float, optimizer: str = "sgd", options: dict[str, Any] | None = None) -> onnx.ModelProto:
    """Export the training step of ``make()`` (cross-entropy loss, a tensor learning rate ``lr``,
    SGD with momentum 0.9 or Adam) captured on ``batch``, with the model's initial state."""
    model = make()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rate = torch.tensor(lr)
    opt = make_optimizer(optimizer, model.parameters(), lr=rate)

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    with TrainingStep(model, loss_fn, opt, options) as step:
        step(*batch)
        step(*batch)  # captured
        if step.replay is None:
            raise ExportError(f"the training step of {name} was not captured: "
                              + "; ".join(sorted(set(step.unreplayable_reasons))))
        step.synchronize()
        reset_state(model, opt, initial)
        return export_step(step.captured_step(predict=batch[0]), path)
