"""torchvision transforms v2 pipelines applied to a detection sample (image, boxes, labels[, masks]):
the boxes and instance masks follow every geometric change of the image."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2


def with_boxes(pipeline: v2.Transform) -> Callable[..., tuple[torch.Tensor, ...]]:
    """apply(image, boxes, labels[, masks]) -> the same, transformed together."""

    def apply(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, ...]:
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=tuple(image.shape[1:])),
                  "labels": labels}
        if masks is not None:
            target["masks"] = tv_tensors.Mask(masks)
        out_image, target = pipeline(tv_tensors.Image(image), target)
        out = (out_image.as_subclass(torch.Tensor), target["boxes"].as_subclass(torch.Tensor), target["labels"])
        return out if masks is None else (*out, target["masks"].as_subclass(torch.Tensor))

    return apply
