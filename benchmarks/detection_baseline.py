"""Trivial baselines of a detection mini dataset, for reading its calibrated target: the COCO box AP of
a detector that predicts, in every val image, each class's mean training box (score 1), and of one
that predicts the ground truth itself (the ceiling, 1.0).

    python benchmarks/detection_baseline.py ssd
    python benchmarks/detection_baseline.py retinanet
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np

from trainperf import registry
from trainperf.workloads.coco import data as C
from trainperf.workloads.coco import scoring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    args = parser.parse_args()
    workload = registry.get(args.workload)
    root = workload.default_data_dir("mini")
    if workload.data_problems("mini", root):
        workload.prepare("mini", root, print)
    layout = importlib.import_module(type(workload).__module__).LAYOUT
    train = C.read_instances(root, layout.splits[0], layout=layout)
    val = C.read_instances(root, layout.splits[1], train.category_ids, layout=layout)
    boxes, labels = np.concatenate(train.boxes), np.concatenate(train.labels)
    means = {k: boxes[labels == k].mean(axis=0) for k in np.unique(labels)}
    rows = []
    for image_id in val.image_ids:
        for k, box in means.items():
            rows.append(scoring.detection_rows(image_id, box[None], np.ones(1), np.array([train.category_ids[k - 1]])))
    metric = scoring.metric(val.annotation_file, val.image_ids)
    print(f"{args.workload} mini: {len(val)} val images, {sum(len(b) for b in val.boxes)} boxes")
    print(f"class-mean-box detector: box AP {metric({'detections': rows}):.4f}")
    truth = [scoring.detection_rows(i, b, np.ones(len(b)), np.array(train.category_ids)[lab - 1])
             for i, b, lab in zip(val.image_ids, val.boxes, val.labels, strict=True)]
    print(f"ground truth as detections: box AP {metric({'detections': truth}):.4f}")


if __name__ == "__main__":
    main()
