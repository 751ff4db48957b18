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


@dataclass(frozen=True)
class ModelSpec:
    """A reference model with its batch: ``make()`` builds the module, ``batch(g)`` inputs+labels."""

    name: str
    make: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    classes: int

    def batch(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.input_shape, generator=generator)
        y = torch.randint(0, self.classes, (self.input_shape[0],), generator=generator)
        return x, y


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", MLP, (128, 784), 10),
    "lenet": ModelSpec("lenet", LeNet, (64, 1, 28, 28), 10),
}
