"""What one Mask R-CNN evaluation costs on this machine, on synthetic COCO-sized data: on the training
processes, turning each image's 28x28 mask probabilities into what travels to the scoring process
(float16 arrays: their bytes and pickling time); in the scoring process, pasting them into their boxes
at full resolution, encoding them as COCO RLE (pycocotools), and COCOeval's `bbox` and `segm` passes.

    python benchmarks/mask_scoring.py                       # 5,000 images of 480 x 640, 100 detections each
    python benchmarks/mask_scoring.py --images 500 --backend faster-coco-eval
    python benchmarks/mask_scoring.py --images 500 --size 64x64  # the mini's images

Ground truth: 3-12 objects per image (COCO val2017 averages 7.3), star-shaped polygons of 80
categories. Detections (Mask R-CNN keeps at most 100 per image): for every object a jittered box
whose mask is the object's own shape drawn at 28 x 28 and blurred, the rest random boxes with blob
masks — what the network's mask head hands to postprocessing. Pasting is `masks.paste` (torchvision's
`paste_masks_in_image`, which Mask R-CNN's own postprocessing calls), thresholded at 0.5.
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
import torch
from PIL import Image, ImageDraw
from pycocotools import mask as maskutils

from trainperf.workloads.common.coco import masks as K
from trainperf.workloads.common.coco import scoring

CATEGORIES = 80


def star(rng: np.random.Generator, cx: float, cy: float, r: float) -> list[float]:
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(5, 13))))
    radii = r * rng.uniform(0.5, 1.0, angles.size)
    return [float(v) for a, q in zip(angles, radii, strict=True) for v in (cx + q * np.cos(a), cy + q * np.sin(a))]


def mask_28(polygon: list[float], box: tuple[float, float, float, float], rng: np.random.Generator) -> np.ndarray:
    """The polygon drawn in its box's 28 x 28 frame, blurred into probabilities."""
    x0, y0, x1, y1 = box
    img = Image.new("F", (28, 28))
    pts = [((x - x0) / max(x1 - x0, 1) * 28, (y - y0) / max(y1 - y0, 1) * 28)
           for x, y in zip(polygon[0::2], polygon[1::2], strict=True)]
    ImageDraw.Draw(img).polygon(pts, fill=1.0)
    m = torch.from_numpy(np.array(img, dtype=np.float32))[None, None]
    m = torch.nn.functional.avg_pool2d(m, 3, 1, 1)[0, 0].numpy()
    return np.clip(m + rng.normal(0, 0.1, m.shape), 0, 1).astype(np.float32)


