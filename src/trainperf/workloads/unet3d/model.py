"""The MLPerf 3D U-Net (KiTS19): the network, the Dice + cross-entropy loss and the Dice score.

Network: an input block of two (Conv3d 3^3, InstanceNorm3d with affine, ReLU) 1 -> c0; down blocks
whose first convolution has stride 2 (c0 -> c1 -> ... -> c_last, then a bottleneck c_last -> c_last);
up blocks of a 2^3 transposed convolution with stride 2, the skip concatenated, two convolution blocks;
an output 1^3 convolution to the classes. The reference's channels are 32/64/128/256/320 on 128^3
patches (five halvings: 4^3 at the bottleneck).
"""

from __future__ import annotations

import torch
from torch import nn

REFERENCE_CHANNELS = (32, 64, 128, 256, 320)


def _conv_block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.InstanceNorm3d(cout, affine=True), nn.ReLU(inplace=True))


class UNet3D(nn.Module):
    def __init__(self, channels: tuple[int, ...] = REFERENCE_CHANNELS, in_channels: int = 1, classes: int = 3
                 ) -> None:
        super().__init__()
        self.input_block = nn.Sequential(_conv_block(in_channels, channels[0]), _conv_block(channels[0], channels[0]))
        downs = list(zip(channels[:-1], channels[1:], strict=True)) + [(channels[-1], channels[-1])]
        self.downsample = nn.ModuleList(
            nn.Sequential(_conv_block(cin, cout, stride=2), _conv_block(cout, cout)) for cin, cout in downs)
        ups = [(channels[-1], channels[-1])] + [(cout, cin) for cin, cout in reversed(downs[:-1])]
        self.upsample = nn.ModuleList(_Up(cin, cout) for cin, cout in ups)
        self.output = nn.Conv3d(channels[0], classes, 1)
        self.halvings = len(downs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.input_block(x)]
        for down in self.downsample:
            skips.append(down(skips[-1]))
        out = skips.pop()
        for up in self.upsample:
            out = up(out, skips.pop())
        return self.output(out)


class _Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.deconv = nn.ConvTranspose3d(cin, cout, 2, stride=2)
        self.blocks = nn.Sequential(_conv_block(2 * cout, cout), _conv_block(cout, cout))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.blocks(torch.cat([self.deconv(x), skip], dim=1))


def dice_per_class(probs: torch.Tensor, onehot: torch.Tensor, smooth: float = 1e-6) -> torch.Tensor:
    """(B, C) soft Dice of every sample and class over the spatial dimensions (the reference's
    smoothing on numerator and denominator)."""
    dims = tuple(range(2, probs.dim()))
    inter = (probs * onehot).sum(dims)
    total = probs.sum(dims) + onehot.sum(dims)
    return (2 * inter + smooth) / (total + smooth)


def one_hot(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """(B, D, H, W) integer classes -> (B, classes, D, H, W) float one-hot, by comparison: F.one_hot
    reads the labels' range back to check it (two host-device synchronisations per call)."""
    wanted = torch.arange(classes, device=labels.device).view(1, classes, *([1] * (labels.dim() - 1)))
    return (labels.unsqueeze(1) == wanted).float()


def dice_ce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(1 - mean Dice of the foreground classes over softmax + cross-entropy) / 2, as the reference.
    logits (B, C, D, H, W), labels (B, 1, D, H, W) or (B, D, H, W) integer classes."""
    labels = labels.reshape(labels.shape[0], *logits.shape[2:]).long()
    logits = logits.float()
    probs = torch.softmax(logits, dim=1)
    onehot = one_hot(labels, logits.shape[1]).to(probs.dtype)
    dice = dice_per_class(probs, onehot)[:, 1:].mean()
    return (1 - dice + torch.nn.functional.cross_entropy(logits, labels)) / 2


def case_dice(prediction: torch.Tensor, label: torch.Tensor, classes: int = 3) -> torch.Tensor:
    """Dice of every foreground class of one case from hard predictions (argmax) and labels, both
    (D, H, W) integer volumes: (classes - 1,) values; a class absent from both scores 1."""
    pred = one_hot(prediction.long()[None], classes)
    true = one_hot(label.long()[None], classes)
    return dice_per_class(pred, true)[0, 1:]
