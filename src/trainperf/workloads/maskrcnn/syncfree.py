"""Mask R-CNN's training pass without a host-device synchronisation: the RPN's proposals, the samplers,
the multi-level RoI pooling and the three heads' losses in shapes fixed by the configuration, never by
the data, as NVIDIA's MLPerf Mask R-CNN does to capture its step in CUDA Graphs.

torchvision selects by data-dependent shapes 45 times a step (at the reference's batch of 2 per
accelerator): removing small and low-scoring proposals, NMS, keeping positives for the mask head, the
balanced samplers (`torch.where(labels >= 1)` then randperm), the low-quality matches, RoIAlign's
per-level selection, and the box loss's positives. Here each becomes a mask over a fixed set:
- proposals: top-k per level (as torchvision), then a fixed-output NMS (`fixed_nms`) marking what it
  keeps, then top-k of the kept over all levels; slots left over are padding marked invalid;
- sampling: the samplers' uniform choice as the top-k of random scores masked to the eligible (the same
  distribution as randperm's first k), giving a fixed number of slots with a validity mask;
- RoI pooling: one RoIAlign over the levels stacked into one batch (`pool_levels`), each RoI sent to its
  level by its batch index, instead of selecting each level's RoIs;
- losses: sums over the slots, masked, divided by the same counts as torchvision's.
With sampling that takes every candidate and NMS given enough iterations, the losses equal torchvision's
(tests/workloads/test_maskrcnn.py). Evaluation is torchvision's: its syncs are outside the timed step.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork, concat_box_prediction_layers
from torchvision.ops import MultiScaleRoIAlign, roi_align

from trainperf.workloads.common.coco import matching

# A suppression chain (A suppresses B, which, kept, would have suppressed C...) longer than this is cut
# short: see fixed_nms. The RPN's proposals rarely chain beyond a handful.
NMS_ITERATIONS = 15


def fixed_nms(boxes: torch.Tensor, valid: torch.Tensor, threshold: float, iterations: int = NMS_ITERATIONS
              ) -> torch.Tensor:
    """Greedy NMS over boxes [B, K, 4] already sorted by descending score, as a mask [B, K] of the boxes
    kept (invalid ones never kept, never suppressing).

    Greedy NMS keeps a box when no kept box before it overlaps it by more than `threshold`: the fixed point
    of keep = valid & not any(earlier kept overlapping). Iterating from "all valid" alternates between
    supersets and subsets of the answer, each box settling once every box in its chain of suppressors
    has: `iterations` (odd: a subset, so no two kept boxes overlap) give torchvision's result exactly when
    no chain is longer, and otherwise keep fewer boxes, never an overlapping pair. Each iteration is one
    batched matrix-vector product: a fixed amount of work, no read-back."""
    iou = matching.batched_box_iou(boxes, boxes)
    count = boxes.shape[1]
    earlier = torch.ones(count, count, dtype=torch.bool, device=boxes.device).tril(-1)  # [i, j]: j before i
    suppresses = ((iou > threshold) & earlier & valid[:, None, :]).to(boxes.dtype)  # [B, i, j]
    keep = valid
    for _ in range(iterations | 1):
        hit = torch.bmm(suppresses, keep.to(boxes.dtype)[..., None])[..., 0]
        keep = valid & (hit == 0)
    return keep


def balanced_sample(labels: torch.Tensor, per_image: int, positive_fraction: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchvision's BalancedPositiveNegativeSampler over labels [B, N] (1 positive, 0 negative, -1
    ignored), at fixed shapes: up to per_image x positive_fraction positives chosen uniformly, then
    negatives to fill per_image. Returns the positive and negative masks [B, N], and the positive
    slots: indices [B, P] and whether each holds a sampled positive [B, P] (P = the positive quota)."""
    batch, count = labels.shape
    noise = torch.rand(labels.shape, device=labels.device)
    quota = min(int(per_image * positive_fraction), count)
    top = torch.where(labels == 1, noise, -1.0).topk(quota, dim=1)
    pos_slots, pos_taken = top.indices, top.values >= 0
    positive = torch.zeros_like(labels, dtype=torch.bool).scatter_(1, pos_slots, pos_taken)
    wanted = per_image - pos_taken.sum(1, keepdim=True)  # negatives fill what the positives leave
    top = torch.where(labels == 0, noise, -1.0).topk(min(per_image, count), dim=1)
    rank = torch.arange(top.indices.shape[1], device=labels.device)
    negative = torch.zeros_like(positive).scatter_(1, top.indices, (top.values >= 0) & (rank < wanted))
    return positive, negative, pos_slots, pos_taken


