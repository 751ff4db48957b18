"""``finetune --task images``: MobileNetV2 transfer learning on the bundled digits, through a
replayed ``TrainingStep``: the backbone frozen (eval mode: its BatchNorm layers keep their
statistics) and a new 10-way classifier trained, or with ``--train-last N`` the last N feature
blocks trained too.

Without ``--weights`` the backbone's weights are random, and its initial BatchNorm statistics
(mean 0, variance 1) are far from its activations' (these shrink ~10x per stage: 1e-10 after the
last block at 32x32), which would leave a frozen backbone's features zero. Their statistics are
estimated from training digits first (eager, on the host; the weights are untouched), as a trained
backbone's were estimated from its training data. (BatchNorm in train mode instead would train
the classifier on batch statistics and leave running ones that lag behind them, compounding over
the 52 layers: evaluated in eval mode, such a model predicts one class.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from torch_adreno.cli.arguments import backend_options
from torch_adreno.cli.finetune_steps import (
    describe_device,
    loss_fell,
    train_steps,
    trainable_count,
)
from torch_adreno.data import digits_rgb_split
from torch_adreno.models import MobileNetV2, mobilenet_v2
from torch_adreno.training.optimizers import make_optimizer
from torch_adreno.training.step import TrainingStep

CLASSES = 10

#: Training digits a random backbone's BatchNorm statistics are estimated from.
CALIBRATION_IMAGES = 256

#: The file ``--out`` gets: the trained model's state_dict (``mobilenet_v2(num_classes=10)`` loads it).
STATE_FILE = "mobilenet_v2_digits.pt"


def build_model(settings: argparse.Namespace) -> MobileNetV2:
    """MobileNetV2 with a new 10-way classifier; ``--weights`` loaded into the backbone first.
    Every parameter frozen but the classifier's and those of the last ``--train-last`` feature
    blocks; frozen modules in eval mode, trainable ones in train mode."""
    torch.manual_seed(settings.seed)
    model = mobilenet_v2(num_classes=1000 if settings.weights else CLASSES, width_mult=settings.width_mult)
    if settings.weights is not None:
        load_weights(model, settings.weights, settings.width_mult)
        head = nn.Linear(model.last_channel, CLASSES)
        nn.init.normal_(head.weight, 0, 0.01)  # torchvision's initialisation of the classifier
        nn.init.zeros_(head.bias)
        model.classifier[1] = head
    blocks = len(model.features)
    if settings.train_last > blocks:
        raise ValueError(f"--train-last {settings.train_last}: MobileNetV2 has {blocks} feature blocks; "
                         f"pass 0..{blocks}")
    trained: list[nn.Module] = [model.classifier, *list(model.features)[blocks - settings.train_last:]]
    model.requires_grad_(False)
    model.eval()
    for module in trained:
        module.requires_grad_(True)
        module.train()
    return model


def load_weights(model: MobileNetV2, path: Path, width_mult: float) -> None:
    """A torchvision MobileNetV2 state_dict (1,000 classes), checked name by name and shape by shape."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as err:
        raise ValueError(f"--weights {path}: not a state_dict torch.load can read ({err})") from None
    if not isinstance(state, dict):
        raise ValueError(f"--weights {path}: holds a {type(state).__name__}, not a state_dict (save "
                         "model.state_dict(), not the model)")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"--weights {path}: not the state_dict of a torchvision MobileNetV2 of 1,000 classes "
                         f"with --width-mult {width_mult:g} ({err})") from None


