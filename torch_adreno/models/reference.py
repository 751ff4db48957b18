"""Reference models (plain torch.nn) used by the tests, the benchmarks and the command line.

Each entry builds the model and a batch of matching random inputs and labels, so that every
consumer trains exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Linear 784->512, ReLU, Linear 512->512, ReLU, Linear 512->10."""

    def __init__(self, in_features: int = 784, hidden: int = 512, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LeNet(nn.Module):
    """LeNet-5 for 1x28x28 inputs: conv(1->6, k5, pad 2), pool, conv(6->16, k5), pool, 3 linears."""

    def __init__(self, in_channels: int = 1, classes: int = 10, image: int = 28) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = ((image // 2) - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (1x1 conv + BN where the shape changes), ReLU."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetMini(nn.Module):
    """3x32x32 input: conv3x3(3->16)+BN+ReLU, BasicBlocks of 16, 32, 64 channels (strides 1, 2, 2),
    global average pool, Linear 64->10."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(x.mean((2, 3)))


class EncoderLayer(nn.Module):
    """Pre-LayerNorm transformer encoder layer: self-attention written as softmax(QK^T/sqrt(d))V,
    then a feed-forward block with tanh-GELU."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, hidden)
        self.ff2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        attention = torch.softmax(q @ k.transpose(-2, -1) / head_dim**0.5, dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.proj(mixed)
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x)), approximate="tanh"))


class Transformer(nn.Module):
    """Embedding of a 1,000-token vocabulary to d=128, two pre-LN encoder layers with 4 heads and a
    128->512->128 feed-forward block, mean pool over the sequence, Linear 128->10."""

    def __init__(self, vocab: int = 1000, dim: int = 128, heads: int = 4, hidden: int = 512, layers: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expansion, 3x3 depthwise, 1x1 projection, BatchNorm and ReLU6, with a
    residual connection when shapes allow."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_channels * expand
        self.residual = stride == 1 and in_channels == out_channels
        self.block = nn.Sequential(
            nn.Conv2d(in_channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetMini(nn.Module):
    """A MobileNetV2-style network for 3x32x32 inputs: stem conv, four inverted residual blocks
    (depthwise convolutions, ReLU6), 1x1 head conv, adaptive average pool, Linear -> 10."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 1, 2), InvertedResidual(16, 24, 2, 4),
            InvertedResidual(24, 24, 1, 4), InvertedResidual(24, 32, 2, 4),
        )
        self.head = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.head(self.blocks(self.stem(x)))).flatten(1))


class LSTMClassifier(nn.Module):
    """Token sequence classifier: embedding, two-layer batch-first LSTM, last hidden state -> Linear."""

    def __init__(self, vocab: int = 500, dim: int = 32, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.fc(out[:, -1])


@dataclass(frozen=True)
class ModelSpec:
    """A reference model with its batch: ``make()`` builds the module, ``batch(g)`` inputs+labels."""

    name: str
    make: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    classes: int

    #: For token models, the vocabulary size (inputs are int64 token ids); 0 for float inputs.
    vocabulary: int = 0

    def batch(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.vocabulary:
            x = torch.randint(0, self.vocabulary, self.input_shape, generator=generator)
        else:
            x = torch.randn(self.input_shape, generator=generator)
        y = torch.randint(0, self.classes, (self.input_shape[0],), generator=generator)
        return x, y


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", MLP, (128, 784), 10),
    "lenet": ModelSpec("lenet", LeNet, (64, 1, 28, 28), 10),
    "resnet_mini": ModelSpec("resnet_mini", ResNetMini, (32, 3, 32, 32), 10),
    "transformer": ModelSpec("transformer", Transformer, (16, 64), 10, vocabulary=1000),
    "mobilenet_mini": ModelSpec("mobilenet_mini", MobileNetMini, (16, 3, 32, 32), 10),
    "lstm": ModelSpec("lstm", LSTMClassifier, (16, 20), 10, vocabulary=500),
}
