"""Mask R-CNN from torchvision's detection building blocks, configured as the MLPerf reference
(maskrcnn_benchmark, e2e_mask_rcnn_R_50_FPN_1x): a ResNet-50 body with frozen BatchNorm whose stem and
res2 are frozen too, an FPN over C2-C5 with P6 by max-pooling (for the RPN only), one anchor size per
level (32..512) at ratios 0.5/1/2, the RPN's thresholds, top-N and NMS, RoIAlign 7x7 / 14x14 with
sampling ratio 2 over P2-P5 (canonical level 4 at 224 pixels), 512 RoIs per image at 25 %
foreground, two FC-1024 layers, class-specific boxes (weights 10, 10, 5, 5), four 3x3 convolutions and a
deconvolution to 28x28 class-specific masks; at test time score 0.05, NMS 0.5, 100 detections.
Inputs are resized to a shorter side of 800 (longer at most 1333) and padded to a multiple of 32.

The mini model keeps every part but the sizes: a small ResNet body trained from scratch (its
BatchNorm trains), a narrow FPN and heads, anchors and RoIs sized to 64x64 images.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN, resnet_fpn_backbone
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.transform import resize_boxes
from torchvision.models.resnet import BasicBlock
from torchvision.ops import MultiScaleRoIAlign

from trainperf import devices
from trainperf.contract import LengthBuckets
from trainperf.workloads.common.coco import matching, ondevice
from trainperf.workloads.maskrcnn import syncfree

FULL_ANCHOR_SIZES = ((32,), (64,), (128,), (256,), (512,))  # P2..P6
RATIOS = (0.5, 1.0, 2.0)
# The reference's input: BGR in 0..255 minus the Caffe2 ImageNet means, std 1 (its MSRA R-50 weights
# expect it); torchvision's ImageNet weights expect RGB in 0..1 normalised by their own mean and std.
BGR255_MEAN, BGR255_STD = (102.9801, 115.9465, 122.7717), (1.0, 1.0, 1.0)
RGB_MEAN, RGB_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class TrainedMaskRCNN(MaskRCNN):
    """torchvision's Mask R-CNN whose training pass is sync-free (workloads/maskrcnn/syncfree.py): fixed-size
    proposals, sampling and RoI pooling, and no per-image `if degenerate_boxes.any()` (trainperf's COCO
    reader drops degenerate boxes before they get here: workloads/common/coco/data.py). Evaluation is
    torchvision's."""

    rpn: syncfree.SyncFreeRPN
    roi_heads: syncfree.SyncFreeRoIHeads

    def forward(self, images: Any, targets: list[dict[str, torch.Tensor]] | dict[str, torch.Tensor] | None = None
                ) -> Any:
        if not self.training:
            return super().forward(images, targets)
        if isinstance(targets, dict):  # static shapes: see `static_inputs`
            image_list = ImageList(images, [tuple(images.shape[-2:])] * images.shape[0])
            gt, sizes = targets, targets["sizes"]
        else:
            image_list, transformed = self.transform(images, targets)
            gt = matching.padded_targets(transformed, None, tuple(image_list.tensors.shape[-2:]),
                                         image_list.tensors.device)
            sizes = image_list.image_sizes
        features = self.backbone(image_list.tensors)
        proposals, valid, proposal_losses = self.rpn.training_pass(image_list, features, sizes, gt)
        detector_losses = self.roi_heads.training_pass(features, proposals, valid,
                                                       tuple(image_list.tensors.shape[-2:]), gt)
        return {**detector_losses, **proposal_losses}

    def static_inputs(self, images: Any, targets: list[dict[str, torch.Tensor]], boxes_per_image: LengthBuckets,
                      sizes: list[tuple[int, int]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A training batch in shapes that do not change between steps, for a compiled step (--static-shapes,
        --cuda-graphs): torchvision's transform (resizing and normalising, run before the compiled model:
        its sizes are the data's), the batch padded to the first of `sizes` holding every image, and the
        targets padded to the bucket of the batch's largest box count (`matching.padded_targets`), with the
        images' own sizes as a tensor (the proposals are clipped to them)."""
        image_list, transformed = self.transform(images, targets)
        high = max(h for h, _ in image_list.image_sizes)
        wide = max(w for _, w in image_list.image_sizes)
        size = next(((h, w) for h, w in sizes if h >= high and w >= wide), None)
        if size is None:
            raise ValueError(f"a batch of {high}x{wide} images fits no image bucket of {sizes}")
        tensors = image_list.tensors
        tensors = F.pad(tensors, (0, size[1] - tensors.shape[-1], 0, size[0] - tensors.shape[-2]))
        most = max((len(t["boxes"]) for t in transformed), default=0)
        gt = matching.padded_targets(transformed, boxes_per_image.length(max(most, 1)), size, tensors.device)
        gt["sizes"] = devices.from_host(image_list.image_sizes, tensors.device)
        return tensors, gt


def image_buckets(min_size: int, max_size: int, divisible: int = 32) -> list[tuple[int, int]]:
    """The padded batch sizes a step may have with static shapes, smallest first: an image resized to a
    shorter side of at most min_size and a longer of at most max_size fits landscape (short x long) or
    portrait (long x short); a batch holding both, the square."""
    short, long = (-(-n // divisible) * divisible for n in (min_size, max_size))
    return [(long, long)] if short == long else [(short, long), (long, short), (long, long)]


def maskrcnn_resnet50_fpn(num_classes: int, min_size: int = 800, max_size: int = 1333, candidates: int = 1000,
                          bgr255: bool = True, backbone_weights: dict | None = None,
                          msra_strides: bool = True) -> MaskRCNN:
    """The reference Mask R-CNN. `candidates`: the RPN's post-NMS proposals kept per image in training
    (torchvision keeps them per image; the reference's config takes them over each GPU's batch).
    `backbone_weights`: a resnet50 state dict under torchvision's names (ImageNet); `msra_strides`: each
    stage strides in its first 1x1 convolution, as the reference's MSRA R-50 (False: torchvision's v1.5, for
    torchvision's weights: workloads/maskrcnn/weights.py)."""
    backbone = resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=3)
    if backbone_weights is not None:
        body = {k: v for k, v in backbone_weights.items() if not k.startswith("fc.")}
        backbone.body.load_state_dict(body)
    if msra_strides:
        stride_in_1x1(backbone.body)
    mean, std = (BGR255_MEAN, BGR255_STD) if bgr255 else (RGB_MEAN, RGB_STD)
    model = TrainedMaskRCNN(
        backbone, num_classes, min_size=min_size, max_size=max_size, image_mean=list(mean), image_std=list(std),
        rpn_anchor_generator=AnchorGenerator(FULL_ANCHOR_SIZES, (RATIOS,) * len(FULL_ANCHOR_SIZES)),
        rpn_pre_nms_top_n_train=2000, rpn_pre_nms_top_n_test=1000, rpn_post_nms_top_n_train=candidates,
        rpn_post_nms_top_n_test=1000, rpn_nms_thresh=0.7, rpn_fg_iou_thresh=0.7, rpn_bg_iou_thresh=0.3,
        rpn_batch_size_per_image=256, rpn_positive_fraction=0.5,
        box_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], 7, sampling_ratio=2),
        box_score_thresh=0.05, box_nms_thresh=0.5, box_detections_per_img=100, box_fg_iou_thresh=0.5,
        box_bg_iou_thresh=0.5, box_batch_size_per_image=512, box_positive_fraction=0.25,
        bbox_reg_weights=(10.0, 10.0, 5.0, 5.0),
        mask_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], 14, sampling_ratio=2))
    reference_box_head_init(model)
    return syncfree.sync_free(ondevice.keep_on_device(model))


