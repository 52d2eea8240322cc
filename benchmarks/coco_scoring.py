"""What COCO scoring costs, and what asynchronous evaluation takes off the critical path.

    python benchmarks/coco_scoring.py --images 5000 --per-image 100 --reps 1

A synthetic val set shaped like COCO 2017's (640x480 images, ~7.3 boxes each over 80 categories) and
detections like a trained detector's (per image: jittered ground truth plus random boxes, `--per-image`
in all). Times, per backend: the AP itself (ground truth already loaded, as from the second evaluation
on), and what an asynchronous evaluation still pays in the training process: pickling the detections
for the worker process.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from trainperf.workloads.common.coco import scoring


def synthetic(images: int, per_image: int, seed: int = 0) -> tuple[dict, list[tuple[float, ...]]]:
    rng = np.random.default_rng(seed)
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": str(c)} for c in range(1, 81)]}
    rows: list[tuple[float, ...]] = []
    ann = 1
    for i in range(1, images + 1):
        gt["images"].append({"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480})
        for _ in range(int(rng.poisson(7.3))):
            w, h = rng.uniform(10, 300, 2)
            x, y = rng.uniform(0, 640 - w), rng.uniform(0, 480 - h)
            cat = int(rng.integers(1, 81))
            gt["annotations"].append({"id": ann, "image_id": i, "category_id": cat, "bbox": [x, y, w, h],
                                      "area": w * h, "iscrowd": 0})
            ann += 1
            if len(rows) < i * per_image:
                dx, dy = rng.normal(0, 0.1 * w), rng.normal(0, 0.1 * h)
                rows.append((i, x + dx, y + dy, w, h, float(rng.uniform(0.3, 1)), cat))
        while len(rows) < i * per_image:
            w, h = rng.uniform(10, 200, 2)
            rows.append((i, float(rng.uniform(0, 440)), float(rng.uniform(0, 280)), w, h, float(rng.uniform(0.05, 0.5)),
                         int(rng.integers(1, 81))))
    return gt, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--per-image", type=int, default=100)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    gt, rows = synthetic(args.images, args.per_image)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instances_val.json"
        path.write_text(json.dumps(gt))
        ids = [img["id"] for img in gt["images"]]
        print(f"{args.images} images, {len(gt['annotations'])} boxes, {len(rows)} detections")
        table = np.array(rows)  # generated in image order: split where the image id changes
        per_image = np.split(table, np.flatnonzero(np.diff(table[:, 0])) + 1)
        for name, payload in (("Python tuples", rows), ("one array per image (trainperf)", per_image)):
            t = time.perf_counter()
            blob = pickle.dumps({"detections": payload})
            print(f"pickling the detections as {name} for the worker process: {time.perf_counter() - t:.3f} s "
                  f"({len(blob) / 2**20:.0f} MiB)")
        for backend in scoring.BACKENDS:
            scoring.box_ap({"detections": per_image[:2]}, str(path), ids, backend)  # ground truth loaded once
            times, ap = [], 0.0
            for _ in range(args.reps):
                t = time.perf_counter()
                ap = scoring.box_ap({"detections": per_image}, str(path), ids, backend)
                times.append(time.perf_counter() - t)
            print(f"{backend:>17}: AP {ap:.4f} in {statistics.median(times):.2f} s (median of {args.reps})")


if __name__ == "__main__":
    main()
