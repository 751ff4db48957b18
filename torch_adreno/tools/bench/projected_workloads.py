"""The training steps ``python -m torch_adreno project`` projects: the reference models with their
suite batches, the seed's MLP, and the real workloads (vision models and a LoRA language model) at the sizes a phone would
train them (the models of ``benchmarks/workloads.py``, from :mod:`torch_adreno.models`):

- ``resnet18`` / ``resnet18_b32``: ResNet-18, 224x224, 1,000 classes, batch 16 / 32;
- ``mobilenet_v2`` / ``mobilenet_v2_b32``: MobileNetV2 (dropout off), 224x224, 1,000 classes, batch 16 / 32;
- ``gpt2_lora`` / ``gpt2_lora_s512``: GPT-2 124M shapes, LoRA r=8 on q and v, seq 256 / 512, batch 4.

The real workloads train as ``benchmarks/workloads.py`` trains them on the reference GPU (SGD, lr 0.01,
momentum 0.9, only trainable parameters in the optimizer), so that their kernels are the ones the
calibration (:mod:`.calibration`) measured, and name the calibration table of their architecture.
GPT-2 has ``layers``: a step with fewer blocks is the same step less whole blocks, which is what
lets the projection profile a shallower model and extrapolate per block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from torch_adreno.models import MODELS, mobilenet_v2, resnet18
from torch_adreno.models.gpt2_lora import FULL, GPT2Config, gpt2_lora, lm_loss, token_batch
from torch_adreno.tools.bench.calibration import POOLED

#: The seed's own workload: an MLP 784-256-128-16 trained on MNIST-shaped batches of 32.
SEED_MLP = "seed_mlp"
SEED_BATCH = 32
#: What ``project`` runs without ``--model``: small enough for PoCL in a minute or two.
DEFAULT_MODELS = ("mlp", "lenet", "resnet_mini", "transformer", SEED_MLP)
#: ImageNet-sized batches as ``benchmarks/workloads.py`` makes them.
IMAGE, CLASSES = 224, 1000


def classification_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


@dataclass(frozen=True)
class StepWorkload:
    """A model, its batch and loss: one training step to profile and project.

    ``items`` is what one step trains on, in ``unit`` (images, tokens or samples), for a throughput;
    ``calibration`` the calibration table its kernels are projected with; ``layers`` its number of
    repeated blocks where :meth:`with_layers` can change it (0: not layered)."""

    name: str
    title: str
    make: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    items: int
    unit: str
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = classification_loss
    momentum: float = 0.0
    calibration: str = POOLED
    layers: int = 0
    gpt2: GPT2Config | None = None

    def with_layers(self, layers: int) -> StepWorkload:
        """The same step with ``layers`` blocks (GPT-2 only)."""
        if self.gpt2 is None:
            raise ValueError(f"{self.name} has no repeated blocks to change the number of")
        if layers < 1:
            raise ValueError(f"{self.name}: a model needs at least one block, got {layers}")
        return _gpt2_workload(self.name, dataclasses.replace(self.gpt2, layers=layers))


def _vision_workload(name: str, architecture: str, batch: int) -> StepWorkload:
    factory: Callable[..., nn.Module] = resnet18 if architecture == "resnet18" else mobilenet_v2
    kwargs: dict[str, Any] = {} if architecture == "resnet18" else {"dropout": 0.0}  # as the calibration's run

    def make() -> nn.Module:
        torch.manual_seed(0)
        return factory(num_classes=CLASSES, **kwargs).train()

    def make_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, 3, IMAGE, IMAGE, generator=generator),
                torch.randint(0, CLASSES, (batch,), generator=generator))

    title = f"{'ResNet-18' if architecture == 'resnet18' else 'MobileNetV2'}, {IMAGE}x{IMAGE}, batch {batch}"
    return StepWorkload(name, title, make, make_batch, batch, "images", momentum=0.9, calibration=architecture)


def _gpt2_workload(name: str, cfg: GPT2Config) -> StepWorkload:
    def make() -> nn.Module:
        torch.manual_seed(0)
        return gpt2_lora(cfg).train()

    title = (f"GPT-2 ({cfg.layers} layers, d {cfg.d}), LoRA r={cfg.rank} on q and v, seq {cfg.seq}, "
             f"batch {cfg.batch}")
    return StepWorkload(name, title, make, lambda g: token_batch(cfg, g), cfg.seq * cfg.batch, "tokens",
                        loss=lm_loss, momentum=0.9, calibration="gpt2_lora", layers=cfg.layers, gpt2=cfg)


def _seed_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 16))


def step_workloads() -> dict[str, StepWorkload]:
    """Every workload, by the name ``--model`` takes."""
    table = {name: StepWorkload(name, name, spec.make, spec.batch, spec.input_shape[0], "samples")
             for name, spec in MODELS.items()}
    table[SEED_MLP] = StepWorkload(
        SEED_MLP, "the seed's MLP 784-256-128-16, batch 32", _seed_mlp,
        lambda g: (torch.randn(SEED_BATCH, 1, 28, 28, generator=g), torch.randint(0, 16, (SEED_BATCH,), generator=g)),
        SEED_BATCH, "samples")
    for architecture in ("resnet18", "mobilenet_v2"):
        table[architecture] = _vision_workload(architecture, architecture, 16)
        table[f"{architecture}_b32"] = _vision_workload(f"{architecture}_b32", architecture, 32)
    table["gpt2_lora"] = _gpt2_workload("gpt2_lora", FULL)
    table["gpt2_lora_s512"] = _gpt2_workload("gpt2_lora_s512", dataclasses.replace(FULL, seq=512))
    return table
