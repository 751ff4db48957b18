"""Models: the reference models the tests, benchmarks and command line train (:mod:`.reference`),
and torchvision's ImageNet architectures written in plain torch (:mod:`.vision`)."""

from __future__ import annotations

from torch_adreno.models.reference import (
    MLP,
    MODELS,
    BasicBlock,
    EncoderLayer,
    InvertedResidual,
    LeNet,
    LSTMClassifier,
    MobileNetMini,
    ModelSpec,
    ResNetMini,
    Transformer,
)
from torch_adreno.models.vision import MobileNetV2, ResNet, mobilenet_v2, resnet18

__all__ = [
    "MLP", "MODELS", "BasicBlock", "EncoderLayer", "InvertedResidual", "LSTMClassifier", "LeNet", "MobileNetMini",
    "MobileNetV2", "ModelSpec", "ResNet", "ResNetMini", "Transformer", "mobilenet_v2", "resnet18",
]
