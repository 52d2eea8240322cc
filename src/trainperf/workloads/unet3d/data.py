"""KiTS19 for the MLPerf 3D U-Net: the reference's preprocessed layout, its preprocessing from the raw
NIfTI files, the fixed evaluation split and the training patches.

Layout read: DIR/case_XXXXX_x.npy (float32, 1 x D x H x W, normalised CT) and DIR/case_XXXXX_y.npy
(uint8, same shape; 0 background, 1 kidney, 2 tumour). The 42 evaluation cases are the reference's
`evaluation_cases.txt`; the other 168 train. `checksum.json` (shipped) is the reference's MD5 of every
preprocessed file. Preprocessing (the reference's preprocess_dataset.py): spacing from the header's
pixdim, resampled to (1.6, 1.2, 1.2) mm (trilinear with aligned corners for the image, nearest for the
label; new size = int(spacing / target x size)), clipped to [-79, 304], normalised (x - 101) / 76.9,
edge-padded to at least 128 per axis.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainperf.arrays import load_npy
from trainperf.errors import TrainperfError

EVAL_CASES = tuple(f"{n:05d}" for n in (
    0, 3, 5, 6, 12, 24, 34, 41, 44, 49, 52, 56, 61, 65, 66, 70, 76, 78, 80, 84, 86, 87, 92, 111, 112, 125, 128,
    138, 157, 160, 161, 162, 169, 171, 176, 185, 187, 189, 198, 203, 206, 207))
TARGET_SPACING = (1.6, 1.2, 1.2)
CLIP = (-79.0, 304.0)
MEAN, STD = 101.0, 76.9
MIN_SHAPE = 128
CLASSES = 3
# KiTS19's CTs (512 x 512 at 0.44-1.04 mm, up to ~1,000 slices of 0.5-5 mm) resample to ~1e8 voxels at most;
# 2**30 (4 GiB as float32) is generous, and refuses a header whose spacing would ask for terabytes.
MAX_RESAMPLED_VOXELS = 1 << 30
PACKAGE = Path(__file__).parent
CASE = re.compile(r"^case_(\d{5})_x\.npy$")


def checksums() -> dict[str, str]:
    return json.loads((PACKAGE / "checksum.json").read_text(encoding="utf-8"))


def md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_cases(root: Path) -> dict[str, tuple[Path, Path]]:
    """case id -> (image, label) files of a preprocessed folder; an image without its label (or the
    reverse) is one line naming the case."""
    if not root.is_dir():
        raise TrainperfError(f"{root}: missing (preprocessed KiTS19: case_XXXXX_x.npy and case_XXXXX_y.npy)")
    found: dict[str, tuple[Path, Path]] = {}
    for path in sorted(root.glob("case_*_x.npy")):
        match = CASE.match(path.name)
        if not match:
            continue
        label = path.with_name(f"case_{match.group(1)}_y.npy")
        if not label.is_file():
            raise TrainperfError(f"{path}: case {match.group(1)} has no label ({label.name} missing)")
        found[match.group(1)] = (path, label)
    for path in sorted(root.glob("case_*_y.npy")):
        case = path.name[5:10]
        if case not in found:
            raise TrainperfError(f"{path}: case {case} has no image (case_{case}_x.npy missing)")
    return found


def split(cases: dict[str, tuple[Path, Path]], eval_cases: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(training, evaluation) case ids; every evaluation case must be there."""
    missing = [c for c in eval_cases if c not in cases]
    if missing:
        raise TrainperfError(f"evaluation case {missing[0]} has no files (case_{missing[0]}_x.npy / _y.npy; "
                             f"{len(missing)} of {len(eval_cases)} missing)")
    chosen = set(eval_cases)
    return [c for c in cases if c not in chosen], [c for c in cases if c in chosen]


