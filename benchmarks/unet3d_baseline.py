"""Trivial baselines of the 3D U-Net mini dataset, for reading its calibrated target (mean Dice of
kidney and tumour over the mini's evaluation cases, scored as the workload scores them).

    python benchmarks/unet3d_baseline.py

- kidney everywhere: every voxel predicted kidney (tumour Dice 0).
- intensity thresholds: a voxel is kidney when its intensity lies in one interval and tumour when it
  lies in another; the two intervals are grid-searched for the best mean Dice on the training cases
  and then scored on the evaluation cases. Shown on the raw volume and after a Gaussian denoising
  (sigma 1 voxel), which removes most of the correlated noise a single voxel sees.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
from scipy.ndimage import gaussian_filter

from trainperf import jobs, registry
from trainperf.workloads.unet3d import data as D
from trainperf.workloads.unet3d import model as M


def mean_dice(cases: list[tuple[np.ndarray, np.ndarray]], kidney: tuple[float, float],
              tumour: tuple[float, float]) -> float:
    total = 0.0
    for image, label in cases:
        pred = np.zeros(label.shape, np.uint8)
        pred[(image >= kidney[0]) & (image < kidney[1])] = 1
        pred[(image >= tumour[0]) & (image < tumour[1])] = 2
        total += float(M.case_dice(torch.from_numpy(pred), torch.from_numpy(label)).mean())
    return total / len(cases)


def search(cases: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, tuple[float, float], tuple[float, float]]:
    edges = np.round(np.arange(-2.0, 3.01, 0.25), 2)
    best = (-1.0, (0.0, 0.0), (0.0, 0.0))
    # Kidney and tumour are searched one after the other: each class's Dice depends on the other
    # only through the voxels both intervals would claim, which the second search sees.
    for lo, hi in itertools.combinations(edges, 2):
        score = mean_dice(cases, (lo, hi), (9.0, 9.0))
        best = max(best, (score, (lo, hi), (9.0, 9.0)))
    kidney = best[1]
    for lo, hi in itertools.combinations(edges, 2):
        score = mean_dice(cases, kidney, (lo, hi))
        best = max(best, (score, kidney, (lo, hi)))
    return best


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    workload = registry.get("unet3d")
    root = jobs.prepared_data(workload, "mini", None)  # generated and recorded on first use
    recipe = workload.recipe("mini")
    train_ids, eval_ids = D.split(D.list_cases(root), recipe.evaluation_cases)
    paths = D.list_cases(root)

    def load(ids: list[str], sigma: float) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for case in ids:
            image, label = D.load_case(case, *paths[case])
            smooth = gaussian_filter(image[0], sigma) if sigma else image[0]
            out.append((smooth, label[0]))
        return out

    raw_eval = load(eval_ids, 0)
    print(f"unet3d mini: {len(train_ids)} training cases, {len(eval_ids)} evaluation cases; target "
          f"{recipe.target}")
    print(f"kidney everywhere: mean Dice {mean_dice(raw_eval, (-9, 99), (9, 9)):.3f}")
    for sigma in (0.0, 1.0):
        _, kidney, tumour = search(load(train_ids, sigma))
        score = mean_dice(load(eval_ids, sigma), kidney, tumour)
        name = "raw intensities" if not sigma else f"Gaussian-denoised (sigma {sigma:g})"
        print(f"thresholds on {name}: kidney [{kidney[0]:g}, {kidney[1]:g}), tumour [{tumour[0]:g}, "
              f"{tumour[1]:g}) (normalised units, fitted on training cases): mean Dice {score:.3f}")


if __name__ == "__main__":
    main()
