"""One LARS optimizer step over ResNet-50's parameters: per-parameter loop vs multi-tensor (foreach).

    python benchmarks/lars_step.py [--device cuda] [--reps 30]

Both forms are timed alternately on the same gradients; medians are printed last. On a GPU the
foreach form replaces ~6 kernel launches per tensor (161 tensors) by a few per step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision

from trainperf.optim import LARS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    device = torch.device(args.device)
    model = torchvision.models.resnet50().to(device)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizers = {name: LARS(params, lr=0.1, momentum=0.9, weight_decay=5e-5, foreach=foreach)
                  for name, foreach in (("loop", False), ("foreach", True))}
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for rep in range(args.reps + 3):
        for name, opt in optimizers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep >= 3:  # warm-up steps excluded
                times[name].append(time.perf_counter() - t)
    loop, foreach = statistics.median(times["loop"]), statistics.median(times["foreach"])
    print(f"LARS step, ResNet-50 ({len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M parameters) "
          f"on {device.type}, median of {args.reps}:")
    print(f"  per-parameter loop {loop * 1e3:8.2f} ms")
    print(f"  foreach            {foreach * 1e3:8.2f} ms")
    print(f"  speedup {loop / foreach:.2f}x")


if __name__ == "__main__":
    main()
