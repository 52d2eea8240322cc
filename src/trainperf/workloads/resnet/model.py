"""ResNet-50 v1.5 (torchvision) with the reference initialisation, and a small member of the family.

torchvision's ResNet-50 puts the stride on the 3x3 convolution of each bottleneck (v1.5), as the
MLPerf reference does. The mini model is built from the same torchvision `Bottleneck` blocks,
narrower and shallower, with a 3x3 stem for 32x32 inputs.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchvision.models import resnet50
from torchvision.models.resnet import Bottleneck


def init_reference(model: nn.Module) -> None:
    """The TF2 reference's initialisers: He-normal (truncated, fan-in) convolutions, BN gamma 1 and
    beta 0 (momentum 0.9 in TF terms = 0.1 in torch, eps 1e-5), final dense layer N(0, 0.01)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            fan_in = module.in_channels // module.groups * math.prod(module.kernel_size)
            # Keras' truncated normal rescales its stddev so the truncated distribution keeps variance.
            std = math.sqrt(2.0 / fan_in) / 0.87962566103423978
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        elif isinstance(module, nn.BatchNorm2d):
            module.momentum, module.eps = 0.1, 1e-5
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.01)
            nn.init.zeros_(module.bias)


def build_resnet50(num_classes: int) -> nn.Module:
    model = resnet50(weights=None, num_classes=num_classes)
    init_reference(model)
    return model


class MiniResNet(nn.Module):
    """3x3 stem, stages of torchvision Bottleneck blocks (stride on the 3x3 conv, as in v1.5),
    global average pool and a linear classifier."""

    def __init__(self, num_classes: int, stem_width: int, widths: tuple[int, ...], blocks: tuple[int, ...],
                 stem_stride: int = 2) -> None:
        super().__init__()
        if len(widths) != len(blocks) or not widths:
            raise ValueError("widths and blocks must be non-empty and of equal length")
        self.stem = nn.Sequential(
            nn.Conv2d(3, stem_width, 3, stem_stride, 1, bias=False),
            nn.BatchNorm2d(stem_width),
            nn.ReLU(inplace=True),
        )
        layers: list[nn.Module] = []
        channels = stem_width
        for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for i in range(count):
                stride = 2 if (stage > 0 and i == 0) else 1
                out = width * Bottleneck.expansion
                down = None
                if stride != 1 or channels != out:
                    down = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                layers.append(Bottleneck(channels, width, stride, down))
                channels = out
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        init_reference(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))
