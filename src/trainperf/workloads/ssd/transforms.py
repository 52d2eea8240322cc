"""The SSD reference augmentation on torchvision's transforms v2 (per sample, in DataLoader workers): the
reference's random crop (`SSDCrop`), horizontal flip, colour jitter, resize to the square input; boxes
follow the image."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision import tv_tensors
from torchvision.ops import box_iou
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import get_bounding_boxes, query_size

from trainperf.workloads.common.coco.transforms import with_boxes as _with_boxes


class SSDCrop(v2.RandomIoUCrop):
    """The SSD reference's random crop (its `SSDCropping`): pick one of keep-the-image, any crop, or a crop
    whose IoU with **every** box exceeds 0.1, 0.3, 0.5, 0.7 or 0.9; try `trials` crops of width and height
    uniform in [0.3, 1] of the image's, the ratio of those fractions in [0.5, 2]; keep the boxes whose centre
    falls inside (at least one); otherwise pick again. torchvision's RandomIoUCrop accepts a crop when *some*
    box reaches the threshold, among the boxes centred in it, and bounds the aspect in pixels."""

    def __init__(self, trials: int) -> None:
        super().__init__(trials=trials)
        self.choices: tuple[float | None, ...] = (None, -float("inf"), 0.1, 0.3, 0.5, 0.7, 0.9)  # None: keep

    def make_params(self, flat_inputs: list) -> dict:
        height, width = query_size(flat_inputs)
        boxes = get_bounding_boxes(flat_inputs)
        xyxy = F.convert_bounding_box_format(boxes.as_subclass(torch.Tensor), boxes.format,
                                             tv_tensors.BoundingBoxFormat.XYXY)
        while True:
            min_iou = self.choices[int(torch.randint(len(self.choices), ()))]
            if min_iou is None:
                return {}
            for _ in range(self.trials):
                w, h = (0.3 + 0.7 * torch.rand(2)).tolist()
                if not 0.5 <= w / h <= 2:
                    continue
                left, top = (torch.rand(2) * torch.tensor([1 - w, 1 - h])).tolist()
                crop = torch.tensor([[left * width, top * height, (left + w) * width, (top + h) * height]],
                                    dtype=xyxy.dtype)
                if len(xyxy) and not bool((box_iou(xyxy, crop)[:, 0] > min_iou).all()):
                    continue
                cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
                inside = (crop[0, 0] < cx) & (cx < crop[0, 2]) & (crop[0, 1] < cy) & (cy < crop[0, 3])
                if not bool(inside.any()):
                    continue
                x0, y0 = int(crop[0, 0]), int(crop[0, 1])
                return {"left": x0, "top": y0, "width": max(1, int(crop[0, 2]) - x0),
                        "height": max(1, int(crop[0, 3]) - y0), "is_within_crop_area": inside}

    _get_params = make_params  # torchvision before 0.21 names it so


def train_transform(size: int, crop_trials: int, hflip: bool, color_jitter: bool
                    ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    steps: list[v2.Transform] = [SSDCrop(trials=crop_trials)]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if color_jitter:
        steps.append(v2.ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05))
    steps += [v2.Resize((size, size), antialias=True), v2.SanitizeBoundingBoxes(labels_getter=lambda t: t[1]["labels"])]
    return _with_boxes(v2.Compose(steps))


def eval_transform(size: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    return _with_boxes(v2.Compose([v2.Resize((size, size), antialias=True)]))