def build(images: int, per_image: int, seed: int, folder: Path, height: int, width: int):
    rng = np.random.default_rng(seed)
    scale = min(height, width) / 480
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": str(c)} for c in range(1, CATEGORIES + 1)]}
    predictions = []
    for image_id in range(1, images + 1):
        gt["images"].append({"id": image_id, "file_name": f"{image_id}.jpg", "width": width, "height": height})
        boxes, scores, cats, probs = [], [], [], []
        for _ in range(int(rng.integers(3, 13))):
            r = rng.uniform(10, 120) * scale
            cx, cy = rng.uniform(r, width - r), rng.uniform(r, height - r)
            polygon, cat = star(rng, cx, cy, r), int(rng.integers(1, CATEGORIES + 1))
            xs, ys = polygon[0::2], polygon[1::2]
            box = (min(xs), min(ys), max(xs), max(ys))
            rle = K.to_rle([polygon], height, width)
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": cat,
                                      "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]], "iscrowd": 0,
                                      "area": float(maskutils.area(rle)),
                                      "segmentation": [polygon]})
            jitter = rng.normal(0, 0.05 * r, 4)
            boxes.append([box[0] + jitter[0], box[1] + jitter[1], box[2] + jitter[2], box[3] + jitter[3]])
            scores.append(rng.uniform(0.5, 1.0))
            cats.append(cat)
            probs.append(mask_28(polygon, box, rng))
        while len(boxes) < per_image:
            w, h = rng.uniform(8, 200, 2) * scale
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes.append([x, y, x + w, y + h])
            scores.append(rng.uniform(0.05, 0.6))
            cats.append(int(rng.integers(1, CATEGORIES + 1)))
            probs.append(np.clip(rng.normal(0.5, 0.3, (28, 28)), 0, 1).astype(np.float32))
        predictions.append((image_id, np.array(boxes[:per_image], np.float32), np.array(scores[:per_image]),
                            np.array(cats[:per_image]), np.stack(probs[:per_image])))
    path = folder / "instances_val.json"
    path.write_text(json.dumps(gt))
    return path, predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--per-image", type=int, default=100)
    parser.add_argument("--backend", default="pycocotools", choices=scoring.BACKENDS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="480x640", help="HEIGHTxWIDTH of the images")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    torch.set_num_threads(1)  # scoring runs in one background process beside training
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        annotation_file, predictions = build(args.images, args.per_image, args.seed, Path(tmp), height, width)
        print(f"synthetic data: {args.images} images of {height} x {width}, {args.per_image} detections each "
              f"(built in {time.perf_counter() - start:.0f} s, not counted)")
        rows, shipped, rles, per_image_s = [], [], [], []
        start = time.perf_counter()
        for _, _, _, _, probs in predictions:
            shipped.append(torch.from_numpy(probs).to(torch.float16).numpy())
        wire = pickle.dumps(shipped, protocol=pickle.HIGHEST_PROTOCOL)
        shipped = pickle.loads(wire)
        ship_s = time.perf_counter() - start
        print(f"training processes: float16 copies + pickling both ways {ship_s:.2f} s for {len(wire) / 2**20:.0f} MiB "
              f"({1000 * ship_s / args.images:.2f} ms per image)")
        flipped = total = 0
        for (_, boxes, _, _, probs), half in zip(predictions[:20], shipped, strict=False):
            exact, approx = K.paste(probs, boxes, height, width), K.paste(half, boxes, height, width)
            flipped, total = flipped + int((exact != approx).sum()), total + int(exact.sum())
        print(f"float16 instead of float32: {flipped} of {total} mask pixels flip (first 20 images)")
        for (image_id, boxes, scores, cats, _), probs in zip(predictions, shipped, strict=True):
            start = time.perf_counter()
            rles.append(K.encode(K.paste(probs, boxes, height, width)))
            per_image_s.append(time.perf_counter() - start)
            rows.append(scoring.detection_rows(image_id, boxes, scores, cats))
        encode_s = sum(per_image_s)
        print(f"scoring process: paste + RLE encode: {encode_s:.1f} s ({1000 * statistics.median(per_image_s):.1f} ms "
              f"per image, median)")
        ids = list(range(1, args.images + 1))
        start = time.perf_counter()
        box = scoring.box_ap({"detections": rows}, str(annotation_file), ids, args.backend)
        box_s = time.perf_counter() - start
        start = time.perf_counter()
        both = scoring.box_and_mask_ap({"detections": rows, "masks": rles}, str(annotation_file), ids, args.backend)
        both_s = time.perf_counter() - start
        print(f"COCOeval bbox ({args.backend}): {box_s:.1f} s (AP {box:.3f}); bbox + segm: {both_s:.1f} s "
              f"(BBOX {both['BBOX']:.3f}, SEGM {both['SEGM']:.3f}), so segm alone ~{both_s - box_s:.1f} s")
        start = time.perf_counter()
        whole = scoring.box_and_mask_ap({"detections": rows, "masks": shipped}, str(annotation_file), ids,
                                        args.backend)
        whole_s = time.perf_counter() - start
        assert whole == both, (whole, both)
        print(f"the scoring process's whole metric from the shipped probabilities: {whole_s:.1f} s")
        print(f"one evaluation's scoring off the training path: {encode_s + both_s:.1f} s")


if __name__ == "__main__":
    main()