def estimate_batch_norm_statistics(model: nn.Module, images: torch.Tensor, batch: int) -> int:
    """Replace every BatchNorm layer's running statistics by the cumulative average of those of
    ``images`` in batches of ``batch`` (eager, on the host); weights and modes are left as they
    were. Returns the number of BatchNorm layers."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    modes = {m: m.training for m in model.modules()}
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average, not an exponential one
    model.train()
    with torch.no_grad():
        for start in range(0, len(images), batch):
            model(images[start:start + batch])
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    for module, training in modes.items():
        module.train(training)
    return len(norms)


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over ``images``, eager on the host in eval mode (the
    modes are restored after)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(labels), batch):
            logits = model(images[s:s + batch])
            loss += F.cross_entropy(logits, labels[s:s + batch], reduction="sum").item()
            correct += int((logits.argmax(1) == labels[s:s + batch]).sum())
    for module, training in modes.items():
        module.train(training)
    return loss / len(labels), correct / len(labels)


def cross_entropy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(images), labels)


def why_accuracy_is_low(settings: argparse.Namespace) -> str:
    """What limits the held-out accuracy of this run, and what raises it."""
    trained = "the classifier" + (f" and the last {settings.train_last} blocks" if settings.train_last else " alone")
    if settings.weights is None:
        return (f"why so low: the backbone's weights are random (no --weights), so {trained} learns from features "
                f"that were never trained, in {settings.steps} steps; --weights FILE (trained MobileNetV2 "
                "weights), more --train-last blocks or more --steps raise it")
    return (f"why so low: {settings.steps} steps training {trained}; more --steps or --train-last blocks, or "
            "another --lr, raise it")


def run(settings: argparse.Namespace) -> int:
    """The images task: build, train, evaluate, save; 0 when the held-out loss fell."""
    x_train, y_train, x_test, y_test = digits_rgb_split(settings.image_size, settings.seed)
    if settings.batch > len(y_train):
        print(f"error: --batch {settings.batch} is larger than the {len(y_train)} training digits; pass at most "
              f"{len(y_train)}", file=sys.stderr)
        return 2
    try:
        model = build_model(settings)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    trainable, total = trainable_count(model)
    part = "the classifier" + (f" and the last {settings.train_last} feature blocks" if settings.train_last else "")
    print(f"model: MobileNetV2 (width {settings.width_mult:g}, "
          f"{'weights from ' + str(settings.weights) if settings.weights else 'random weights'}) at "
          f"{settings.image_size}x{settings.image_size}: {total:,} parameters; {part} trained: {trainable:,}")
    if settings.weights is None:
        images = x_train[:CALIBRATION_IMAGES]
        norms = estimate_batch_norm_statistics(model, images, settings.batch)
        print(f"random backbone: the statistics of its {norms} BatchNorm layers estimated from {len(images)} training "
              "digits (its initial ones make its features vanish); --weights starts from trained weights")
    print(f"data: the bundled digits, {len(y_train)} for training, {len(y_test)} held out; device: "
          f"{describe_device(settings)}")

    before, _ = evaluate(model, x_test, y_test, settings.batch)
    optimizer = make_optimizer(settings.optimizer, [p for p in model.parameters() if p.requires_grad], lr=settings.lr)
    step = TrainingStep(model, cross_entropy, optimizer, backend_options(settings, settings.target), replay=not settings.no_replay)
    # Full batches only (shapes stay static: one compiled step, one replay), in a new order each pass.
    per_pass = len(y_train) // settings.batch
    generator = torch.Generator().manual_seed(settings.seed)
    order = torch.empty(0, dtype=torch.int64)

    def next_batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal order
        if index % per_pass == 0:
            order = torch.randperm(len(y_train), generator=generator)
        chosen = order[(index % per_pass) * settings.batch:(index % per_pass + 1) * settings.batch]
        return x_train[chosen], y_train[chosen]

    try:
        log = train_steps(step, next_batch, settings.steps, settings.batch, "img", "finetune")
    finally:
        step.close()  # host copies of the trained weights current, for the evaluation and the save
    after, accuracy = evaluate(model, x_test, y_test, settings.batch)

    settings.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), settings.out / STATE_FILE)
    for line in log.summary(settings.batch, "img"):
        print(line)
    print(f"held-out loss: {before:.4f} -> {after:.4f}, accuracy {accuracy:.2%} of {len(y_test)} digits (chance "
          f"{1 / CLASSES:.0%}; eager on the host, before and after training)")
    if accuracy < 0.5:
        print(why_accuracy_is_low(settings))
    print(f"state_dict: {settings.out / STATE_FILE} (from torch_adreno.models import mobilenet_v2; "
          f"mobilenet_v2(num_classes={CLASSES}, width_mult={settings.width_mult:g}) loads it)")
    return 0 if loss_fell(before, after, "held-out loss") else 1
