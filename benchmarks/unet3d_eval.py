"""Cost of one full-size 3D U-Net evaluation (sliding-window inference over 42 volumes) on this machine.

    python benchmarks/unet3d_eval.py                    # the reference network, 128^3 windows
    python benchmarks/unet3d_eval.py --windows 4 --device cuda

Times the reference network's forward pass on batches of 128^3 windows (median of --repeats after one
warm-up), counts the windows trainperf's sliding-window inference takes on 42 synthetic volume shapes,
and multiplies. The shapes follow KiTS19's acquisitions resampled to (1.6, 1.2, 1.2) mm: 512 x 512
slices of 0.6-0.98 mm pixels (-> 256-418 voxels in-plane) and 90-420 mm of scan length (-> 56-262
slices, at least 128 after the reference's padding); a seeded draw, stated as an approximation of the
real distribution, which trainperf does not ship. With --measure-volume N, N whole volumes are also
run end to end through `sliding_window` (the smallest first) to check the extrapolation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from trainperf.workloads.unet3d import inference as I
from trainperf.workloads.unet3d import model as M


def shapes(count: int = 42, seed: int = 0) -> list[tuple[int, int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        inplane = int(512 * rng.uniform(0.6, 0.98) / 1.2)
        depth = max(128, int(rng.uniform(90, 420) / 1.6))
        out.append((depth, inplane, inplane))
    return out


def windows(shape: tuple[int, int, int], roi: int = 128, overlap: float = 0.5) -> int:
    stride = int(roi * (1 - overlap))
    bounds = I.crop_bounds(shape, [stride] * 3)
    kept = [b - a for a, b in bounds]
    pads = I._padding(tuple(kept), roi, stride)
    padded = [k + a + b for k, (a, b) in zip(kept, pads, strict=True)]
    return int(np.prod([(p - roi) // stride + 1 for p in padded]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=1, help="windows per forward pass")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--measure-volume", type=int, default=0)
    args = parser.parse_args()
    dev = torch.device(args.device)
    net = M.UNet3D().to(dev).eval()
    batch = torch.randn(args.windows, 1, 128, 128, 128, device=dev)
    times = []
    with torch.no_grad():
        for i in range(args.repeats + 1):
            start = time.perf_counter()
            net(batch)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append((time.perf_counter() - start) / args.windows)
    per_window = statistics.median(times)
    vols = shapes()
    counts = [windows(s) for s in vols]
    total = sum(counts) * per_window
    print(f"reference 3D U-Net forward on {dev}: {per_window:.2f} s per 128^3 window "
          f"(batches of {args.windows}, median of {args.repeats})")
    print(f"42 volumes: median shape {tuple(int(statistics.median(s[i] for s in vols)) for i in range(3))}, "
          f"{sum(counts)} windows (median {statistics.median(counts):.0f} per volume, max {max(counts)})")
    print(f"one evaluation: {total:.0f} s = {total / 3600:.2f} h of forward passes "
          f"({statistics.median(counts) * per_window:.0f} s per median volume); Gaussian weighting and "
          f"accumulation excluded")
    for shape in sorted(vols, key=windows)[: args.measure_volume]:
        start = time.perf_counter()
        I.sliding_window(torch.randn(1, *shape, device=dev), net, 128, 3, batch=args.windows)
        took = time.perf_counter() - start
        print(f"measured {shape}: {took:.1f} s for {windows(shape)} windows "
              f"(predicted {windows(shape) * per_window:.1f} s)")


if __name__ == "__main__":
    main()