def load_case(case: str, image_path: Path, label_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A case's image (float32, 1 x D x H x W) and label (uint8), checked: same shape, classes 0/1/2."""
    image = load_npy(image_path, f"case {case}: {image_path.name}")  # headers checked against the file sizes
    label = load_npy(label_path, f"case {case}: {label_path.name}")
    if image.ndim == 3:
        image = image[None]
    if label.ndim == 3:
        label = label[None]
    if image.ndim != 4 or image.shape[0] != 1:
        raise TrainperfError(f"case {case}: image of shape {image.shape}, expected 1 x D x H x W")
    if image.shape != label.shape:
        raise TrainperfError(f"case {case}: image shape {image.shape[1:]} and label shape {label.shape[1:]} differ")
    if not np.issubdtype(label.dtype, np.integer) or label.size and (label.min() < 0 or label.max() >= CLASSES):
        found = sorted(set(np.unique(label).tolist()) - {0, 1, 2})[:3]
        raise TrainperfError(f"case {case}: label holds classes {found}, expected only 0, 1 and 2")
    _refuse_non_finite(image, case, image_path.name)
    return image.astype(np.float32, copy=False), label.astype(np.uint8, copy=False)


def _refuse_non_finite(image: np.ndarray, case: str, name: str) -> None:
    """The reference has no rule for NaN or infinite voxels (its clip lets NaN through, and training
    then diverges far from the cause): refuse them, naming the case."""
    if np.issubdtype(image.dtype, np.floating):
        bad = int(image.size - np.count_nonzero(np.isfinite(image)))
        if bad:
            raise TrainperfError(f"case {case}: {name} holds {bad:,} non-finite voxels (NaN or infinite) of "
                                 f"{image.size:,}; fix or drop the case (the reference has no rule for them)")


# ---------------------------------------------------------------------------------------------
# training patches
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    """A training case in memory, with its foreground boxes found once: per foreground class, the
    bounding boxes of its two largest connected components (what the reference's foreground crop
    draws from, recomputed there for every patch)."""

    image: np.ndarray
    label: np.ndarray
    boxes: dict[int, list[tuple[slice, ...]]]


def foreground_boxes(label: np.ndarray) -> dict[int, list[tuple[slice, ...]]]:
    from scipy import ndimage

    out: dict[int, list[tuple[slice, ...]]] = {}
    for cls in range(1, CLASSES):
        mask = label[0] == cls
        if not mask.any():
            continue
        components, count = ndimage.label(mask)
        slices = [s for s in ndimage.find_objects(components) if s is not None]
        sizes = [int(np.prod([s.stop - s.start for s in box])) for box in slices]
        out[cls] = [slices[i] for i in np.argsort(sizes, kind="stable")[-2:]]
    return out


def _around(box: slice, patch: int, size: int, rng: np.random.Generator) -> int:
    """Start of a `patch`-long window around a box's extent (the reference's random adjustment)."""
    extent = box.stop - box.start
    diff = patch - extent
    shift = int(rng.integers(abs(diff))) if diff else 0
    low = box.start - shift if diff > 0 else box.start + shift
    return int(min(max(0, low), size - patch))


def sample_patch(case: Case, patch: int, oversampling: float, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A patch^3 crop: with probability `oversampling` around one of the two largest components of a
    random foreground class, else anywhere."""
    shape = case.image.shape[1:]
    if rng.random() < oversampling and case.boxes:
        cls = list(case.boxes)[int(rng.integers(len(case.boxes)))]
        box = case.boxes[cls][int(rng.integers(len(case.boxes[cls])))]
        starts = [_around(b, patch, s, rng) for b, s in zip(box, shape, strict=True)]
    else:
        starts = [int(rng.integers(s - patch + 1)) for s in shape]
    window = tuple(slice(a, a + patch) for a in starts)
    return case.image[(slice(None), *window)], case.label[(slice(None), *window)]


def augment(images: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's training augmentation on a device batch (B, 1, D, H, W): each spatial axis
    flipped with probability 1/3; with probability 0.1 the intensities scaled by 1 + U(0.7, 1.3) (the
    reference's expression: a factor of 1.7-2.3); with probability 0.1 Gaussian noise of a standard
    deviation drawn from U(0, 0.1)."""
    b = images.shape[0]
    dev = images.device
    draws = torch.rand(b, 6, generator=gen, device=dev)
    for axis in range(3):
        flip = draws[:, axis] < 1 / 3
        images = torch.where(flip[:, None, None, None, None], images.flip(2 + axis), images)
        labels = torch.where(flip[:, None, None, None, None], labels.flip(2 + axis), labels)
    factor = 1 + (0.7 + 0.6 * torch.rand(b, generator=gen, device=dev))
    images = images * torch.where(draws[:, 3] < 0.1, factor, torch.ones_like(factor))[:, None, None, None, None]
    sigma = 0.1 * draws[:, 5] * (draws[:, 4] < 0.1)
    noise = torch.randn(images.shape, generator=gen, device=dev, dtype=images.dtype)
    return images + noise * sigma[:, None, None, None, None], labels


# ---------------------------------------------------------------------------------------------
# preprocessing from the raw NIfTI files
# ---------------------------------------------------------------------------------------------
def read_nifti(path: Path, case: str) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A volume and its voxel spacing (the header's pixdim, as the reference reads it). The affine
    must exist and be axis-aligned (a signed permutation of the axes with scaling): an oblique one
    would need resampling along rotated axes that the reference does not do."""
    import nibabel

    try:
        img = nibabel.load(str(path))
        data = np.asarray(img.dataobj)
    except Exception as exc:  # noqa: BLE001 - nibabel raises many kinds for a damaged file
        raise TrainperfError(f"case {case}: cannot read {path} ({str(exc).splitlines()[0][:120]})") from None
    affine = img.affine
    if affine is None or not np.all(np.isfinite(affine)):
        raise TrainperfError(f"case {case}: {path.name} has no affine (voxel spacing unknown)")
    rotation = np.asarray(affine)[:3, :3]
    if (np.count_nonzero(np.abs(rotation) > 1e-6, axis=0) != 1).any() or \
            (np.count_nonzero(np.abs(rotation) > 1e-6, axis=1) != 1).any():
        raise TrainperfError(f"case {case}: {path.name} has an oblique affine (not axis-aligned)")
    if data.ndim != 3:
        raise TrainperfError(f"case {case}: {path.name} has {data.ndim} dimensions, expected 3")
    spacing = tuple(float(x) for x in img.header["pixdim"][1:4])
    if not all(math.isfinite(s) and s > 0 for s in spacing):
        raise TrainperfError(f"case {case}: {path.name} has voxel spacing {_mm(spacing)} mm (the header's pixdim), "
                             "expected finite sizes > 0")
    return data, spacing  # type: ignore[return-value]


def _mm(values: object) -> str:
    return "(" + ", ".join(f"{float(v):.4g}" for v in values) + ")"  # type: ignore[attr-defined]


def preprocess_case(case_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """One raw case (imaging.nii.gz, segmentation.nii.gz) as the reference preprocesses it."""
    import torch.nn.functional as F

    case = case_dir.name.removeprefix("case_")
    image, spacing = read_nifti(case_dir / "imaging.nii.gz", case)
    _refuse_non_finite(image, case, "imaging.nii.gz")
    label, _ = read_nifti(case_dir / "segmentation.nii.gz", case)
    if image.shape != label.shape:
        raise TrainperfError(f"case {case}: imaging shape {image.shape} and segmentation shape {label.shape} differ")
    label = label.astype(np.uint8)
    if label.max(initial=0) >= CLASSES:
        raise TrainperfError(f"case {case}: segmentation holds class {int(label.max())}, expected only 0, 1 and 2")
    x = torch.from_numpy(image.astype(np.float32))[None, None]
    y = torch.from_numpy(label)[None, None]
    if list(spacing) != list(TARGET_SPACING):
        exact = np.array(spacing) / np.array(TARGET_SPACING) * np.array(image.shape)  # in float: no overflow
        if exact.min() < 1 or float(np.prod(exact)) > MAX_RESAMPLED_VOXELS:
            raise TrainperfError(f"case {case}: imaging.nii.gz of {image.shape} voxels at {_mm(spacing)} mm resamples "
                                 f"to {_mm(exact)} voxels at {TARGET_SPACING} mm; expected 1 to "
                                 f"{MAX_RESAMPLED_VOXELS:,} voxels, at least 1 per axis (check the header's pixdim)")
        size = exact.astype(int).tolist()
        x = F.interpolate(x, size=size, mode="trilinear", align_corners=True)
        y = F.interpolate(y, size=size, mode="nearest")
    x = (x.clamp(*CLIP) - MEAN) / STD
    out_x, out_y = x[0].numpy(), y[0].numpy()
    pads = [(0, 0)] + [((MIN_SHAPE - s) // 2 if s < MIN_SHAPE else 0, MIN_SHAPE - s - (MIN_SHAPE - s) // 2
                        if s < MIN_SHAPE else 0) for s in out_x.shape[1:]]
    return (np.pad(out_x, pads, mode="edge").astype(np.float32), np.pad(out_y, pads, mode="edge").astype(np.uint8))
