"""SSD: default boxes, the box coder, matching, the loss with hard-negative mining, post-processing,
and the two networks — the MLPerf SSD300 with its ResNet-34 trunk, and a small one for mini.

What torchvision has is used (ResNet-34, box IoU, batched NMS); torchvision's SSD is a VGG-16 SSD
with another head layout, so the MLPerf SSD's head, default boxes and loss are written here.

Conventions (the reference's): default boxes are (cx, cy, w, h) in [0, 1], ordered per feature map
by box shape, then position (row-major); the heads' outputs are viewed the same way, [N, 4, A] for
locations and [N, C, A] for class logits (C includes the background, label 0).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import batched_nms, box_convert, box_iou


@dataclass(frozen=True)
class DefaultBoxSpec:
    """The default boxes of an SSD (the MLPerf SSD300's are `SSD300_BOXES`)."""

    fig_size: int
    feat_sizes: tuple[int, ...]
    steps: tuple[int, ...]
    scales: tuple[float, ...]  # one more than feature maps: s_k and s_k+1 give the k-th map's sizes
    aspect_ratios: tuple[tuple[int, ...], ...]
    scale_xy: float = 0.1
    scale_wh: float = 0.2

    @property
    def boxes_per_location(self) -> tuple[int, ...]:
        return tuple(2 + 2 * len(r) for r in self.aspect_ratios)


SSD300_BOXES = DefaultBoxSpec(fig_size=300, feat_sizes=(38, 19, 10, 5, 3, 1), steps=(8, 16, 32, 64, 100, 300),
                              scales=(21, 45, 99, 153, 207, 261, 315),
                              aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)))


def default_boxes(spec: DefaultBoxSpec) -> torch.Tensor:
    """[A, 4] (cx, cy, w, h) in [0, 1]: per map k, the sizes s_k, sqrt(s_k s_k+1) and s_k*sqrt(r),
    s_k/sqrt(r) (both orientations) for each aspect ratio r, each at every cell centre."""
    boxes = []
    for k, size in enumerate(spec.feat_sizes):
        fk = spec.fig_size / spec.steps[k]
        sk1 = spec.scales[k] / spec.fig_size
        sk2 = spec.scales[k + 1] / spec.fig_size
        sk3 = math.sqrt(sk1 * sk2)
        shapes = [(sk1, sk1), (sk3, sk3)]
        for ratio in spec.aspect_ratios[k]:
            w, h = sk1 * math.sqrt(ratio), sk1 / math.sqrt(ratio)
            shapes += [(w, h), (h, w)]
        for w, h in shapes:
            for i, j in itertools.product(range(size), repeat=2):
                boxes.append(((j + 0.5) / fk, (i + 0.5) / fk, w, h))
    return torch.tensor(boxes, dtype=torch.float32).clamp(0, 1)


