"""``python -m torch_adreno.runner step.onnx --data digits.npz --steps 200``: train an exported step
on an OpenCL device without PyTorch, print the losses, write the trained state. Exit status 2: bad
input (the step or data file, the device); 1: a failure while running, such as a loss that is not
finite (unless ``--continue-on-nonfinite``)."""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from torch_adreno.runner import StepRunner, UnsupportedStepFile, choose_device
from torch_adreno.runner.data import DataFileError, open_batches, read_arrays


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


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
                        help="safetensors or .npz: one array per batch input, named as the input (batch_0, batch_1) "
                        "or x, y; batches stacked over steps [S, *input shape], or examples [N, *input shape[1:]] "
                        "drawn in a shuffled order (torch_adreno/runner/data.py)")
    parser.add_argument("--steps", type=_positive, default=200)
    parser.add_argument("--seed", type=int, default=0, help="seed of the examples' order (default: %(default)s)")
    parser.add_argument("--device", default=None, help="OpenCL device index or name substring (default: first GPU)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the trained state (.npz or .onnx); "
                        "default: <model>.trained.npz")
    parser.add_argument("--print-every", type=_positive, default=1)
    parser.add_argument("--fill-uninitialized-memory", action="store_const", const=True, default=None,
                        help="fill memory with NaN / out-of-range words before its first write, so that a read of memory "
                        "nothing wrote shows (default: the environment variable TORCH_ADRENO_FILL_UNINITIALIZED_MEMORY)")
    parser.add_argument("--continue-on-nonfinite", action="store_true",
                        help="train on after a step whose loss is NaN or infinite (default: stop with exit status 1)")
    args = parser.parse_args(argv)
    try:
        runner = StepRunner.load(args.model, choose_device(args.device), args.fill_uninitialized_memory)
        arrays = read_arrays(args.data)
        batches = open_batches(args.data, runner.batch_inputs, args.seed, arrays)
    except (UnsupportedStepFile, DataFileError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    layout = f"{batches.rows} stacked batches" if batches.stacked else f"{batches.rows} examples"
    print(f"{args.model}: {len(runner.operations)} operations on {runner.device.name.strip()}, batch "
          f"{batches.batch_size}; {args.data}: {layout}")
    for number, batch in enumerate(itertools.islice(batches, args.steps), 1):
        loss = runner.step(*batch)
        if number % args.print_every == 0 or number == args.steps or not math.isfinite(loss):
            print(f"step {number} loss {loss!r}")
        if not math.isfinite(loss) and not args.continue_on_nonfinite:
            print(f"error: step {number}: the loss is {loss!r}, not finite: training diverged (a learning rate too "
                  "high?) or the data holds non-finite values; stopped without writing the state "
                  "(--continue-on-nonfinite trains on)", file=sys.stderr)
            return 1
    test = [arrays[k] for k in ("x_test", "y_test") if k in arrays]
    labelled = test if len(test) == 2 else list(batches.examples()[:2])
    if runner.can_predict and len(labelled) == 2:
        x, y = labelled
        which = "held-out" if len(test) == 2 else "training"
        print(f"accuracy on the {len(y)} {which} examples: "
              f"{accuracy(runner, x.astype(runner.batch_inputs[0]['dtype']), y):.4f}")
    else:
        print("accuracy: not measured (" + ("the file holds no prediction; export it with predict=)"
                                           if not runner.can_predict else "the step takes no labels)"))
    out = args.out or args.model.with_suffix(".trained.npz")
    runner.save_state(out)
    print(f"trained state written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
