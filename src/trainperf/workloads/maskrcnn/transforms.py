"""The Mask R-CNN reference's data pipeline (per sample, in DataLoader workers): a horizontal flip of
the image with its boxes and masks for training, nothing else; the model itself normalises, resizes
(shorter side 800, longer at most 1333) and pads to a multiple of 32."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

from trainperf.workloads.common.coco.transforms import with_boxes

Sample = Callable[..., tuple[torch.Tensor, ...]]


def train_transform(hflip: bool) -> Sample:
    return with_boxes(v2.Compose([v2.RandomHorizontalFlip(p=0.5 if hflip else 0.0)]))


def eval_transform() -> Sample:
    def same(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, ...]:
        return (image, boxes, labels) if masks is None else (image, boxes, labels, masks)

    return same