class BoxCoder:
    """Encodes matched boxes against default boxes and decodes predictions (the reference's
    scale_xy = 0.1, scale_wh = 0.2)."""

    def __init__(self, spec: DefaultBoxSpec, device: torch.device | str = "cpu") -> None:
        self.dboxes = default_boxes(spec).to(device)  # cxcywh
        self.dboxes_xyxy = box_convert(self.dboxes, "cxcywh", "xyxy")
        self.scale_xy, self.scale_wh = spec.scale_xy, spec.scale_wh

    def to(self, device: torch.device) -> BoxCoder:
        self.dboxes, self.dboxes_xyxy = self.dboxes.to(device), self.dboxes_xyxy.to(device)
        return self

    def match(self, boxes: torch.Tensor, labels: torch.Tensor, threshold: float = 0.5
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's ground truth ([n, 4] xyxy in [0, 1]) assigned to the default boxes: each box's
        best default box, and every default box whose IoU exceeds `threshold`. Returns ([A, 4] cxcywh
        targets — the default box itself where unmatched —, [A] labels, 0 = background)."""
        if boxes.numel() == 0:
            return self.dboxes.clone(), torch.zeros(self.dboxes.shape[0], dtype=torch.long, device=boxes.device)
        ious = box_iou(boxes, self.dboxes_xyxy)  # [n, A]
        best_iou, best_gt = ious.max(dim=0)
        best_default = ious.argmax(dim=1)  # each ground-truth box keeps its best default box
        best_iou[best_default] = 2.0
        best_gt[best_default] = torch.arange(boxes.shape[0], device=boxes.device)
        matched = best_iou > threshold
        target_labels = torch.where(matched, labels[best_gt], torch.zeros_like(best_gt))
        targets = torch.where(matched.unsqueeze(1), box_convert(boxes[best_gt], "xyxy", "cxcywh"), self.dboxes)
        return targets, target_labels

    def match_batch(self, boxes: list[torch.Tensor], labels: list[torch.Tensor], threshold: float = 0.5
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`match` for a whole batch at once (ground truth padded to the longest): a few tensor ops
        instead of a loop of small ones per image. Returns ([N, A, 4] cxcywh, [N, A] labels)."""
        n = len(boxes)
        longest = max((b.shape[0] for b in boxes), default=0)
        device = self.dboxes.device
        if longest == 0:
            return self.dboxes.expand(n, -1, -1).clone(), torch.zeros(n, self.dboxes.shape[0], dtype=torch.long,
                                                                      device=device)
        gt = torch.zeros(n, longest, 4, device=device)
        gt_labels = torch.zeros(n, longest, dtype=torch.long, device=device)
        valid = torch.zeros(n, longest, dtype=torch.bool, device=device)
        for i, (b, lab) in enumerate(zip(boxes, labels, strict=True)):
            gt[i, :b.shape[0]], gt_labels[i, :b.shape[0]], valid[i, :b.shape[0]] = b, lab, True
        d = self.dboxes_xyxy
        lt = torch.maximum(gt[:, :, None, :2], d[None, None, :, :2])
        rb = torch.minimum(gt[:, :, None, 2:], d[None, None, :, 2:])
        inter = (rb - lt).clamp(min=0).prod(dim=-1)  # [N, n, A]
        area_gt = (gt[..., 2:] - gt[..., :2]).prod(dim=-1)
        area_d = (d[:, 2:] - d[:, :2]).prod(dim=-1)
        ious = inter / (area_gt[:, :, None] + area_d[None, None, :] - inter).clamp(min=1e-12)
        ious = ious.masked_fill(~valid[:, :, None], -1.0)
        best_iou, best_gt = ious.max(dim=1)  # [N, A]
        best_default = ious.argmax(dim=2)  # [N, n]: each ground-truth box keeps its best default box
        # Each real box claims its best default box: the claim is the box's index + 1 (0: padding, no
        # claim), and of several boxes that claim one default box the last wins, as in the reference's
        # in-order assignment. A scatter, not a boolean-mask index (which would wait for the device).
        claim = torch.arange(1, longest + 1, device=device)[None, :] * valid
        claimed = torch.zeros_like(best_gt).scatter_reduce_(1, best_default, claim, reduce="amax")
        best_iou = torch.where(claimed > 0, 2.0, best_iou)
        best_gt = torch.where(claimed > 0, claimed - 1, best_gt)
        matched = best_iou > threshold
        picked = torch.gather(gt, 1, best_gt[..., None].expand(-1, -1, 4))
        target_labels = torch.where(matched, torch.gather(gt_labels, 1, best_gt), torch.zeros_like(best_gt))
        targets = torch.where(matched[..., None], box_convert(picked, "xyxy", "cxcywh"), self.dboxes)
        return targets, target_labels

    def encode(self, targets: torch.Tensor) -> torch.Tensor:
        """[N, A, 4] cxcywh -> [N, 4, A] regression targets."""
        d = self.dboxes
        xy = (targets[..., :2] - d[:, :2]) / (self.scale_xy * d[:, 2:])
        wh = torch.log(targets[..., 2:] / d[:, 2:]) / self.scale_wh
        return torch.cat([xy, wh], dim=-1).transpose(1, 2)

    def decode(self, loc: torch.Tensor) -> torch.Tensor:
        """[N, 4, A] predictions -> [N, A, 4] xyxy boxes in [0, 1] (not clamped)."""
        loc = loc.transpose(1, 2).float()
        d = self.dboxes
        xy = loc[..., :2] * self.scale_xy * d[:, 2:] + d[:, :2]
        wh = torch.exp(loc[..., 2:] * self.scale_wh) * d[:, 2:]
        return box_convert(torch.cat([xy, wh], dim=-1), "cxcywh", "xyxy")


def ssd_loss(loc: torch.Tensor, conf: torch.Tensor, target_loc: torch.Tensor, target_labels: torch.Tensor,
             negatives_per_positive: int = 3) -> torch.Tensor:
    """The reference loss: Smooth-L1 on the positives' encoded boxes plus cross-entropy on the
    positives and on the hardest negatives (the `negatives_per_positive` x positives background
    boxes with the highest loss), per image divided by its positives; images without any positive
    count 0; mean over the batch."""
    positive = target_labels > 0
    num_pos = positive.sum(dim=1)
    box = F.smooth_l1_loss(loc.float(), target_loc, reduction="none").sum(dim=1)
    box = (box * positive).sum(dim=1)
    ce = F.cross_entropy(conf.float(), target_labels, reduction="none")  # [N, A]
    negative_ce = ce.masked_fill(positive, 0.0)
    rank = negative_ce.argsort(dim=1, descending=True).argsort(dim=1)
    hard = rank < (negatives_per_positive * num_pos).clamp(max=positive.shape[1]).unsqueeze(1)
    cls = (ce * (positive | hard)).sum(dim=1)
    has_pos = (num_pos > 0).float()
    return ((box + cls) * has_pos / num_pos.float().clamp(min=1e-6)).mean()


def postprocess(coder: BoxCoder, loc: torch.Tensor, conf: torch.Tensor, score_threshold: float = 0.05,
                nms_iou: float = 0.5, per_class: int = 200, max_detections: int = 200
                ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per image (boxes [k, 4] xyxy in [0, 1], scores [k], labels [k] >= 1): softmax scores, per class
    the `per_class` best above `score_threshold`, class-wise NMS, the `max_detections` best overall."""
    boxes = coder.decode(loc).clamp(0, 1)
    scores = F.softmax(conf.float(), dim=1)  # [N, C, A]
    out = []
    for b in range(loc.shape[0]):
        s = scores[b, 1:]  # no background
        k = min(per_class, s.shape[1])
        top_scores, top_idx = s.topk(k, dim=1)  # [C-1, k]
        keep = top_scores > score_threshold
        cls = torch.arange(1, s.shape[0] + 1, device=s.device).unsqueeze(1).expand_as(top_idx)[keep]
        cand_scores, cand_boxes = top_scores[keep], boxes[b][top_idx[keep]]
        chosen = batched_nms(cand_boxes, cand_scores, cls, nms_iou)[:max_detections]
        out.append((cand_boxes[chosen], cand_scores[chosen], cls[chosen]))
    return out


class SSDHead(nn.Module):
    """3x3 convolutions per feature map to 4 box values and C class logits per default box."""

    def __init__(self, channels: Sequence[int], boxes_per_location: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.loc = nn.ModuleList(nn.Conv2d(c, n * 4, 3, padding=1) for c, n in zip(channels, boxes_per_location,
                                                                                  strict=True))
        self.conf = nn.ModuleList(nn.Conv2d(c, n * num_classes, 3, padding=1)
                                  for c, n in zip(channels, boxes_per_location, strict=True))

    def forward(self, features: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        n = features[0].shape[0]
        locs = [head(f).reshape(n, 4, -1) for f, head in zip(features, self.loc, strict=True)]
        confs = [head(f).reshape(n, self.num_classes, -1) for f, head in zip(features, self.conf, strict=True)]
        return torch.cat(locs, 2), torch.cat(confs, 2)


def _extra(in_channels: int, mid: int, out_channels: int, stride: int, padding: int, norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_channels, mid, 1, bias=not norm)]
    if norm:
        layers.append(nn.BatchNorm2d(mid))
    layers += [nn.ReLU(inplace=True), nn.Conv2d(mid, out_channels, 3, stride=stride, padding=padding, bias=not norm)]
    if norm:
        layers.append(nn.BatchNorm2d(out_channels))
    layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class SSD(nn.Module):
    """A trunk giving the first feature map, extra blocks giving the others, and the head."""

    def __init__(self, trunk: nn.Module, extras: nn.ModuleList, channels: Sequence[int], spec: DefaultBoxSpec,
                 num_classes: int) -> None:
        super().__init__()
        self.trunk, self.extras = trunk, extras
        self.head = SSDHead(channels, spec.boxes_per_location, num_classes)
        for module in [*self.extras, *self.head.loc, *self.head.conf]:
            for param in module.parameters():
                if param.dim() > 1:
                    nn.init.xavier_uniform_(param)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(images)
        features = [x]
        for block in self.extras:
            x = block(x)
            features.append(x)
        return self.head(features)


def resnet34_trunk(weights: dict | None = None) -> nn.Module:
    """torchvision's ResNet-34 to conv4_x (layer3), its first block's stride set to 1: 38x38x256 for a
    300x300 input. `weights`: an ImageNet state dict for torchvision's resnet34, or None."""
    from torchvision.models import resnet34

    net = resnet34()
    if weights is not None:
        net.load_state_dict(weights)
    block = net.layer3[0]
    block.conv1.stride = (1, 1)
    block.downsample[0].stride = (1, 1)
    return nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3)


def ssd300(num_classes: int, trunk_weights: dict | None = None) -> SSD:
    """The MLPerf SSD300: ResNet-34 trunk and the reference's extra layers (1x1 then 3x3, bias, ReLU;
    the last two 3x3 unpadded): 38x38x256, 19x19x512, 10x10x512, 5x5x256, 3x3x256, 1x1x256."""
    channels = (256, 512, 512, 256, 256, 256)
    mids = (256, 256, 128, 128, 128)
    extras = nn.ModuleList(
        _extra(channels[i], mids[i], channels[i + 1], stride=2 if i < 3 else 1, padding=1 if i < 3 else 0, norm=False)
        for i in range(5))
    return SSD(resnet34_trunk(trunk_weights), extras, channels, SSD300_BOXES, num_classes)


def mini_ssd(num_classes: int, spec: DefaultBoxSpec, width: int = 32) -> SSD:
    """A small SSD for 64x64 images: a BatchNorm conv trunk to 8x8, extras to 4x4, 2x2 and 1x1."""

    def conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]

    w = width
    trunk = nn.Sequential(*conv(3, w, 2), *conv(w, w, 1), *conv(w, 2 * w, 2), *conv(2 * w, 2 * w, 1),
                          *conv(2 * w, 4 * w, 2), *conv(4 * w, 4 * w, 1))
    channels = (4 * w, 4 * w, 2 * w, 2 * w)
    extras = nn.ModuleList(_extra(channels[i], channels[i + 1] // 2, channels[i + 1], stride=2, padding=1, norm=True)
                           for i in range(len(channels) - 1))
    return SSD(trunk, extras, channels, spec, num_classes)