def clip_to_images(boxes: torch.Tensor, sizes: torch.Tensor | list[tuple[int, int]]) -> torch.Tensor:
    """Boxes [B, K, 4] clipped to each image's (height, width): a tensor [B, 2] (a compiled step, whose
    sizes must not be constants) or Python pairs (an eager step: no tensor built from host data)."""
    if isinstance(sizes, torch.Tensor):
        high = sizes.flip(-1).repeat(1, 2)[:, None, :].to(boxes.dtype)  # [B, 1, 4]: w, h, w, h
        return torch.minimum(boxes.clamp(min=0), high)
    return torch.stack([torch.stack([b[:, 0].clamp(0, w), b[:, 1].clamp(0, h), b[:, 2].clamp(0, w),
                                     b[:, 3].clamp(0, h)], dim=1) for b, (h, w) in zip(boxes, sizes, strict=True)])


def pool_levels(pooler: MultiScaleRoIAlign, features: dict[str, torch.Tensor], rois: torch.Tensor,
                padded_size: tuple[int, int]) -> torch.Tensor:
    """MultiScaleRoIAlign of rois [B, R, 4] -> [B*R, C, S, S] in one RoIAlign, without selecting each level's
    RoIs (a data-dependent shape per level): the levels stacked into one batch, each padded to the finest
    level's size by repeating its last row and column, and each RoI sent to its level (torchvision's
    LevelMapper) by its batch index, its box scaled by the level's scale (a power of two: exact).

    The same values and gradients as torchvision's: RoIs lie inside the image, so RoIAlign never samples
    beyond a level's last row or column, and between the last and the padding it clamps to the last, as
    the repeated row gives (whose gradient the padding's backward sums back into the last row)."""
    x = [features[name] for name in pooler.featmap_names]
    batch, count = rois.shape[:2]
    flat = rois.reshape(-1, 4)
    image = torch.arange(batch, device=rois.device).repeat_interleave(count)
    if len(x) == 1:
        scale = 2.0 ** round(math.log2(x[0].shape[-2] / padded_size[0]))
        return roi_align(x[0], torch.cat([image[:, None].to(flat.dtype), flat], dim=1), pooler.output_size, scale,
                         pooler.sampling_ratio)
    k_min = -round(math.log2(x[0].shape[-2] / padded_size[0]))  # the finest level's: P2 is 2 ** -2
    k_max = k_min + len(x) - 1
    area = (flat[:, 2] - flat[:, 0]) * (flat[:, 3] - flat[:, 1])
    level = torch.floor(pooler.canonical_level + torch.log2(area.sqrt() / pooler.canonical_scale) + 1e-6)
    level = (level.clamp(min=k_min, max=k_max) - k_min).to(torch.int64)
    high, wide = x[0].shape[-2:]
    stacked = torch.cat([_repeat_edges(f, high, wide) for f in x])  # [L*B, C, H, W]: level l at l*B..l*B+B-1
    scaled = torch.ldexp(flat, -(level + k_min)[:, None])
    boxes = torch.cat([(level * batch + image)[:, None].to(flat.dtype), scaled], dim=1)
    return roi_align(stacked, boxes, pooler.output_size, 1.0, pooler.sampling_ratio)


def _repeat_edges(feature: torch.Tensor, high: int, wide: int) -> torch.Tensor:
    """`feature` [N, C, h, w] padded to [N, C, high, wide] by repeating its last row and column (F.pad's
    "replicate", whose backward Inductor mis-strides in torch 2.14: concatenation and expand instead)."""
    rows, cols = high - feature.shape[-2], wide - feature.shape[-1]
    if rows:
        feature = torch.cat([feature, feature[..., -1:, :].expand(*feature.shape[:-2], rows, feature.shape[-1])], -2)
    if cols:
        feature = torch.cat([feature, feature[..., -1:].expand(*feature.shape[:-1], cols)], -1)
    return feature


