"""Models: the reference models the tests, benchmarks and command line train (:mod:`.reference`),
torchvision's ImageNet architectures written in plain torch (:mod:`.vision`), and LoRA language
models of GPT-2's (:mod:`.gpt2_lora`) and Qwen2's (:mod:`.qwen2_lora`) shapes."""

from __future__ import annotations

from torch_adreno.models.qwen2_lora import Qwen2Config, Qwen2LoRA
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
    "MobileNetV2", "ModelSpec", "Qwen2Config", "Qwen2LoRA", "ResNet", "ResNetMini", "Transformer", "mobilenet_v2",
    "resnet18",
]
