"""torchvision transforms v2 pipelines applied to a detection sample (image, boxes, labels): the
boxes follow every geometric change of the image."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2


def with_boxes(pipeline: v2.Transform) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                                     tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    def apply(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=tuple(image.shape[1:]))
        out_image, target = pipeline(tv_tensors.Image(image), {"boxes": boxes, "labels": labels})
        return out_image.as_subclass(torch.Tensor), target["boxes"].as_subclass(torch.Tensor), target["labels"]

    return apply
