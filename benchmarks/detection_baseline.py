"""Trivial baselines of a detection mini dataset, for reading its calibrated target: the COCO box AP of
a detector that predicts, in every val image, each class's mean training box (score 1), and of one
that predicts the ground truth itself (the ceiling, 1.0). For Mask R-CNN, mask AP too: each
predicted box filled as its mask, for both detectors (the second is a perfect box detector with
trivial masks).

    python benchmarks/detection_baseline.py ssd
    python benchmarks/detection_baseline.py retinanet
    python benchmarks/detection_baseline.py maskrcnn
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np

from trainperf import jobs, registry
from trainperf.workloads.common.coco import data as C
from trainperf.workloads.common.coco import masks as K
from trainperf.workloads.common.coco import scoring


def _filled(boxes: np.ndarray, height: int, width: int) -> list[dict]:
    masks = np.zeros((len(boxes), height, width), np.uint8)
    for k, (x0, y0, x1, y1) in enumerate(np.round(np.asarray(boxes).reshape(-1, 4)).astype(int)):
        masks[k, max(y0, 0):y1, max(x0, 0):x1] = 1
    return K.encode(masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    args = parser.parse_args()
    workload = registry.get(args.workload)
    root = jobs.prepared_data(workload, "mini", None)  # generated and recorded on first use
    module = importlib.import_module(type(workload).__module__)
    data = getattr(module, "DATA", None)
    if data is not None and data.masks:
        train, val = data.read(root)
    else:
        layout = module.LAYOUT
        train = C.read_instances(root, layout.splits[0], layout=layout)
        val = C.read_instances(root, layout.splits[1], train.category_ids, layout=layout)
    masks = val.segmentations is not None
    boxes, labels = np.concatenate(train.boxes), np.concatenate(train.labels)
    means = {k: boxes[labels == k].mean(axis=0) for k in np.unique(labels)}
    rows, mean_masks = [], []
    for image_id, (height, width) in zip(val.image_ids, val.sizes, strict=True):
        for k, box in means.items():
            rows.append(scoring.detection_rows(image_id, box[None], np.ones(1), np.array([train.category_ids[k - 1]])))
            mean_masks.append(_filled(box[None], height, width))
    metric = scoring.metric(val.annotation_file, val.image_ids, masks=masks)
    print(f"{args.workload} mini: {len(val)} val images, {sum(len(b) for b in val.boxes)} boxes")
    name = "mask AP (box filled)" if masks else ""
    shown = metric({"detections": rows, "masks": mean_masks} if masks else {"detections": rows})
    print(f"class-mean-box detector: {_describe(shown, name)}")
    truth = [scoring.detection_rows(i, b, np.ones(len(b)), np.array(train.category_ids)[lab - 1])
             for i, b, lab in zip(val.image_ids, val.boxes, val.labels, strict=True)]
    truth_masks = [_filled(b, *hw) for b, hw in zip(val.boxes, val.sizes, strict=True)]
    shown = metric({"detections": truth, "masks": truth_masks} if masks else {"detections": truth})
    print(f"ground truth as detections: {_describe(shown, name)}")


def _describe(value: float | dict[str, float], mask_name: str) -> str:
    if isinstance(value, dict):
        return f"box AP {value['BBOX']:.4f}, {mask_name} {value['SEGM']:.4f}"
    return f"box AP {value:.4f}"


if __name__ == "__main__":
    main()
