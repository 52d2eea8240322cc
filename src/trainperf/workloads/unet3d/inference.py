"""Sliding-window inference over a whole CT volume, as the MLPerf 3D U-Net evaluates.

The reference's rules: windows of the training patch size at a stride of (1 - overlap) of it; a
remainder of the volume shorter than half a stride is cropped (from both sides, image and label
alike), otherwise the volume is padded with a constant (-2.2, below the normalised air value) up to the
window grid; every window's prediction is weighted by a Gaussian importance map (sigma = 0.125 x the
window, cube root of the 3-D product, peak 1) and the weighted sum divided by the summed weights.
The windows go through the network `batch` at a time instead of one by one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F


def gaussian_importance(size: int, sigma_fraction: float = 0.125) -> torch.Tensor:
    """(size, size, size) weights: the cube root of the product of three 1-D Gaussians (scipy's
    window, sigma = sigma_fraction * size), scaled to peak 1."""
    from scipy.signal.windows import gaussian

    line = gaussian(size, sigma_fraction * size)
    cube = np.cbrt(line[:, None, None] * line[None, :, None] * line[None, None, :])
    return torch.from_numpy(cube / cube.max())


def crop_bounds(shape: tuple[int, ...], strides: list[int]) -> list[tuple[int, int]]:
    """(start, stop) kept per spatial dimension: a remainder under half a stride is cropped, split
    between both ends (the reference's rule; its labels are cropped alike)."""
    out = []
    for size, stride in zip(shape, strides, strict=True):
        rest = size % stride
        rest = rest if rest < stride // 2 else 0
        out.append((rest // 2, size - (rest - rest // 2)))
    return out


def _padding(shape: tuple[int, ...], roi: int, stride: int) -> list[tuple[int, int]]:
    pads = []
    for size in shape:
        extra = (stride - size % stride) % stride
        if size + extra < roi:
            extra += stride
        pads.append((extra // 2, extra - extra // 2))
    return pads


@torch.no_grad()
def sliding_window(volume: torch.Tensor, predict: Callable[[torch.Tensor], torch.Tensor], roi: int,
                   classes: int, overlap: float = 0.5, pad_value: float = -2.2, batch: int = 4,
                   importance: torch.Tensor | None = None) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Class scores of a (C, D, H, W) volume: (classes, D', H', W') for the volume cropped by
    `crop_bounds` (returned too, to crop its label alike). `predict` maps (N, C, roi, roi, roi) windows
    to (N, classes, roi, roi, roi) scores."""
    stride = int(roi * (1 - overlap))
    if stride < 1:
        raise ValueError(f"overlap {overlap} leaves no stride for windows of {roi}")
    bounds = crop_bounds(tuple(volume.shape[1:]), [stride] * 3)
    x = volume[:, bounds[0][0]: bounds[0][1], bounds[1][0]: bounds[1][1], bounds[2][0]: bounds[2][1]]
    cropped = tuple(x.shape[1:])
    pads = _padding(cropped, roi, stride)
    flat = [p for pair in reversed(pads) for p in pair]
    x = F.pad(x[None], flat, mode="constant", value=pad_value)[0]
    padded = x.shape[1:]
    weight = (importance if importance is not None else gaussian_importance(roi)).to(x.device, torch.float32)
    scores = torch.zeros((classes, *padded), dtype=torch.float32, device=x.device)
    norm = torch.zeros(padded, dtype=torch.float32, device=x.device)
    corners = [(i, j, k) for i in range(0, padded[0] - roi + 1, stride) for j in range(0, padded[1] - roi + 1, stride)
               for k in range(0, padded[2] - roi + 1, stride)]
    for start in range(0, len(corners), batch):
        group = corners[start: start + batch]
        windows = torch.stack([x[:, i: i + roi, j: j + roi, k: k + roi] for i, j, k in group])
        out = predict(windows).float() * weight
        for (i, j, k), o in zip(group, out, strict=True):
            scores[:, i: i + roi, j: j + roi, k: k + roi] += o
            norm[i: i + roi, j: j + roi, k: k + roi] += weight
    scores = scores / norm
    (a0, _), (b0, _), (c0, _) = pads
    return scores[:, a0: a0 + cropped[0], b0: b0 + cropped[1], c0: c0 + cropped[2]], bounds