class SyncFreeRPN(RegionProposalNetwork):
    """torchvision's RPN whose training pass returns a fixed number of proposals per image ([B, P, 4] and a
    validity mask) and its losses from fixed-shape sampling. Evaluation is torchvision's."""

    nms_iterations: int = NMS_ITERATIONS

    def training_pass(self, images: ImageList, features: dict[str, torch.Tensor], sizes: torch.Tensor | list,
                      gt: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        levels = list(features.values())
        objectness, deltas = self.head(levels)
        anchors = self.anchor_generator(images, levels)
        batch = len(anchors)
        per_level = [o[0].numel() for o in objectness]
        objectness, deltas = concat_box_prediction_layers(objectness, deltas)
        proposals = self.box_coder.decode(deltas.detach(), anchors).view(batch, -1, 4)
        boxes, valid = self.fixed_proposals(proposals, objectness.detach().view(batch, -1), sizes, per_level)
        loss_objectness, loss_box = self.padded_loss(torch.stack(anchors), objectness.view(batch, -1),
                                                     deltas.view(batch, -1, 4), gt)
        return boxes, valid, {"loss_objectness": loss_objectness, "loss_rpn_box_reg": loss_box}

    def fixed_proposals(self, proposals: torch.Tensor, objectness: torch.Tensor, sizes: torch.Tensor | list,
                        per_level: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """torchvision's filter_proposals at fixed shapes: per level the top pre_nms_top_n by objectness,
        clipped, small and low-scoring boxes marked invalid, NMS per level; then the post_nms_top_n best
        kept over all levels (in torchvision's order: by score), padding slots invalid."""
        kept_boxes, kept_scores = [], []
        offset = 0
        for count in per_level:
            scores, index = objectness[:, offset:offset + count].topk(min(self.pre_nms_top_n(), count), dim=1)
            index = index + offset
            offset += count
            boxes = clip_to_images(proposals.gather(1, index[..., None].expand(-1, -1, 4)), sizes)
            probability = torch.sigmoid(scores)
            wide, high = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
            valid = (wide >= self.min_size) & (high >= self.min_size) & (probability >= self.score_thresh)
            keep = fixed_nms(boxes, valid, self.nms_thresh, self.nms_iterations)
            kept_boxes.append(boxes)
            kept_scores.append(torch.where(keep, probability, -1.0))
        scores = torch.cat(kept_scores, dim=1)
        best = scores.topk(min(self.post_nms_top_n(), scores.shape[1]), dim=1)
        boxes = torch.cat(kept_boxes, dim=1).gather(1, best.indices[..., None].expand(-1, -1, 4))
        valid = best.values >= 0
        # A padding slot's box may be anything, NaN included (a diverging model's deltas): RoIAlign would
        # read outside the feature map. torchvision's filters drop such boxes; here they become zeros.
        return torch.where(valid[..., None], boxes, 0.0), valid

    def padded_loss(self, anchors: torch.Tensor, objectness: torch.Tensor, deltas: torch.Tensor,
                    gt: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """torchvision's assign_targets_to_anchors and compute_loss over every anchor [B, A], the samples
        as masks: the objectness loss is the mean over the sampled anchors, the box loss the positives'
        smooth L1 over the same count."""
        matches = matching.match(self.proposal_matcher, gt["boxes"], gt["present"], anchors)
        labels = torch.where(matches >= 0, 1, torch.where(matches == self.proposal_matcher.BELOW_LOW_THRESHOLD, 0, -1))
        positive, negative, _, _ = balanced_sample(labels, self.fg_bg_sampler.batch_size_per_image,
                                                   self.fg_bg_sampler.positive_fraction)
        sampled = positive | negative
        count = sampled.sum().clamp(min=1).to(deltas.dtype)
        bce = F.binary_cross_entropy_with_logits(objectness, (labels == 1).to(objectness.dtype), reduction="none")
        loss_objectness = torch.where(sampled, bce, 0.0).sum() / count
        matched = matching.matched_boxes(gt["boxes"], matches, anchors)
        wanted = self.box_coder.encode_single(matched.reshape(-1, 4), anchors.reshape(-1, 4)).view_as(deltas)
        smooth = F.smooth_l1_loss(deltas, wanted, beta=1 / 9, reduction="none").sum(-1)
        return loss_objectness, torch.where(positive, smooth, 0.0).sum() / count


class SyncFreeRoIHeads(RoIHeads):
    """torchvision's RoI heads whose training pass samples a fixed number of RoIs per image from the
    padded proposals and ground truth, and runs the mask head on a fixed number of positive slots.
    Evaluation is torchvision's."""

    def training_pass(self, features: dict[str, torch.Tensor], proposals: torch.Tensor, valid: torch.Tensor,
                      padded_size: tuple[int, int], gt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        boxes, present = gt["boxes"].to(proposals.dtype), gt["present"]
        candidates = torch.cat([proposals, boxes], dim=1)  # torchvision's add_gt_proposals
        eligible = torch.cat([valid, present], dim=1)
        matches = matching.match(self.proposal_matcher, boxes, present, candidates)
        gt_labels = (gt["labels"].gather(1, matches.clamp(min=0)) if boxes.shape[1]
                     else torch.zeros_like(matches))
        labels = torch.where(matches >= 0, gt_labels, 0)
        labels = torch.where((matches == self.proposal_matcher.BETWEEN_THRESHOLDS) | ~eligible, -1, labels)
        sampler = self.fg_bg_sampler
        positive, negative, pos_slots, pos_taken = balanced_sample(torch.where(labels > 0, 1, labels),
                                                                   sampler.batch_size_per_image,
                                                                   sampler.positive_fraction)
        # The sampled RoIs in a fixed number of slots: the sampled first, then padding (never more sampled
        # than slots: the sampler takes at most batch_size_per_image).
        sampled = positive | negative
        slots = sampled.to(proposals.dtype).topk(min(sampler.batch_size_per_image, sampled.shape[1]), dim=1).indices
        taken = sampled.gather(1, slots)
        rois = candidates.gather(1, slots[..., None].expand(-1, -1, 4))
        roi_labels = torch.where(taken, labels.gather(1, slots), 0)
        count = taken.sum().clamp(min=1).to(proposals.dtype)

        pooled = pool_levels(self.box_roi_pool, features, rois, padded_size)
        class_logits, box_regression = self.box_predictor(self.box_head(pooled))
        ce = F.cross_entropy(class_logits, roi_labels.reshape(-1), reduction="none")
        loss_classifier = torch.where(taken.reshape(-1), ce, 0.0).sum() / count
        matched = matching.matched_boxes(boxes, matches, candidates).gather(1, slots[..., None].expand(-1, -1, 4))
        wanted = self.box_coder.encode_single(matched.reshape(-1, 4), rois.reshape(-1, 4))
        chosen = box_regression.reshape(len(wanted), -1, 4).gather(
            1, roi_labels.reshape(-1, 1, 1).expand(-1, 1, 4))[:, 0]
        smooth = F.smooth_l1_loss(chosen, torch.where(torch.isfinite(wanted), wanted, 0.0), beta=1 / 9,
                                  reduction="none").sum(-1)
        positive_slot = (taken & (roi_labels > 0)).reshape(-1)
        loss_box = torch.where(positive_slot, smooth, 0.0).sum() / count
        losses = {"loss_classifier": loss_classifier, "loss_box_reg": loss_box}
        if self.has_mask():
            losses["loss_mask"] = self._mask_loss(features, candidates, matches, labels, pos_slots, pos_taken,
                                                  padded_size, gt)
        return losses

    def _mask_loss(self, features: dict[str, torch.Tensor], candidates: torch.Tensor, matches: torch.Tensor,
                   labels: torch.Tensor, slots: torch.Tensor, taken: torch.Tensor, padded_size: tuple[int, int],
                   gt: dict[str, torch.Tensor]) -> torch.Tensor:
        """torchvision's maskrcnn_loss over the positive slots: each positive RoI's predicted mask for its
        class against its box's ground-truth mask cropped and resized by RoIAlign, the mean binary cross
        entropy over the positives' pixels."""
        rois = candidates.gather(1, slots[..., None].expand(-1, -1, 4))
        pooled = pool_levels(self.mask_roi_pool, features, rois, padded_size)
        logits = self.mask_predictor(self.mask_head(pooled))  # [B*P, C, M, M]
        size = logits.shape[-1]
        roi_labels = torch.where(taken, labels.gather(1, slots), 0).reshape(-1)
        chosen = logits.gather(1, roi_labels.view(-1, 1, 1, 1).expand(-1, 1, size, size))[:, 0]
        masks = gt["masks"]  # [B, G, H, W]
        batch, boxes_per_image = masks.shape[:2]
        if boxes_per_image == 0:
            return chosen.sum() * 0
        which = matches.gather(1, slots).clamp(min=0) + boxes_per_image * torch.arange(
            batch, device=slots.device)[:, None]
        crop = torch.cat([which.reshape(-1, 1).to(rois.dtype), rois.reshape(-1, 4)], dim=1)
        wanted = roi_align(masks.reshape(-1, 1, *masks.shape[-2:]).to(rois.dtype), crop, (size, size), 1.0)[:, 0]
        bce = F.binary_cross_entropy_with_logits(chosen, wanted, reduction="none").sum((1, 2))
        positives = taken.reshape(-1)
        return torch.where(positives, bce, 0.0).sum() / (positives.sum().clamp(min=1) * size * size).to(bce.dtype)


def sync_free(model: nn.Module, nms_iterations: int = NMS_ITERATIONS) -> nn.Module:
    """`model` (torchvision's Mask R-CNN or Faster R-CNN) with the sync-free training heads: the same
    modules and parameters, only the classes change."""
    model.rpn.__class__ = SyncFreeRPN
    model.rpn.nms_iterations = nms_iterations
    model.roi_heads.__class__ = SyncFreeRoIHeads
    return model