def stride_in_1x1(body: nn.Module) -> None:
    """The MSRA R-50 of the reference strides in each stage's first 1x1 convolution (ResNet v1);
    torchvision's strides in the 3x3 (v1.5). Same tensors, so the move is a stride change only."""
    for name in ("layer2", "layer3", "layer4"):
        block = getattr(body, name)[0]
        stride = block.conv2.stride
        block.conv1.stride, block.conv2.stride = stride, (1, 1)


def reference_box_head_init(model: MaskRCNN) -> None:
    """maskrcnn_benchmark's box head initialisation where torchvision keeps nn.Linear's default: fc6
    and fc7 by Caffe2's Xavier fill (kaiming_uniform with a=1), the class scores N(0, 0.01), the box
    deltas N(0, 0.001), every bias 0. (The FPN, the RPN head and the mask head already agree.)"""
    head, predictor = model.roi_heads.box_head, model.roi_heads.box_predictor
    for fc in (head.fc6, head.fc7):
        nn.init.kaiming_uniform_(fc.weight, a=1)
        nn.init.zeros_(fc.bias)
    nn.init.normal_(predictor.cls_score.weight, std=0.01)
    nn.init.normal_(predictor.bbox_pred.weight, std=0.001)
    nn.init.zeros_(predictor.cls_score.bias)
    nn.init.zeros_(predictor.bbox_pred.bias)


