"""COCO box AP, the detection workloads' metric, and mask AP (Mask R-CNN's second metric), by
pycocotools (the references' implementation).

Detections travel as float64 arrays of rows (image_id, x, y, width, height, score, category_id) in
original image pixels and COCO category ids — what `COCO.loadRes` reads —, one array per image: cheap
to gather across processes and to send to a worker process (pickling 500,000 detections as Python
tuples took 2.5 s here, as arrays a few ms). The functions are module level so that asynchronous
evaluation can score in a worker process (`host_scoring = "process"`).
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.workloads.common.coco import masks as coco_masks

BACKENDS = ("pycocotools", "faster-coco-eval")


@functools.lru_cache(maxsize=4)
def _ground_truth(annotation_file: str, backend: str) -> Any:
    """The ground truth, read once per process (it is the same file at every evaluation)."""
    with contextlib.redirect_stdout(io.StringIO()):
        if backend == "faster-coco-eval":
            from faster_coco_eval import COCO
        else:
            from pycocotools.coco import COCO
        return COCO(annotation_file)


def _evaluate(annotation_file: str, image_ids: list[int], backend: str, iou_type: str, results: Any) -> float:
    gt = _ground_truth(annotation_file, backend)
    with contextlib.redirect_stdout(io.StringIO()):
        if backend == "faster-coco-eval":
            from faster_coco_eval import COCOeval_faster as COCOeval
        else:
            from pycocotools.cocoeval import COCOeval
        evaluation = COCOeval(gt, gt.loadRes(results), iou_type)
        evaluation.params.imgIds = list(image_ids)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(max(evaluation.stats[0], 0.0))  # -1 when no ground truth exists


def _rows(totals: dict[str, Any]) -> np.ndarray:
    parts = [np.asarray(r, dtype=np.float64).reshape(-1, 7) for r in totals["detections"]]
    return np.concatenate(parts) if parts else np.zeros((0, 7))


def box_ap(totals: dict[str, Any], annotation_file: str, image_ids: list[int], backend: str = "pycocotools"
           ) -> float:
    """AP@[0.50:0.95] (COCOeval's stats[0]) of `totals["detections"]` over `image_ids`."""
    rows = _rows(totals)
    if rows.shape[0] == 0:
        return 0.0
    return _evaluate(annotation_file, image_ids, backend, "bbox", rows)


def box_and_mask_ap(totals: dict[str, Any], annotation_file: str, image_ids: list[int],
                    backend: str = "pycocotools") -> dict[str, float]:
    """{"BBOX": box AP, "SEGM": mask AP} (Mask R-CNN's two metrics, named as its MLPerf log names
    them). `totals["masks"]` holds, for each image's array of `totals["detections"]`, its masks: the
    mask head's probabilities [k, M, M] (pasted into the rows' boxes at the image's size and encoded
    here, in the scoring process) or k compressed RLEs (`masks.encode`) already at the image's size."""
    detections, masks = totals["detections"], totals["masks"]
    if len(masks) != len(detections):
        raise ValueError(f"{len(masks)} images' masks for {len(detections)} images' detections")
    parts = [np.asarray(r, dtype=np.float64).reshape(-1, 7) for r in detections]
    segm: list[dict[str, Any]] = []
    for rows, part in zip(parts, masks, strict=True):
        if len(part) != rows.shape[0]:
            raise ValueError(f"{len(part)} masks for {rows.shape[0]} detections")
        if rows.shape[0] == 0:
            continue
        if isinstance(part, np.ndarray):
            image = _ground_truth(annotation_file, backend).imgs[int(rows[0, 0])]
            boxes = rows[:, 1:5].copy()
            boxes[:, 2:] += boxes[:, :2]
            part = coco_masks.encode(coco_masks.paste(part, boxes, image["height"], image["width"]))
        segm.extend({"image_id": int(r[0]), "category_id": int(r[6]), "score": float(r[5]), "segmentation": rle}
                    for r, rle in zip(rows, part, strict=True))
    if not segm:
        return {"BBOX": 0.0, "SEGM": 0.0}
    return {"BBOX": _evaluate(annotation_file, image_ids, backend, "bbox", np.concatenate(parts)),
            "SEGM": _evaluate(annotation_file, image_ids, backend, "segm", segm)}


def metric(annotation_file: Path, image_ids: list[int], backend: str = "pycocotools", masks: bool = False
           ) -> functools.partial:
    """The EvalPartial metric for a split: picklable, so that it can run in a worker process."""
    return functools.partial(box_and_mask_ap if masks else box_ap, annotation_file=str(annotation_file),
                             image_ids=list(image_ids), backend=backend)


def detection_rows(image_id: int, boxes_xyxy: np.ndarray, scores: np.ndarray, category_ids: np.ndarray
                   ) -> np.ndarray:
    """One image's detections as COCO result rows [k, 7] (xyxy pixels -> x, y, width, height)."""
    boxes = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    rows = np.empty((boxes.shape[0], 7))
    rows[:, 0] = image_id
    rows[:, 1:3] = boxes[:, :2]
    rows[:, 3:5] = boxes[:, 2:] - boxes[:, :2]
    rows[:, 5] = scores
    rows[:, 6] = category_ids
    return rows
