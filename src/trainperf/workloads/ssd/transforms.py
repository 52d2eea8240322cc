"""The SSD reference augmentation, from torchvision's transforms v2 (per sample, in DataLoader workers):
the SSD random crop (keep the image, or a crop whose IoU with some box is at least one of 0.1, 0.3, 0.5,
0.7, 0.9), horizontal flip, colour jitter, resize to the square input; boxes follow the image."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

from trainperf.workloads.common.coco.transforms import with_boxes as _with_boxes


def train_transform(size: int, crop_trials: int, hflip: bool, color_jitter: bool
                    ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    steps: list[v2.Transform] = [v2.RandomIoUCrop(trials=crop_trials)]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if color_jitter:
        steps.append(v2.ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05))
    steps += [v2.Resize((size, size), antialias=True), v2.SanitizeBoundingBoxes(labels_getter=lambda t: t[1]["labels"])]
    return _with_boxes(v2.Compose(steps))


def eval_transform(size: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    return _with_boxes(v2.Compose([v2.Resize((size, size), antialias=True)]))
