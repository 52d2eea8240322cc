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

import torch
from torch import nn
from torchvision.models.detection import RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN, resnet_fpn_backbone
from torchvision.models.detection.retinanet import RetinaNetHead
from torchvision.models.resnet import BasicBlock
from torchvision.ops.feature_pyramid_network import LastLevelP6P7

SCALES = (1.0, 2 ** (1 / 3), 2 ** (2 / 3))
RATIOS = (0.5, 1.0, 2.0)
FULL_ANCHOR_SIZES = (32, 64, 128, 256, 512)  # P3..P7
MINI_ANCHOR_SIZES = (8, 16, 32, 48, 64)
MINI_RATIOS = (1.0,)  # every mini object's box is square


def MINI_STAGES(width: int) -> tuple[int, int, int, int]:  # noqa: N802
    return (2 * width, 4 * width, 4 * width, 4 * width)


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
    return RetinaNet(backbone, num_classes, anchor_generator=anchor_generator(FULL_ANCHOR_SIZES),
                     min_size=image_size, max_size=image_size, fixed_size=(image_size, image_size),
                     score_thresh=0.05, nms_thresh=0.5, detections_per_img=300, topk_candidates=1000,
                     fg_iou_thresh=0.5, bg_iou_thresh=0.4)


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
    return RetinaNet(backbone, num_classes, anchor_generator=anchors, head=head, min_size=image_size,
                     max_size=image_size, fixed_size=(image_size, image_size), score_thresh=0.05, nms_thresh=0.5,
                     detections_per_img=detections, topk_candidates=1000, fg_iou_thresh=0.5, bg_iou_thresh=0.4)


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
