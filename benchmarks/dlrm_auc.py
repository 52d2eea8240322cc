"""DLRM's AUC over a whole evaluation set: scikit-learn on the host vs trainperf's `auc` (torchmetrics).

    python benchmarks/dlrm_auc.py [--samples 10000000] [--device cuda] [--reps 3]

The real Criteo eval set is 89,137,319 samples and MLPerf evaluates it 20 times per epoch, inside
the timed region, so one AUC's cost is paid up to ~20x per epoch. Scores are float32 sigmoid
outputs (many ties, as the model's are), ~3.4 % positives as in Criteo. Both are timed alternately
on the same data, from tensors already where the evaluation leaves them; medians are printed last.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from sklearn.metrics import roc_auc_score

from trainperf.workloads.common.ranking import auc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(args.samples, generator=g) < 0.034).float()
    scores = torch.sigmoid(torch.randn(args.samples, generator=g) * 2 + labels * 1.5 - 3)
    labels, scores = labels.to(device), scores.to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def host() -> float:  # what the evaluation did before: copy to the host, then scikit-learn
        return float(roc_auc_score(labels.cpu().numpy(), scores.double().cpu().numpy()))

    def trainperf_auc() -> float:
        return auc(labels, scores)

    candidates = {"scikit-learn (host)": host, f"trainperf auc ({device.type})": trainperf_auc}
    times: dict[str, list[float]] = {name: [] for name in candidates}
    values: dict[str, float] = {}
    trainperf_auc()  # first call: kernels/allocator warm-up, not timed
    for _ in range(args.reps):
        for name, fn in candidates.items():
            sync()
            t = time.perf_counter()
            values[name] = fn()
            sync()
            times[name].append(time.perf_counter() - t)
    print(f"{args.samples:,} samples on {device}, median of {args.reps}:")
    base = statistics.median(next(iter(times.values())))
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<24} {med:8.3f} s  ({base / med:5.2f}x)  AUC {values[name]:.8f}")


if __name__ == "__main__":
    main()
