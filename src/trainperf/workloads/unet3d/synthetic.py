"""The mini 3D U-Net dataset: synthetic abdominal CT-like volumes, already in the reference's
preprocessed form (clipped to [-79, 304] HU and normalised (x - 101) / 76.9), written as
case_XXXXX_x.npy / case_XXXXX_y.npy so the real loader reads them.

Each case: air around a body ellipsoid of soft tissue with a fat rim; a spine (bone) behind; a liver
and a spleen (decoys whose intensities overlap the kidney's medulla); two kidneys, each an enhancing
cortex around a darker medulla (label 1); a tumour blob on one kidney (label 2), hypodense and
textured; decoys that defeat intensity thresholding: an aorta as bright as the kidney cortex and
two or three bowel loops with the tumour's density and texture, away from the kidneys (so a voxel's
class depends on its context, as in real CT); correlated noise; volume size and anatomy scale vary
as voxel spacing does across scanners.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainperf.files import AtomicOutput, write_json_atomic
from trainperf.workloads.unet3d import data as unet3d_data
from trainperf.workloads.unet3d.prepare import KiTS19

HU = {"air": -1000.0, "fat": -90.0, "soft": 40.0, "liver": 110.0, "spleen": 120.0, "cortex": 230.0,
      "medulla": 130.0, "tumour": -40.0, "bone": 700.0, "aorta": 230.0}


def _norm(hu: np.ndarray) -> np.ndarray:
    return ((np.clip(hu, *unet3d_data.CLIP) - unet3d_data.MEAN) / unet3d_data.STD).astype(np.float32)


def _ellipsoid(grid: tuple[np.ndarray, ...], centre: np.ndarray, radii: np.ndarray) -> np.ndarray:
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid, centre, radii, strict=True)) <= 1.0


def make_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    from scipy.ndimage import gaussian_filter

    shape = tuple(int(x) for x in rng.integers(40, 57, 3))
    scale = rng.uniform(0.85, 1.15)  # anatomy size in voxels: the spacing varies
    grid = np.meshgrid(*[np.arange(s, dtype=np.float32) for s in shape], indexing="ij")
    centre = np.array(shape, dtype=np.float32) / 2 + rng.uniform(-2, 2, 3)
    hu = np.full(shape, HU["air"], np.float32)
    label = np.zeros(shape, np.uint8)
    body = np.array([shape[0] * 0.6, shape[1] * 0.42, shape[2] * 0.47])
    hu[_ellipsoid(grid, centre, body)] = HU["fat"]
    hu[_ellipsoid(grid, centre, body - 2.5)] = HU["soft"]
    spine_c = centre + np.array([0, 0.25 * shape[1], 0])
    hu[_ellipsoid(grid, spine_c, np.array([shape[0], 3.5, 3.5]) * [1, scale, scale])] = HU["bone"]
    liver_c = centre + np.array([rng.uniform(-3, 3), -0.05 * shape[1], -0.22 * shape[2]])
    hu[_ellipsoid(grid, liver_c, np.array([9, 8, 7]) * scale * rng.uniform(0.9, 1.1, 3))] = HU["liver"]
    spleen_c = centre + np.array([rng.uniform(-4, 4), 0.02 * shape[1], 0.25 * shape[2]])
    hu[_ellipsoid(grid, spleen_c, np.array([5, 4, 3.5]) * scale)] = HU["spleen"]
    aorta_c = centre + np.array([0, 0.12 * shape[1], rng.uniform(-1, 1)])
    hu[_ellipsoid(grid, aorta_c, np.array([shape[0], 2.2, 2.2]) * [1, scale, scale])] = HU["aorta"]
    texture = gaussian_filter(rng.standard_normal(shape).astype(np.float32), 1.0) * 60
    for _ in range(int(rng.integers(2, 4))):
        bc = centre + np.array([rng.uniform(-8, 8), -rng.uniform(0.12, 0.22) * shape[1],
                                rng.uniform(-0.15, 0.15) * shape[2]])
        bowel = _ellipsoid(grid, bc, rng.uniform(3.5, 5.5) * scale * rng.uniform(0.8, 1.2, 3))
        hu[bowel] = HU["tumour"] + texture[bowel]
    tumour_side = int(rng.integers(2))
    for side, sign in enumerate((-1, 1)):
        kc = centre + np.array([rng.uniform(-3, 3), 0.12 * shape[1], sign * 0.16 * shape[2]])
        radii = np.array([6.5, 4.0, 3.2]) * scale * rng.uniform(0.9, 1.1, 3)
        kidney = _ellipsoid(grid, kc, radii)
        hu[kidney] = HU["cortex"]
        hu[_ellipsoid(grid, kc, radii * 0.6)] = HU["medulla"]
        label[kidney] = 1
        if side == tumour_side:
            direction = rng.normal(size=3)
            direction /= np.linalg.norm(direction)
            radius = rng.uniform(3.5, 5.5) * scale
            tc = kc + direction * radii * 0.85
            tumour = _ellipsoid(grid, tc, np.full(3, radius) * rng.uniform(0.8, 1.2, 3))
            hu[tumour] = HU["tumour"] + texture[tumour]
            label[tumour] = 2
    noise = gaussian_filter(rng.standard_normal(shape).astype(np.float32), 0.8) * rng.uniform(25, 45) * 2
    image = _norm(hu + noise)
    return image[None], label[None]


def generate(root: Path, say: Callable[[str], None], cases: int = 40, seed: int = 19) -> None:
    """`cases` volumes as case_00000 ... in the reference layout (the mini recipe evaluates the last 8)."""
    marker = root / "trainperf_unet3d_mini.json"
    if marker.is_file():
        say(f"{root}: already generated")
        return
    root.mkdir(parents=True, exist_ok=True)
    for i in range(cases):
        image, label = make_case(np.random.default_rng([seed, i]))
        for suffix, array in (("y", label), ("x", image)):
            with AtomicOutput(root / f"case_{i:05d}_{suffix}.npy") as tmp, tmp.open("wb") as fh:
                np.save(fh, array, allow_pickle=False)
    write_json_atomic(marker, {"cases": cases, "seed": seed, "hu": HU})
    say(f"{root}: {cases} synthetic cases ({json.dumps(HU)})")


class SyntheticKidneys(KiTS19):
    """The mini: synthetic volumes written in the preprocessed layout."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        if not (data_dir / "trainperf_unet3d_mini.json").is_file():
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare unet3d)"]
        return super().problems(data_dir)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        generate(data_dir, say)