MINI_ANCHOR_SIZES = ((8,), (16,), (32,), (64,))  # P2..P5 of a 64x64 image


class MiniBody(nn.Module):
    """A ResNet body for 64x64 images: a stride-1 stem, then four stages of one basic block at strides
    2, 4, 8 and 16 (C2-C5: the reference's levels, at a quarter of their stride)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        channels = width
        for i, out in enumerate(mini_stages(width), start=1):
            down = nn.Sequential(nn.Conv2d(channels, out, 1, stride=2, bias=False), nn.BatchNorm2d(out))
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(channels, out, stride=2, downsample=down)))
            channels = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # only its layers are used (IntermediateLayerGetter)
        raise NotImplementedError


def mini_stages(width: int) -> tuple[int, int, int, int]:
    return (width, 2 * width, 4 * width, 4 * width)


def mini_maskrcnn(num_classes: int, image_size: int = 64, width: int = 16, fpn_channels: int = 32,
                  representation: int = 128, candidates: int = 300, rois: int = 64, detections: int = 100,
                  mask_channels: int = 32, mask_pool: int = 7) -> MaskRCNN:
    """A small Mask R-CNN with the reference's structure, for 64x64 images, trained from scratch. Its
    heads are where a CPU spends the time (every RoI through the box MLP, every positive RoI through
    the mask convolutions): one mask convolution, RoIs pooled to `mask_pool` (masks of twice that)."""
    body = MiniBody(width)
    backbone = BackboneWithFPN(body, return_layers={f"layer{i}": str(i - 1) for i in range(1, 5)},
                               in_channels_list=list(mini_stages(width)), out_channels=fpn_channels)
    anchors = AnchorGenerator(MINI_ANCHOR_SIZES + ((96,),), (RATIOS,) * (len(MINI_ANCHOR_SIZES) + 1))
    box_pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, sampling_ratio=2, canonical_scale=56, canonical_level=4)
    mask_roi_pool = MultiScaleRoIAlign(["0", "1", "2", "3"], mask_pool, sampling_ratio=2, canonical_scale=56,
                                       canonical_level=4)
    # num_classes goes to the predictors: torchvision wants None when they are given (its default box
    # predictor assumes a 1024-wide head).
    return syncfree.sync_free(ondevice.keep_on_device(TrainedMaskRCNN(
        backbone, None, min_size=image_size, max_size=image_size, fixed_size=(image_size, image_size),
        image_mean=list(RGB_MEAN), image_std=list(RGB_STD), rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_train=150, rpn_pre_nms_top_n_test=150, rpn_post_nms_top_n_train=candidates,
        rpn_post_nms_top_n_test=candidates, rpn_batch_size_per_image=128,
        box_roi_pool=box_pool, box_head=TwoMLPHead(fpn_channels * 49, representation),
        box_predictor=FastRCNNPredictor(representation, num_classes),
        box_batch_size_per_image=rois, box_detections_per_img=detections, box_score_thresh=0.05,
        mask_roi_pool=mask_roi_pool, mask_head=MaskRCNNHeads(fpn_channels, (mask_channels,), 1),
        mask_predictor=MaskRCNNPredictor(mask_channels, mask_channels, num_classes))))


class UnpastedMasks(ondevice.DeviceTransform):
    """torchvision's transform whose test-time postprocessing scales the boxes back to the original
    image but leaves each mask as the head's MxM probabilities. Pasting them into image-sized masks
    (about 2 ms a detection on a CPU core at COCO sizes) is scoring's work: the scoring process does it
    with the same function (`coco.masks.paste`), so the training processes only copy MxM maps."""

    def postprocess(self, result: list[dict[str, torch.Tensor]], image_shapes: list[tuple[int, int]],
                    original_image_sizes: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
        if self.training:
            return result
        for found, size, original in zip(result, image_shapes, original_image_sizes, strict=True):
            found["boxes"] = resize_boxes(found["boxes"], size, original)
        return result


def unpasted(model: MaskRCNN) -> MaskRCNN:
    """`model` with `UnpastedMasks` postprocessing (the same transform otherwise: only the class changes)."""
    return ondevice.keep_on_device(model, UnpastedMasks)


# The closed rules' (1.1.0+) names for the reference's tensors, by torchvision module prefix.
_REFERENCE_NAMES = [
    (re.compile(r"^backbone\.fpn\.inner_blocks\.(\d)\."), lambda m: f"FPN_inner_block{int(m.group(1)) + 1}"),
    (re.compile(r"^backbone\.fpn\.layer_blocks\.(\d)\."), lambda m: f"FPN_layer_block{int(m.group(1)) + 1}"),
    (re.compile(r"^rpn\.head\.conv\."), lambda m: "RPNHead_conv"),
    (re.compile(r"^rpn\.head\.cls_logits\."), lambda m: "RPNHead_cls"),
    (re.compile(r"^rpn\.head\.bbox_pred\."), lambda m: "RPNHead_bbox"),
    (re.compile(r"^roi_heads\.box_head\.fc6\."), lambda m: "ROI_BOX_FEATURE_EXTRACTOR_fc6"),
    (re.compile(r"^roi_heads\.box_head\.fc7\."), lambda m: "ROI_BOX_FEATURE_EXTRACTOR_fc7"),
    (re.compile(r"^roi_heads\.box_predictor\.cls_score\."), lambda m: "ROI_BOX_PREDICTOR_cls"),
    (re.compile(r"^roi_heads\.box_predictor\.bbox_pred\."), lambda m: "ROI_BOX_PREDICTOR_bbox"),
    (re.compile(r"^roi_heads\.mask_head\.(\d)\."), lambda m: f"ROI_MASK_FEATURE_EXTRACTOR_fcn{int(m.group(1)) + 1}"),
    (re.compile(r"^roi_heads\.mask_predictor\.conv5_mask\."), lambda m: "ROI_MASK_PREDICTOR_fcn5"),
    (re.compile(r"^roi_heads\.mask_predictor\.mask_fcn_logits\."), lambda m: "ROI_MASK_PREDICTOR_fcn_logits"),
]


def reference_tensor_names(model: nn.Module) -> list[str]:
    """The tensors the reference logs as initialised (`weights_initialization`): its heads' and FPN's,
    once per module (the body starts from ImageNet weights and is not listed)."""
    names: list[str] = []
    for name, _ in model.named_parameters():
        for pattern, rename in _REFERENCE_NAMES:
            found = pattern.match(name)
            if found and rename(found) not in names:
                names.append(rename(found))
    return names
