"""RetinaNet from torchvision's detection building blocks, configured as the MLPerf reference: a
ResNeXt50-32x4d body with frozen BatchNorm and trainable layers 2-4, an FPN over C3-C5 with P6/P7
computed from P5, 9 anchors per location (32..512 x 2^{0,1/3,2/3} x ratios 0.5/1/2), the focal-loss
classification and L1 box heads, images resized to a fixed square inside the model.

The mini model keeps every part but the sizes: a small ResNet body trained from scratch (so its
BatchNorm trains), a narrow FPN, GroupNorm in the heads (a from-scratch head without it trained too
slowly to reach the mini target in minutes), anchors sized to 64x64 images.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models.detection import RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN, resnet_fpn_backbone
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.retinanet import RetinaNetHead
from torchvision.models.resnet import BasicBlock
from torchvision.ops import generalized_box_iou_loss, sigmoid_focal_loss
from torchvision.ops.feature_pyramid_network import LastLevelP6P7

from trainperf.contract import LengthBuckets
from trainperf.workloads.common.coco import matching, ondevice

SCALES = (1.0, 2 ** (1 / 3), 2 ** (2 / 3))
RATIOS = (0.5, 1.0, 2.0)
FULL_ANCHOR_SIZES = (32, 64, 128, 256, 512)  # P3..P7
MINI_ANCHOR_SIZES = (8, 16, 32, 48, 64)
MINI_RATIOS = (1.0,)  # every mini object's box is square


def MINI_STAGES(width: int) -> tuple[int, int, int, int]:  # noqa: N802
    return (2 * width, 4 * width, 4 * width, 4 * width)


class BatchedRetinaNet(RetinaNet):
    """torchvision's RetinaNet with its training loss computed for the whole batch at once.

    torchvision matches anchors to boxes and computes both losses one image at a time (a Python loop of
    small kernels, and as many again in the backward): for the mini model that was a sixth of a step.
    Every image of a batch shares one anchor set (anchors come from the padded batch's feature maps),
    so matching is one [B, G, A] IoU with the images' boxes padded to G; the losses are the same
    sums, each image's divided by its own foreground count, then averaged over images. The result
    equals torchvision's to rounding (tested), including its matcher's quirks: anchors between the
    IoU thresholds ignored, and every anchor tying a box's best IoU kept as a low-quality match.
    Box-loss types other than l1, smooth_l1 and giou fall back to torchvision's per-image loop."""

    BATCHED_BOX_LOSSES = ("l1", "smooth_l1", "giou")

    def forward(self, images: Any, targets: list[dict[str, torch.Tensor]] | dict[str, torch.Tensor] | None = None
                ) -> Any:
        if not self.training:
            return super().forward(images, targets)
        if isinstance(targets, dict):  # static shapes: see `static_inputs`
            image_list = ImageList(images, [tuple(images.shape[-2:])] * images.shape[0])
            features = list(self.backbone(images).values())
            anchors = self.anchor_generator(image_list, features)
            return self._padded_loss(targets["boxes"], targets["labels"], targets["present"], self.head(features),
                                     anchors)
        # torchvision's training pass without its per-image `if degenerate_boxes.any()`: a host-device
        # synchronisation for every image of every step. trainperf's readers drop degenerate boxes
        # before they get here (workloads/common/coco/data.py), and resizing keeps boxes non-degenerate.
        images, targets = self.transform(images, targets)
        features = list(self.backbone(images.tensors).values())
        head_outputs = self.head(features)
        return self.compute_loss(targets, head_outputs, self.anchor_generator(images, features))

    def static_inputs(self, images: Any, targets: list[dict[str, torch.Tensor]], boxes_per_image: LengthBuckets
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A training batch in shapes that do not change between steps, for a compiled step (--static-shapes,
        --cuda-graphs): the images normalised and resized to the model's square (torchvision's transform,
        run before the compiled model: its sizes are the data's), and each image's boxes padded to the
        bucket of the batch's largest box count, `present` marking the real ones. The loss of this form is
        the loss of the other (tested)."""
        image_list, targets = self.transform(images, targets)
        most = max((len(t["boxes"]) for t in targets), default=0)
        padded = matching.padded_targets(targets, boxes_per_image.length(max(most, 1)),
                                         tuple(image_list.tensors.shape[-2:]), image_list.tensors.device)
        return image_list.tensors, padded

    def compute_loss(self, targets: list[dict[str, torch.Tensor]], head_outputs: dict[str, torch.Tensor],
                     anchors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        regression = self.head.regression_head
        if regression._loss_type not in self.BATCHED_BOX_LOSSES or len({a.shape for a in anchors}) != 1:
            return super().compute_loss(targets, head_outputs, anchors)
        device, dtype = anchors[0].device, anchors[0].dtype
        boxes = torch.nn.utils.rnn.pad_sequence([t["boxes"].to(dtype) for t in targets], batch_first=True)
        labels = torch.nn.utils.rnn.pad_sequence([t["labels"] for t in targets], batch_first=True)
        present = torch.nn.utils.rnn.pad_sequence(
            [torch.ones(len(t["boxes"]), dtype=torch.bool, device=device) for t in targets], batch_first=True)
        return self._padded_loss(boxes, labels, present, head_outputs, anchors)

    def _padded_loss(self, boxes: torch.Tensor, labels: torch.Tensor, present: torch.Tensor,
                     head_outputs: dict[str, torch.Tensor], anchors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The losses from every image's boxes [B, G, 4] and labels [B, G], padded to G, `present` marking
        the real ones."""
        regression = self.head.regression_head
        cls_logits, box_deltas = head_outputs["cls_logits"], head_outputs["bbox_regression"]
        batch, count = cls_logits.shape[:2]
        anchor = torch.stack(anchors)  # [B, A, 4]
        boxes = boxes.to(anchor.dtype)
        matches = matching.match(self.proposal_matcher, boxes, present, anchor)

        foreground = matches >= 0
        per_image = foreground.sum(1).clamp(min=1).to(cls_logits.dtype)  # torchvision's max(1, num_foreground)
        gt_labels = labels.gather(1, matches.clamp(min=0)) if labels.shape[1] else torch.zeros_like(matches)
        # One-hot targets by scatter (F.one_hot reads the labels' range back to the host: two syncs).
        target = torch.zeros_like(cls_logits).scatter_(2, gt_labels[..., None], 1.0) * foreground[..., None]
        focal = sigmoid_focal_loss(cls_logits, target, reduction="none")
        ignored = (matches == self.head.classification_head.BETWEEN_THRESHOLDS)[..., None]
        classification = (focal.masked_fill(ignored, 0).sum((1, 2)) / per_image).mean()

        # The box loss over every anchor, the background's masked out: selecting the foreground's first
        # (nonzero) would wait for the device to say how many there are. A background anchor is compared
        # with itself (its loss finite, then zeroed), never with a padding box.
        matched = matching.matched_boxes(boxes, matches, anchor)
        flat_deltas, flat_anchors = box_deltas.reshape(-1, 4), anchor.reshape(-1, 4)
        if regression._loss_type == "giou":
            decoded = regression.box_coder.decode_single(flat_deltas, flat_anchors)
            loss = generalized_box_iou_loss(decoded, matched.reshape(-1, 4), reduction="none", eps=1e-7)
        else:
            wanted = regression.box_coder.encode_single(matched.reshape(-1, 4), flat_anchors)
            loss = (F.l1_loss(flat_deltas, wanted, reduction="none") if regression._loss_type == "l1"
                    else F.smooth_l1_loss(flat_deltas, wanted, reduction="none", beta=1.0)).sum(1)
        loss = torch.where(foreground, loss.reshape(batch, count), 0.0)
        box = (loss / per_image[:, None]).sum() / max(1, batch)
        return {"classification": classification, "bbox_regression": box}


def anchor_generator(base_sizes: tuple[int, ...], ratios: tuple[float, ...] = RATIOS) -> AnchorGenerator:
    """Per level: each base size at three octave scales, each at the aspect ratios (the reference
    truncates the scaled sizes to integers, as torchvision's RetinaNet default does)."""
    sizes = tuple(tuple(int(s * k) for k in SCALES) for s in base_sizes)
    return AnchorGenerator(sizes, (ratios,) * len(base_sizes))


def retinanet_resnext50(num_classes: int, image_size: int = 800, backbone_weights: dict | None = None
                        ) -> RetinaNet:
    """The reference RetinaNet. `backbone_weights`: a torchvision resnext50_32x4d ImageNet state dict."""
    backbone = resnet_fpn_backbone(backbone_name="resnext50_32x4d", weights=None, trainable_layers=3,
                                   returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
    if backbone_weights is not None:
        body = {k: v for k, v in backbone_weights.items() if not k.startswith("fc.")}
        backbone.body.load_state_dict(body)  # FrozenBatchNorm2d drops num_batches_tracked itself
    return ondevice.keep_on_device(BatchedRetinaNet(
        backbone, num_classes, anchor_generator=anchor_generator(FULL_ANCHOR_SIZES), min_size=image_size,
        max_size=image_size, fixed_size=(image_size, image_size), score_thresh=0.05, nms_thresh=0.5,
        detections_per_img=300, topk_candidates=1000, fg_iou_thresh=0.5, bg_iou_thresh=0.4))


class MiniBody(nn.Module):
    """A ResNet body sized for 64x64 images: a stride-2 stem, then four stages of one basic block,
    each halving the resolution (C3-C5 at strides 8, 16, 32)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        channels = width
        for i, out in enumerate(MINI_STAGES(width), start=1):
            down = nn.Sequential(nn.Conv2d(channels, out, 1, stride=2, bias=False), nn.BatchNorm2d(out))
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(channels, out, stride=2, downsample=down)))
            channels = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # only its layers are used (IntermediateLayerGetter)
        raise NotImplementedError


def mini_retinanet(num_classes: int, image_size: int = 64, width: int = 16, fpn_channels: int = 64,
                   detections: int = 100) -> RetinaNet:
    body = MiniBody(width)
    backbone = BackboneWithFPN(body, return_layers={"layer2": "0", "layer3": "1", "layer4": "2"},
                               in_channels_list=list(MINI_STAGES(width)[1:]), out_channels=fpn_channels,
                               extra_blocks=LastLevelP6P7(fpn_channels, fpn_channels))
    anchors = anchor_generator(MINI_ANCHOR_SIZES, MINI_RATIOS)
    head = RetinaNetHead(fpn_channels, anchors.num_anchors_per_location()[0], num_classes,
                         norm_layer=partial(nn.GroupNorm, 16))
    head.regression_head._loss_type = "giou"
    return ondevice.keep_on_device(BatchedRetinaNet(
        backbone, num_classes, anchor_generator=anchors, head=head, min_size=image_size, max_size=image_size,
        fixed_size=(image_size, image_size), score_thresh=0.05, nms_thresh=0.5, detections_per_img=detections,
        topk_candidates=1000, fg_iou_thresh=0.5, bg_iou_thresh=0.4))


# torchvision >= 0.13 wraps each head and FPN conv with its norm/activation (conv.<i>.0,
# inner_blocks.<i>.0); the reference's modules (and the 2.0.0 closed rules' tensor list) number the
# head's conv and ReLU modules flat (conv.<2i>) and hold bare FPN convs (inner_blocks.<i>).
_HEAD_CONV = re.compile(r"^(head\.(?:classification|regression)_head\.conv)\.(\d+)\.0\.")
_FPN_CONV = re.compile(r"^(backbone\.fpn\.(?:inner|layer)_blocks\.\d+)\.0\.")


def reference_tensor_names(model: nn.Module) -> list[str]:
    """The model's parameters as the reference logs them (`weights_initialization`): its DDP module
    names (`module.` prefix) in the reference's head numbering. Frozen BatchNorm holds buffers, not
    parameters, so it is not listed, as in the reference."""
    names = []
    for name, _ in model.named_parameters():
        name = _HEAD_CONV.sub(lambda m: f"{m.group(1)}.{2 * int(m.group(2))}.", name)
        names.append("module." + _FPN_CONV.sub(r"\1.", name))
    return names
