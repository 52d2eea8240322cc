"""The RetinaNet reference's data pipeline (per sample, in DataLoader workers): horizontal flip for
training, nothing else; the model itself converts, normalises and resizes to its square input."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

from trainperf.workloads.common.coco.transforms import with_boxes

Sample = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def train_transform(hflip: bool) -> Sample:
    return with_boxes(v2.Compose([v2.RandomHorizontalFlip(p=0.5 if hflip else 0.0)]))


def eval_transform() -> Sample:
    def same(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return image, boxes, labels

    return same
