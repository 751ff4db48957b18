"""torchvision's ResNet-18 and MobileNetV2 in plain torch, with torchvision's module names.

torchvision's wheels on the package registries are CUDA builds whose ``_C`` extension does not
load next to a CPU torch; these definitions follow ``torchvision/models/resnet.py`` and
``mobilenetv2.py`` closely enough that a torchvision ``state_dict`` loads
into them with ``load_state_dict`` (same parameter and buffer names and shapes; tested against a
table written down from torchvision's definitions) and that they compute what torchvision's do:
same layers, strides, padding, initialisation and forward. Where torchvision imports, prefer its
own models.

One addition: ``ResNet``'s ``width`` (channels of the stem and the first stage; torchvision's 64),
for the small sizes the tests train at; MobileNetV2 has torchvision's own ``width_mult`` and
``inverted_residual_setting``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MobileNetV2", "ResNet", "mobilenet_v2", "resnet18"]


# -- ResNet --------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock``: conv3x3-BN-ReLU-conv3x3-BN plus the identity or ``downsample``
    (1x1 convolution and BN where the stride or the width changes), ReLU."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with ``BasicBlock`` s: a 7x7 stride-2 stem, 3x3 stride-2 max pool,
    four stages of ``layers[i]`` blocks at ``width * 2**i`` channels (strides 1, 2, 2, 2), global
    average pool and ``fc``."""

    def __init__(self, layers: Sequence[int] = (2, 2, 2, 2), num_classes: int = 1000, zero_init_residual: bool = False,
                 width: int = 64) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * BasicBlock.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * BasicBlock.expansion))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        layers.extend(BasicBlock(self.inplanes, planes) for _ in range(1, blocks))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, *, width: int = 64, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18 (11,689,512 parameters at 1,000 classes), as ``torchvision.models.resnet18()``
    (random weights: load a torchvision ``state_dict`` for pretrained ones)."""
    return ResNet((2, 2, 2, 2), num_classes, zero_init_residual, width)


# -- MobileNetV2 ---------------------------------------------------------------------------------


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    """torchvision's (from the TensorFlow original): ``v`` rounded to a multiple of ``divisor``,
    never more than 10% below it."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    """torchvision's ``Conv2dNormActivation`` as MobileNetV2 uses it: convolution (no bias, "same"
    padding), BatchNorm, ReLU6 (children ``0``, ``1``, ``2``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )
        self.out_channels = out_channels


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: ``conv`` = [1x1 expansion (unless ``expand_ratio`` is 1)],
    3x3 depthwise, 1x1 projection and its BN; the input added where the shape is kept."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride should be 1 or 2 instead of {stride}")
        self.stride = stride
        hidden_dim = round(inp * expand_ratio)
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden_dim, kernel_size=1))
        layers.extend([
            Conv2dNormActivation(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ])
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup
        self._is_cn = stride > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


#: torchvision's MobileNetV2 stages: expansion t, output channels c, blocks n, first stride s.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    """torchvision's ``MobileNetV2``: ``features`` (a stride-2 3x3 stem, the inverted residual
    blocks, a 1x1 convolution to ``last_channel``), global average pool, ``classifier`` (dropout,
    linear)."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0,
                 inverted_residual_setting: Sequence[Sequence[int]] | None = None, round_nearest: int = 8,
                 dropout: float = 0.2) -> None:
        super().__init__()
        setting = INVERTED_RESIDUAL_SETTING if inverted_residual_setting is None else inverted_residual_setting
        if len(setting) == 0 or any(len(row) != 4 for row in setting):
            raise ValueError(f"inverted_residual_setting should be a non-empty list of 4-element lists, got {setting}")
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [Conv2dNormActivation(3, input_channel, stride=2)]
        for t, c, n, s in setting:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, expand_ratio=t))
                input_channel = output_channel
        features.append(Conv2dNormActivation(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000, *, width_mult: float = 1.0, dropout: float = 0.2,
                 inverted_residual_setting: Sequence[Sequence[int]] | None = None) -> MobileNetV2:
    """MobileNetV2 (3,504,872 parameters at 1,000 classes and width 1.0), as
    ``torchvision.models.mobilenet_v2()`` (random weights)."""
    return MobileNetV2(num_classes, width_mult, inverted_residual_setting, dropout=dropout)
