"""torchvision's detection input transform and box coder without host-device synchronisations.

Inside every training step torchvision's `GeneralizedRCNNTransform` makes its mean and std with
`torch.as_tensor(..., device=)` for each image (2 copies from the host), scales each image's boxes by
ratios made as device tensors (4 more), and `BoxCoder.encode_single` makes its weights the same way (1 a
call; decoding makes two `torch.tensor(0.5, device=)`). Each is a blocking host-to-device copy: on a GPU
torch waits for the stream before it returns (RetinaNet's step at batch 16 made 97 of them on an H100).
Here the mean and std are the transform's buffers (moved with the model, left out of its state dict), the
images of one size are normalised in one batched operation, and the box ratios, the halves and the coder's
weights are Python numbers (no cache of device tensors: a compiled step would recompile when one filled).
The arithmetic is torchvision's, operation for operation: the same values (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torchvision.models.detection._utils import BoxCoder
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.transform import GeneralizedRCNNTransform, _resize_image_and_masks


class DeviceTransform(GeneralizedRCNNTransform):
    """torchvision's transform with its constants on the device (see the module's docstring). Its `forward` is
    torchvision's, operation for operation, but for the batched normalisation; it keeps no state between calls
    (a compiled model traces it without side effects)."""

    mean: torch.Tensor
    std: torch.Tensor

    def forward(self, images: Any, targets: list[dict[str, torch.Tensor]] | None = None
                ) -> tuple[ImageList, list[dict[str, torch.Tensor]] | None]:
        if any(image.dim() != 3 for image in images):
            raise ValueError("images is expected to be a list of 3d tensors of shape [C, H, W]")
        targets = [dict(t) for t in targets] if targets is not None else None
        if isinstance(images, torch.Tensor) or len({tuple(image.shape) for image in images}) == 1:
            batch = images if isinstance(images, torch.Tensor) else torch.stack(list(images))
            normalized = list(self.normalize(batch).unbind(0))  # one subtraction and one division for all
        else:
            normalized = [self.normalize(image) for image in images]
        for i, image in enumerate(normalized):
            image, target = self.resize(image, targets[i] if targets is not None else None)
            normalized[i] = image
            if targets is not None and target is not None:
                targets[i] = target
        sizes = [(int(image.shape[-2]), int(image.shape[-1])) for image in normalized]
        return ImageList(self.batch_images(normalized, size_divisible=self.size_divisible), sizes), targets

    def normalize(self, image: torch.Tensor) -> torch.Tensor:
        """An image [C, H, W] or a batch of them [B, C, H, W], normalised by the buffers."""
        if not image.is_floating_point():
            raise TypeError(f"Expected input images to be of floating type (in range [0, 1]), but found type "
                            f"{image.dtype} instead")
        mean, std = self.mean.to(image.dtype), self.std.to(image.dtype)
        return (image - mean[:, None, None]) / std[:, None, None]

    def resize(self, image: torch.Tensor, target: dict[str, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        h, w = image.shape[-2:]
        if self.training:
            if self._skip_resize:
                return image, target
            size = self.torch_choice(self.min_size)  # a host tensor's draw: torch's generator as torchvision uses it
        else:
            size = self.min_size[-1]
        image, target = _resize_image_and_masks(image, size, self.max_size, target, self.fixed_size)
        if target is None:
            return image, target
        if "keypoints" in target:
            raise ValueError("keypoints: not supported by trainperf's detection transform")
        target["boxes"] = scaled_boxes(target["boxes"], (int(h), int(w)), tuple(image.shape[-2:]))
        return image, target


def scaled_boxes(boxes: torch.Tensor, original: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """torchvision's `resize_boxes` with its ratios as Python numbers: the float32 quotient torchvision gets by
    dividing two float32 device tensors, computed on the host (IEEE division in NumPy's float32)."""
    ratio_height, ratio_width = (float(np.float32(n) / np.float32(o)) for n, o in zip(new, original, strict=True))
    xmin, ymin, xmax, ymax = boxes.unbind(1)
    return torch.stack((xmin * ratio_width, ymin * ratio_height, xmax * ratio_width, ymax * ratio_height), dim=1)


class DeviceBoxCoder(BoxCoder):
    """torchvision's box coder with its weights as Python numbers in both directions: nothing made from host
    data, and no cache either (a compiled step would recompile when one filled)."""

    def encode_single(self, reference_boxes: torch.Tensor, proposals: torch.Tensor) -> torch.Tensor:
        """torchvision's `encode_boxes`, operation for operation, its weights Python numbers (a weight times a
        float32 tensor is the same product whether the weight is a 0-d float32 tensor or a float)."""
        wx, wy, ww, wh = self.weights
        px1, py1, px2, py2 = (proposals[:, i].unsqueeze(1) for i in range(4))
        rx1, ry1, rx2, ry2 = (reference_boxes[:, i].unsqueeze(1) for i in range(4))
        ex_widths, ex_heights = px2 - px1, py2 - py1
        ex_ctr_x, ex_ctr_y = px1 + 0.5 * ex_widths, py1 + 0.5 * ex_heights
        gt_widths, gt_heights = rx2 - rx1, ry2 - ry1
        gt_ctr_x, gt_ctr_y = rx1 + 0.5 * gt_widths, ry1 + 0.5 * gt_heights
        return torch.cat((wx * (gt_ctr_x - ex_ctr_x) / ex_widths, wy * (gt_ctr_y - ex_ctr_y) / ex_heights,
                          ww * torch.log(gt_widths / ex_widths), wh * torch.log(gt_heights / ex_heights)), dim=1)

    def decode_single(self, rel_codes: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """torchvision's decoding, operation for operation, with its two `torch.tensor(0.5, device=)` factors
        as the Python number (a float's 0.5 is exact: the same products)."""
        boxes = boxes.to(rel_codes.dtype)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        ctr_x, ctr_y = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
        wx, wy, ww, wh = self.weights
        dx, dy = rel_codes[:, 0::4] / wx, rel_codes[:, 1::4] / wy
        dw = torch.clamp(rel_codes[:, 2::4] / ww, max=self.bbox_xform_clip)
        dh = torch.clamp(rel_codes[:, 3::4] / wh, max=self.bbox_xform_clip)
        pred_ctr_x, pred_ctr_y = dx * widths[:, None] + ctr_x[:, None], dy * heights[:, None] + ctr_y[:, None]
        half_w, half_h = 0.5 * (torch.exp(dw) * widths[:, None]), 0.5 * (torch.exp(dh) * heights[:, None])
        return torch.stack((pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h),
                           dim=2).flatten(1)


def keep_on_device(model: nn.Module, transform: type[DeviceTransform] = DeviceTransform) -> nn.Module:
    """`model` (a torchvision detector) with `transform`'s class for its input transform and every box coder a
    `DeviceBoxCoder`: the same modules and values, only the classes change (and the transform's two
    buffers, not in the state dict). Call before the model moves to its device."""
    old = model.transform
    old.__class__ = transform
    if "mean" not in old._buffers:
        old.register_buffer("mean", torch.tensor(old.image_mean, dtype=torch.float32), persistent=False)
        old.register_buffer("std", torch.tensor(old.image_std, dtype=torch.float32), persistent=False)
    for module in model.modules():
        coder = getattr(module, "box_coder", None)
        if isinstance(coder, BoxCoder) and not isinstance(coder, DeviceBoxCoder):
            coder.__class__ = DeviceBoxCoder
    return model
