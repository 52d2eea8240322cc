"""Matching boxes to anchors or proposals for a whole batch at once, in shapes that do not depend on the
data: each image's ground-truth boxes padded to G, `present` marking the real ones. torchvision matches
one image at a time and finds its low-quality matches with `torch.where` (a host-device synchronisation
and a data-dependent shape); here every step is a fixed-shape tensor operation, with the same result."""

from __future__ import annotations

import torch
from torchvision.models.detection._utils import Matcher


def batched_box_iou(boxes: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """torchvision's box_iou per image: boxes [B, G, 4] against candidates [B, N, 4] -> [B, G, N] (the same
    operations in the same order, so ties between IoUs are the ties torchvision sees)."""
    area_b = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    area_c = (candidates[..., 2] - candidates[..., 0]) * (candidates[..., 3] - candidates[..., 1])
    lt = torch.maximum(boxes[:, :, None, :2], candidates[:, None, :, :2])
    rb = torch.minimum(boxes[:, :, None, 2:], candidates[:, None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area_b[:, :, None] + area_c[:, None, :] - inter)


def match(matcher: Matcher, boxes: torch.Tensor, present: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """torchvision's `Matcher` for every image at once: per candidate [B, N] the index of its best box, -1
    (BELOW_LOW_THRESHOLD) below the low threshold, -2 (BETWEEN_THRESHOLDS) between the thresholds, then
    (allow_low_quality_matches) every candidate tying a box's best IoU given back its best box. Images
    without boxes (G == 0, or none present) match nothing."""
    batch, count = candidates.shape[:2]
    if boxes.shape[1] == 0:
        return torch.full((batch, count), matcher.BELOW_LOW_THRESHOLD, dtype=torch.int64, device=candidates.device)
    iou = batched_box_iou(boxes, candidates).masked_fill(~present[..., None], -1.0)  # padding never matches
    best, matches = iou.max(dim=1)  # [B, N]
    best_matches = matches.clone()
    matches = matches.masked_fill(best < matcher.low_threshold, matcher.BELOW_LOW_THRESHOLD)
    between = (best >= matcher.low_threshold) & (best < matcher.high_threshold)
    matches = matches.masked_fill(between, matcher.BETWEEN_THRESHOLDS)
    if matcher.allow_low_quality_matches:
        best_per_box = iou.max(dim=2, keepdim=True).values  # [B, G, 1]
        ties = ((iou == best_per_box) & present[..., None]).any(dim=1)
        matches = torch.where(ties, best_matches, matches)
    return matches


def matched_boxes(boxes: torch.Tensor, matches: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Each candidate's matched box [B, N, 4]; an unmatched candidate gets itself (a finite regression
    target, masked out later: a padding box of zeros would give log(0))."""
    if boxes.shape[1] == 0:
        return candidates
    matched = boxes.gather(1, matches.clamp(min=0)[..., None].expand(-1, -1, 4))
    return torch.where((matches >= 0)[..., None], matched, candidates)


def padded_targets(targets: list[dict[str, torch.Tensor]], boxes_per_image: int | None, size: tuple[int, int],
                   device: torch.device) -> dict[str, torch.Tensor]:
    """The images' targets padded to one width: boxes [B, G, 4], labels [B, G], present [B, G] and masks
    [B, G, H, W] at the padded batch's size (each image's mask at its top left, as its pixels are).
    G: `boxes_per_image`, or the batch's most."""
    width = boxes_per_image if boxes_per_image is not None else max((len(t["boxes"]) for t in targets), default=0)
    batch = len(targets)
    out = {"boxes": torch.zeros((batch, width, 4), device=device),
           "labels": torch.zeros((batch, width), dtype=torch.int64, device=device),
           "present": torch.zeros((batch, width), dtype=torch.bool, device=device)}
    with_masks = bool(targets) and "masks" in targets[0]
    if with_masks:
        out["masks"] = torch.zeros((batch, width, *size), dtype=torch.uint8, device=device)
    for i, t in enumerate(targets):
        n = len(t["boxes"])
        out["boxes"][i, :n] = t["boxes"]
        out["labels"][i, :n] = t["labels"]
        out["present"][i, :n] = True
        if with_masks:
            h, w = t["masks"].shape[-2:]
            out["masks"][i, :n, :h, :w] = t["masks"]
    return out
