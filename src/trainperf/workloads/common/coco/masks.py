"""COCO instance masks: checking an annotation's `segmentation`, rasterising it, and encoding predicted
masks for COCO's `segm` evaluation — all through pycocotools' RLE, the references' implementation.

A segmentation is either polygons (a list of [x0, y0, x1, y1, ...] lists; COCO uses them for
iscrowd 0) or run-length encoding ({"size": [h, w], "counts": [...] or "..."}; COCO uses it for
crowds). pycocotools reads both forms for either kind of annotation, and so does trainperf. What
pycocotools would read wrongly is refused or dropped here, never passed on:
- a polygon of fewer than 3 points is dropped (detectron2 and maskrcnn-benchmark drop them too; COCO
  2017 train has a few); pycocotools' `frPyObjects` would read a 4-number one as a box;
- a polygon with an odd count or non-finite numbers, an RLE whose size is not the image's, or whose
  runs do not add up to h x w (pycocotools' decoder writes past its buffer then): one line naming the
  annotation id;
- polygon points outside the image are clipped by the rasteriser, as in pycocotools.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.errors import TrainperfError, shown


def _rle_string_total(counts: str) -> int | None:
    """The sum of the run lengths of a compressed RLE string, or None when the string is malformed.
    pycocotools' format (maskApi.c, rleFrString): each run in 5-bit groups from '0', a continuation bit
    0x20, the last group's 0x10 bit the sign; from the fourth run on, stored as the difference with
    the run two before."""
    runs: list[int] = []
    i = 0
    while i < len(counts):
        value, shift, more = 0, 0, True
        while more:
            if i >= len(counts):
                return None
            c = ord(counts[i]) - 48
            if not 0 <= c < 64:
                return None
            value |= (c & 0x1F) << shift
            more = bool(c & 0x20)
            shift += 5
            i += 1
            if not more and c & 0x10:
                value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            return None
        runs.append(value)
    return sum(runs)


def check_segmentation(segmentation: Any, ann_id: Any, height: int, width: int, path: Path) -> Any | None:
    """An annotation's segmentation as pycocotools should read it, or None when nothing of it is left
    (every polygon had fewer than 3 points). Bad input is one line naming the annotation."""

    def fail(what: str) -> TrainperfError:
        return TrainperfError(f"{path}: annotation {ann_id}: {what}")

    if isinstance(segmentation, list):
        kept = []
        for polygon in segmentation:
            if not isinstance(polygon, list) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in polygon):
                raise fail(f"polygon {shown(str(polygon))}: expected a list of numbers")
            if len(polygon) % 2:
                raise fail(f"polygon of {len(polygon)} numbers: expected x, y pairs")
            if len(polygon) >= 6:
                kept.append([float(v) for v in polygon])
        return kept or None
    if isinstance(segmentation, dict):
        size, counts = segmentation.get("size"), segmentation.get("counts")
        if size != [height, width]:
            raise fail(f"RLE size {shown(str(size))} is not the image's [height, width] [{height}, {width}]")
        if isinstance(counts, list):
            if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
                raise fail("RLE counts: expected non-negative integers")
            total = sum(counts)
        elif isinstance(counts, str):
            total = _rle_string_total(counts)
            if total is None:
                raise fail("RLE counts: not a compressed COCO RLE string")
        else:
            raise fail(f"RLE counts {shown(str(counts))}: expected a list of runs or a compressed string")
        if total != height * width:
            raise fail(f"RLE runs cover {total} pixels, the image has {height * width}")
        return {"size": [height, width], "counts": counts}
    raise fail(f"segmentation {shown(str(segmentation))}: expected polygons or RLE")


def to_rle(segmentation: Any, height: int, width: int) -> dict[str, Any]:
    """One checked segmentation as a compressed RLE (polygons merged into one mask)."""
    from pycocotools import mask as maskutils

    if isinstance(segmentation, list):
        return maskutils.merge(maskutils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation["counts"], list):
        return maskutils.frPyObjects(segmentation, height, width)
    return {"size": segmentation["size"], "counts": segmentation["counts"].encode("ascii")}


def rasterize(segmentations: list[Any], height: int, width: int) -> np.ndarray:
    """Checked segmentations as binary masks, uint8 [n, height, width]."""
    from pycocotools import mask as maskutils

    if not segmentations:
        return np.zeros((0, height, width), dtype=np.uint8)
    rles = [to_rle(s, height, width) for s in segmentations]
    return np.ascontiguousarray(maskutils.decode(rles).transpose(2, 0, 1))


def encode(masks: np.ndarray) -> list[dict[str, Any]]:
    """Binary masks [n, h, w] as compressed RLEs with str counts (JSON- and pickle-friendly, what
    `COCO.loadRes` reads)."""
    from pycocotools import mask as maskutils

    masks = np.asarray(masks, dtype=np.uint8)
    if masks.shape[0] == 0:
        return []
    rles = maskutils.encode(np.asfortranarray(masks.transpose(1, 2, 0)))
    return [{"size": [int(r["size"][0]), int(r["size"][1])], "counts": r["counts"].decode("ascii")} for r in rles]


def paste(probabilities: np.ndarray, boxes_xyxy: np.ndarray, height: int, width: int) -> np.ndarray:
    """Predicted masks at the image's size, uint8 [k, height, width]: each MxM probability map
    (Mask R-CNN's mask head output) pasted into its box by torchvision's `paste_masks_in_image` (the
    reference Masker's method: one pixel of padding, bilinear resize) and thresholded at 0.5."""
    import torch
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    probabilities = np.asarray(probabilities, dtype=np.float32)
    if probabilities.shape[0] == 0:
        return np.zeros((0, height, width), np.uint8)
    pasted = paste_masks_in_image(torch.from_numpy(probabilities)[:, None],
                                  torch.as_tensor(np.asarray(boxes_xyxy, dtype=np.float32)), (height, width))
    return (pasted[:, 0] > 0.5).numpy().astype(np.uint8)
