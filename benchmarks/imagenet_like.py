"""An ImageNet-layout folder of JPEGs of ImageNet's typical sizes and file sizes, to measure the full
ResNet-50 input pipeline without ImageNet (`trainperf bench resnet --scale full --data DIR`): its
share of the step, decoding in the DataLoader workers against decoding on the device.

    python benchmarks/imagenet_like.py --out /tmp/imagenet-like --classes 10 --train-per-class 200
    trainperf bench resnet --scale full --data /tmp/imagenet-like --batch-size 256 --steps 30 \\
        --set num_classes=1000 --set decode=device            # nvjpeg on a GPU
    trainperf bench resnet --scale full --data /tmp/imagenet-like --batch-size 256 --steps 30  # Pillow workers

Images: ILSVRC-2012's common sizes (500x375, 375x500, 500x333, 500x500, ...), smooth random fields with
fine texture saved at quality 90: ~110 KB each, about ImageNet's mean file size. The labels mean
nothing: this measures speed, never quality.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from PIL import Image

SIZES = ((500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (500, 400), (400, 500), (640, 480))


def image(rng: np.random.Generator) -> Image.Image:
    w, h = SIZES[rng.integers(len(SIZES))]
    coarse = rng.random((h // 16 + 2, w // 16 + 2, 3)) * 255
    smooth = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((w, h), Image.BICUBIC), dtype=np.float32)
    texture = rng.normal(0, 18, (h, w, 3))
    return Image.fromarray(np.clip(smooth + texture, 0, 255).astype(np.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=200)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start, total, count = time.perf_counter(), 0, 0
    for split, per in (("train", args.train_per_class), ("val", args.val_per_class)):
        for c in range(args.classes):
            folder = args.out / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                path = folder / f"n{c:08d}_{i}.JPEG"
                image(rng).save(path, quality=90)
                total += path.stat().st_size
                count += 1
    print(f"wrote {count} images to {args.out} ({total / count / 1024:.0f} KB each on average) in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
