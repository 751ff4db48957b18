"""``python -m torch_adreno.runner step.onnx --data digits.npz --steps 200``: train an exported step
on an OpenCL device without PyTorch, print the losses, write the trained state."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from torch_adreno.runner import StepRunner, UnsupportedStepFile, choose_device


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def batches(arrays: Sequence[np.ndarray], batch_size: int, steps: int, seed: int) -> Iterator[tuple[np.ndarray, ...]]:
    """``steps`` batches of ``batch_size`` rows, epoch after epoch in a fresh shuffled order (full batches only)."""
    rows = len(arrays[0])
    rng = np.random.default_rng(seed)
    done = 0
    while done < steps:
        order = rng.permutation(rows)
        for start in range(0, rows - batch_size + 1, batch_size):
            if done == steps:
                return
            index = order[start:start + batch_size]
            yield tuple(a[index] for a in arrays)
            done += 1


def accuracy(runner: StepRunner, x: np.ndarray, y: np.ndarray) -> float:
    """The fraction of ``x`` whose highest output is its label ``y`` (the last partial batch padded)."""
    size = runner.batch_inputs[0]["shape"][0]
    correct = 0
    for start in range(0, len(x), size):
        part = x[start:start + size]
        padded = np.concatenate([part, np.zeros((size - len(part), *part.shape[1:]), part.dtype)]) if len(part) < size else part
        logits = runner.predict(padded)[:len(part)]
        correct += int((logits.argmax(axis=1) == y[start:start + size]).sum())
    return correct / max(len(x), 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_adreno.runner", description=__doc__)
    parser.add_argument("model", type=Path, help="a training step exported by torch_adreno (.onnx)")
    parser.add_argument("--data", type=Path, required=True,
                        help=".npz with one array per batch input: x and y, or named as the inputs (batch_0, batch_1)")
    parser.add_argument("--steps", type=_positive, default=200)
    parser.add_argument("--seed", type=int, default=0, help="seed of the batch order")
    parser.add_argument("--device", default=None, help="OpenCL device index or name substring (default: first GPU)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the trained state (.npz or .onnx); "
                        "default: <model>.trained.npz")
    parser.add_argument("--print-every", type=_positive, default=1)
    parser.add_argument("--fill-uninitialized-memory", action="store_const", const=True, default=None,
                        help="fill memory with NaN / out-of-range words before its first write, so that a read of memory "
                        "nothing wrote shows (default: the environment variable TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY)")
    args = parser.parse_args(argv)
    try:
        runner = StepRunner.load(args.model, choose_device(args.device), args.fill_uninitialized_memory)
    except (UnsupportedStepFile, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    specs = runner.batch_inputs
    with np.load(args.data) as archive:
        names = [s["input"] for s in specs]
        short = ["x", "y", *(f"batch_{i}" for i in range(2, len(specs)))][:len(specs)]
        keys = names if all(n in archive.files for n in names) else short
        missing = [k for k in keys if k not in archive.files]
        if missing:
            takes = ", ".join(f"{s['input']} {s['dtype']}{s['shape']}" for s in specs)
            print(f"error: {args.data} has no array {', '.join(missing)} (has {', '.join(archive.files)}); the step "
                  f"takes {takes}", file=sys.stderr)
            return 2
        arrays = [archive[k].astype(s["dtype"], copy=False) for k, s in zip(keys, specs, strict=True)]
    batch_size = specs[0]["shape"][0]
    for spec, array in zip(specs, arrays, strict=True):
        if list(array.shape[1:]) != spec["shape"][1:] or len(array) < batch_size:
            print(f"error: {spec['input']} takes batches of {spec['shape']}; {args.data} holds {list(array.shape)}",
                  file=sys.stderr)
            return 2
    print(f"{args.model}: {len(runner.operations)} operations on {runner.device.name.strip()}, batch {batch_size}")
    losses = []
    for number, batch in enumerate(batches(arrays, batch_size, args.steps, args.seed), 1):
        losses.append(runner.step(*batch))
        if number % args.print_every == 0 or number == args.steps:
            print(f"step {number} loss {losses[-1]!r}")
    if runner.can_predict:
        test = [k for k in ("x_test", "y_test") if k in np.load(args.data).files]
        with np.load(args.data) as archive:
            x, y = (archive["x_test"], archive["y_test"]) if len(test) == 2 else (arrays[0], arrays[1])
        which = "held-out" if len(test) == 2 else "training"
        print(f"accuracy on the {len(y)} {which} examples: {accuracy(runner, x.astype(specs[0]['dtype']), y):.4f}")
    else:
        print("accuracy: not measured (the file holds no prediction; export it with predict=)")
    out = args.out or args.model.with_suffix(".trained.npz")
    runner.save_state(out)
    print(f"trained state written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
