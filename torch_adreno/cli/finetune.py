"""``finetune``: LoRA fine-tuning of a causal language model on the bundled text corpus
(``--task text``, :mod:`.finetune_text`), or MobileNetV2 transfer learning on the bundled digits
(``--task images``, :mod:`.finetune_images`), each step a replayed ``TrainingStep``
(:mod:`.finetune_steps`).

The options of both tasks share one parser; each task's own options default to None here and get
their task's defaults in :func:`settings_for`, so an option of the other task given on the command
line is refused by name instead of silently ignored."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torch_adreno.cli import finetune_images, finetune_text
from torch_adreno.cli.arguments import (
    add_device_argument,
    bounded,
    output_dir,
    positive_float,
    positive_int,
    refuse_bad_device,
    seed_int,
)
from torch_adreno.targets.profiles import target_names
from torch_adreno.training.optimizers import OPTIMIZERS, describe_optimizers

#: Each task's options and their defaults (None: none; a task's code handles it). An option not
#: listed under the chosen task is refused when given.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "text": {"model": "tiny-random", "tokenizer": None, "text": None, "seq": 64, "rank": 8, "alpha": None,
             "lora_modules": None, "eval_batches": 4, "base_dtype": "float32", "steps": 200, "batch": 8, "lr": 3e-3,
             "out": Path("finetuned-text")},
    "images": {"image_size": 32, "train_last": 0, "weights": None, "width_mult": 1.0, "steps": 150, "batch": 32,
               "lr": 3e-4, "out": Path("finetuned-images")},
}

#: An image side of at least the digits' own 8 pixels.
image_side = bounded(int, "an image side in pixels", 8)

def register(sub: argparse._SubParsersAction) -> None:
    """The ``finetune`` command."""
    text, images = TASK_DEFAULTS["text"], TASK_DEFAULTS["images"]
    p = sub.add_parser("finetune", help="LoRA fine-tuning of a causal language model on the bundled text "
                       "(or --task images: MobileNetV2 transfer learning on the bundled digits)",
                       description="Fine-tune through a replayed TrainingStep. Nothing is downloaded: a model is "
                       "a local checkpoint directory, a config JSON file or a built-in shape with random weights.")
    p.add_argument("--task", choices=["text", "images"], default="text",
                   help="text: LoRA on a causal LM; images: MobileNetV2 transfer learning (default: %(default)s)")
    add_device_argument(p)
    p.add_argument("--target", choices=target_names(), default=None, metavar="TARGET",
                   help=f"compile for an Adreno profile's limits on the present device, of: {', '.join(target_names())} "
                   "(default: the present device only)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"training steps (default: {text['steps']} for text, {images['steps']} for images)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help=f"sequences or images per step (default: {text['batch']} for text, {images['batch']} for images)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"learning rate (default: {text['lr']:g} for text, {images['lr']:g} for images)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam",
                   help=f"{describe_optimizers()} (default: %(default)s)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="seeds the initial weights, the batches and the split (default: %(default)s)")
    p.add_argument("--out", type=output_dir, default=None,
                   help=f"directory to write the result into (default: {text['out']} for text: the peft adapter; "
                   f"{images['out']} for images: the state_dict)")
    p.add_argument("--no-replay", action="store_true",
                   help="run every step through the compiled graphs instead of replaying the recorded step")
    lm = p.add_argument_group("--task text")
    lm.add_argument("--model", default=None,
                    help="a checkpoint directory (save_pretrained: your weights, config and tokenizer), a config "
                    "JSON file (random weights), or a built-in shape with random weights: tiny-random, "
                    f"gpt2-124m-random, qwen2.5-0.5b-random (default: {text['model']})")
    lm.add_argument("--tokenizer", choices=["model", "bytes"], default=None,
                    help="model: the checkpoint directory's own tokenizer; bytes: the text's bytes as token ids 0..255 "
                    "(default: model for a checkpoint directory, bytes otherwise)")
    lm.add_argument("--text", type=Path, default=None, help="a UTF-8 text file to train on "
                    "(default: the bundled Shakespeare, torch_adreno/data/shakespeare.txt.gz)")
    lm.add_argument("--seq", type=positive_int, default=None, help=f"tokens per sequence (default: {text['seq']})")
    lm.add_argument("--rank", type=positive_int, default=None, help=f"LoRA rank (default: {text['rank']})")
    lm.add_argument("--alpha", type=positive_float, default=None, help="LoRA alpha (default: twice the rank)")
    lm.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME",
                    help="names of the modules that get adapters (default: peft's for the model type, e.g. c_attn "
                    "for GPT-2, q_proj v_proj for Llama and Qwen2)")
    lm.add_argument("--base-dtype", choices=["float32", "float16", "bfloat16"], default=None,
                    help="storage of the frozen base weights: 16 bits (torch_adreno.freeze) with the forward under "
                    "autocast to that type, adapters and optimizer state float32; float16 runs without loss scaling "
                    f"(a GradScaler would stop the replay) (default: {text['base_dtype']})")
    lm.add_argument("--eval-batches", type=seed_int, default=None,
                    help="held-out batches whose loss is measured before and after training, on the host "
                    f"(default: {text['eval_batches']}; 0: none)")
    vision = p.add_argument_group("--task images")
    vision.add_argument("--image-size", type=image_side, default=None,
                        help=f"side of the square images the 8x8 digits are upsampled to (default: {images['image_size']})")
    vision.add_argument("--train-last", type=seed_int, default=None,
                        help="feature blocks trained with the classifier, counted from the end of the backbone "
                        f"(default: {images['train_last']}: the classifier only)")
    vision.add_argument("--weights", type=Path, default=None,
                        help="a torchvision MobileNetV2 state_dict (.pth) to start from (default: random weights)")
    vision.add_argument("--width-mult", type=positive_float, default=None,
                        help=f"MobileNetV2's width multiplier (default: {images['width_mult']:g})")
    p.set_defaults(fn=cmd_finetune)


def settings_for(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the chosen task's defaults filled in; raises ``ValueError`` naming the options
    given that belong to the other task."""
    own = TASK_DEFAULTS[args.task]
    other = set().union(*(d for task, d in TASK_DEFAULTS.items() if task != args.task)) - set(own)
    foreign = sorted(name for name in other if getattr(args, name) is not None)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags} {'applies' if len(foreign) == 1 else 'apply'} to another task than "
                         f"--task {args.task}; leave {'it' if len(foreign) == 1 else 'them'} out or pick that task")
    settings = argparse.Namespace(**vars(args))
    for name, default in own.items():
        if getattr(settings, name) is None:
            setattr(settings, name, default)
    return settings


def cmd_finetune(args: argparse.Namespace) -> int:
    """Run the chosen task: 0 when its loss fell, 1 when it did not, 2 for bad input."""
    try:
        settings = settings_for(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if refuse_bad_device(settings.device):
        return 2
    return finetune_text.run(settings) if settings.task == "text" else finetune_images.run(settings)


