"""ImageNet in the standard folder layout: scanning, decoding, loaders, and the mini generator.

Both scales read the same layout (`train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG`) with the same
scanning and decoding code. `full` streams it through DataLoader workers with per-sample
torchvision transforms; `mini` decodes it once into memory and augments whole batches with tensor
ops (the MLPerf winners keep datasets resident on the device).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from trainperf.errors import TrainperfError, shown
from trainperf.files import AtomicOutput, write_json_atomic
from trainperf.spec import DataSource

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
SPLITS = ("train", "val")
# The reference subtracts the ImageNet RGB means (0-255 scale) and does not divide by a std.
RGB_MEANS = (123.68, 116.78, 103.94)
MANIFEST = "trainperf_dataset.json"
MINI_FORMAT_VERSION = 1
IMAGENET_TRAIN, IMAGENET_VAL, IMAGENET_CLASSES = 1_281_167, 50_000, 1000


@dataclass(frozen=True)
class ImageIndex:
    """One split of an ImageNet-layout folder: file paths, integer labels and class names (wnids)."""

    paths: list[Path]
    labels: list[int]
    classes: list[str]


def scan_split(root: Path, split: str, classes: list[str] | None = None) -> ImageIndex:
    """List `root/split/<class>/*.JPEG`. Class ids follow the sorted class-folder names (as in
    torchvision's ImageFolder), or `classes` when given so that val ids match train ids."""
    split_dir = root / split
    if not split_dir.is_dir():
        raise TrainperfError(f"{split_dir}: missing folder (expected {split}/<wnid>/*.JPEG)")
    found = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if not found:
        raise TrainperfError(f"{split_dir}: no class folders (expected {split}/<wnid>/*.JPEG)")
    if classes is None:
        classes = found
    else:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise TrainperfError(f"{split_dir / unknown[0]}: class folder not present in train/")
    class_id = {name: i for i, name in enumerate(classes)}
    paths: list[Path] = []
    labels: list[int] = []
    for name in found:
        files = sorted(e.name for e in os.scandir(split_dir / name)
                       if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise TrainperfError(f"{split_dir / name}: class folder holds no .JPEG images")
        paths.extend(split_dir / name / f for f in files)
        labels.extend([class_id[name]] * len(files))
    return ImageIndex(paths=paths, labels=labels, classes=classes)


# ---------------------------------------------------------------------------------------------
# verification: every image decoded once, outside any timed region; bad ones listed and skipped
# ---------------------------------------------------------------------------------------------
BAD_IMAGES = "trainperf_bad_images.json"
BAD_FORMAT_VERSION = 1


def listing_digest(root: Path, indexes: list[ImageIndex]) -> str:
    """Which images a folder holds (their paths), as one hash: a changed folder, a changed list."""
    digest = hashlib.sha256()
    for index in indexes:
        for path in index.paths:
            # The name's bytes as on disk: one that is not UTF-8 arrives with surrogate escapes, which
            # str.encode() refuses; every UTF-8 name gives the same bytes (and digest) as before.
            digest.update(os.fsencode(path.relative_to(root)) + b"\n")
    return digest.hexdigest()


def _check_images(paths: list[Path]) -> list[tuple[str, str]]:
    """(path, reason) of each image in `paths` that does not decode (run in a worker process)."""
    bad = []
    for path in paths:
        try:
            decode(path)
        except TrainperfError as exc:
            bad.append((str(path), str(exc).split(": cannot decode image ", 1)[-1].strip("()")))
    return bad


def verify_images(root: Path, workers: int, progress: Callable[[int, int, int], None]) -> dict:
    """Decode every train and val image with the loader's own decoder, in `workers` processes, and
    record the ones that fail (with their reason) in `root/trainperf_bad_images.json`, which the
    loaders honour (they skip those files). `progress(done, total, bad)` is called as chunks finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    train = scan_split(root, "train")
    val = scan_split(root, "val", train.classes)
    paths = train.paths + val.paths
    chunks = [paths[i:i + 256] for i in range(0, len(paths), 256)]
    bad: list[tuple[str, str]] = []
    done = 0
    progress(0, len(paths), 0)
    context = multiprocessing.get_context("spawn")  # safe beside CUDA and threads
    with ProcessPoolExecutor(max(1, workers), mp_context=context) as pool:
        futures = {pool.submit(_check_images, chunk): len(chunk) for chunk in chunks}
        for future in as_completed(futures):
            bad.extend(future.result())
            done += futures[future]
            progress(done, len(paths), len(bad))
    record = {"format_version": BAD_FORMAT_VERSION, "listing_sha256": listing_digest(root, [train, val]),
              "images": len(paths),
              "bad": [{"path": str(Path(p).relative_to(root)), "reason": r} for p, r in sorted(bad)]}
    write_json_atomic(root / BAD_IMAGES, record)
    return record


def bad_images(root: Path, indexes: list[ImageIndex]) -> set[Path]:
    """The images `verify_images` found bad (none when it never ran); an error naming the list when
    the folder changed since (the list no longer describes it)."""
    path = root / BAD_IMAGES
    if not path.is_file():
        return set()
    listing = listing_digest(root, indexes)  # outside the try: its failure is not the list's fault
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        current = record["format_version"] == BAD_FORMAT_VERSION and record["listing_sha256"] == listing
        listed = {root / item["path"] for item in record["bad"]}
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainperfError(f"{path}: unreadable list of bad images; run trainperf prepare resnet --scale full "
                             f"--data {root} --verify again") from None
    if not current:
        raise TrainperfError(f"{path}: the image folder changed since it was verified; run trainperf prepare "
                             f"resnet --scale full --data {root} --verify again")
    return listed


def without(index: ImageIndex, skip: set[Path]) -> ImageIndex:
    if not skip:
        return index
    keep = [i for i, p in enumerate(index.paths) if p not in skip]
    return ImageIndex(paths=[index.paths[i] for i in keep], labels=[index.labels[i] for i in keep],
                      classes=index.classes)


def layout_problems(root: Path) -> list[str]:
    """Everything missing or malformed in an ImageNet-layout folder, one line each."""
    if not root.is_dir():
        return [f"{root}: folder does not exist (expected an ImageNet root with train/ and val/)"]
    problems = []
    train_classes = None
    for split in SPLITS:
        try:
            index = scan_split(root, split, None if split == "train" else train_classes)
        except TrainperfError as exc:
            problems.append(str(exc))
            continue
        if split == "train":
            train_classes = index.classes
    return problems


def decode(path: Path) -> torch.Tensor:
    """Decode one image file to a uint8 RGB tensor (C, H, W); a clear error names a bad file.

    Pillow, as torchvision's ImageFolder uses (torchvision's own decoders are deprecated from 0.29);
    CMYK and greyscale files are converted to RGB, as the reference's preprocessing does.
    """
    try:
        with Image.open(path) as img:
            return pil_to_tensor(img.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainperfError(f"{shown(str(path), limit=4096)}: cannot decode image ({reason})") from None


# ---------------------------------------------------------------------------------------------
# full scale: DataLoader workers, per-sample transforms, pinned memory, device prefetch
# ---------------------------------------------------------------------------------------------
class FolderDataset(Dataset):
    def __init__(self, index: ImageIndex, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.index = index
        self.transform = transform

    def __len__(self) -> int:
        return len(self.index.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(decode(self.index.paths[i])), self.index.labels[i]


def train_transform(image_size: int, min_area: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reference training augmentation: distorted crop (area 0.05-1, aspect 3/4-4/3) resized to
    the training size (aspect not kept), random horizontal flip."""
    return v2.Compose([
        v2.RandomResizedCrop(image_size, scale=(min_area, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
        v2.RandomHorizontalFlip(),
    ])


def eval_transform(image_size: int, resize: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reference evaluation crop: short side to `resize` (aspect kept), centre crop."""
    return v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(image_size)])


def channel_means(device: torch.device) -> torch.Tensor:
    """The ImageNet means as a (1, 3, 1, 1) tensor on `device`: made once per loader (on a GPU, making it
    from Python numbers is a host-to-device copy)."""
    return torch.tensor(RGB_MEANS, device=device, dtype=torch.float32).view(1, 3, 1, 1)


def normalize(images: torch.Tensor, mean: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 or float (N,3,H,W) 0-255 -> float with the ImageNet means subtracted (batched, on device)."""
    return images.float() - (mean if mean is not None else channel_means(images.device))


# ---------------------------------------------------------------------------------------------
# full scale, decoded on the device: workers read bytes, the device decodes and augments batches
# ---------------------------------------------------------------------------------------------
DECODERS = ("workers", "device")


class RawFolder(Dataset):
    """The files' bytes, labels and positions: DataLoader workers only read; decoding happens on the
    training device, a batch at a time (`decode_batch`)."""

    def __init__(self, index: ImageIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        path = self.index.paths[i]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TrainperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), self.index.labels[i], i


def collate_raw(samples: list[tuple[torch.Tensor, int, int]]) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
    return [s[0] for s in samples], torch.tensor([s[1] for s in samples]), [s[2] for s in samples]


@functools.cache
def _jpeg_decoder() -> Callable[..., list[torch.Tensor]]:
    """TorchCodec's batched JPEG decoder where it is installed (nvjpeg on a GPU), else torchvision's
    (deprecated there from 0.29 in favour of TorchCodec's)."""
    import warnings

    try:
        from torchcodec.decoders import decode_jpeg

        return lambda datas, device: decode_jpeg(datas, mode="RGB", device=device)
    # TorchCodec raises RuntimeError (not ImportError) at import where FFmpeg's libraries are missing.
    except (ImportError, RuntimeError, OSError) as exc:
        if not isinstance(exc, ModuleNotFoundError):
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            warnings.warn(f"decode=device: TorchCodec cannot load ({reason}); torchvision's JPEG decoder is used "
                          "instead (install FFmpeg's libraries for TorchCodec's)", stacklevel=2)

        from torchvision.io import ImageReadMode, decode_jpeg

        def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)

        return decode


def decode_batch(datas: list[torch.Tensor], paths: list[Path], device: torch.device) -> list[torch.Tensor]:
    """uint8 RGB (3, H, W) images on `device` from the files' bytes, decoded there in one call; a file
    the JPEG decoder refuses (ImageNet holds a PNG and CMYK JPEGs under .JPEG names) is decoded by
    Pillow instead, and a file nothing decodes is one line naming it."""
    decoder = _jpeg_decoder()
    try:
        return list(decoder(datas, device))
    except RuntimeError:
        images = []
        for data, path in zip(datas, paths, strict=True):
            try:
                images.append(decoder([data], device)[0])
            except RuntimeError:
                images.append(decode(path).to(device))
        return images


def crop_boxes(sizes: list[tuple[int, int]], min_area: float, rng: np.random.Generator,
               attempts: int = 10) -> list[tuple[int, int, int, int]]:
    """torchvision's RandomResizedCrop sampling, for a batch at once on the host from the images'
    sizes (no value is read back from the device): (top, left, height, width) of a crop of area
    min_area-1 of the image and aspect 3/4-4/3, tried `attempts` times, else the centre crop of the
    aspect clamped to that range."""
    n = len(sizes)
    h = np.array([s[0] for s in sizes], dtype=np.float64)
    w = np.array([s[1] for s in sizes], dtype=np.float64)
    area = rng.uniform(min_area, 1.0, (attempts, n)) * (h * w)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), (attempts, n)))
    cw = np.round(np.sqrt(area * ratio))
    ch = np.round(np.sqrt(area / ratio))
    fits = (cw > 0) & (ch > 0) & (cw <= w) & (ch <= h)
    first = fits.argmax(0)
    found = fits.any(0)
    pick_w, pick_h = cw[first, np.arange(n)], ch[first, np.arange(n)]
    u, v = rng.random(n), rng.random(n)
    boxes = []
    for i in range(n):
        if found[i]:
            bh, bw = int(pick_h[i]), int(pick_w[i])
            top, left = int(u[i] * (h[i] - bh + 1)), int(v[i] * (w[i] - bw + 1))
        else:  # torchvision's fallback: the centre crop, its aspect clamped to 3/4-4/3
            aspect = w[i] / h[i]
            if aspect < 3 / 4:  # tall: the whole width
                bw, bh = int(w[i]), int(round(w[i] / (3 / 4)))
            elif aspect > 4 / 3:  # wide: the whole height
                bw, bh = int(round(h[i] * (4 / 3))), int(h[i])
            else:
                bw, bh = int(w[i]), int(h[i])
            top, left = (int(h[i]) - bh) // 2, (int(w[i]) - bw) // 2
        boxes.append((top, left, bh, bw))
    return boxes


def crop_resize(images: list[torch.Tensor], boxes: list[tuple[int, int, int, int]], size: int,
                flips: list[bool]) -> torch.Tensor:
    """Float (N, 3, size, size): each image's box resized bilinearly (antialiased, as RandomResizedCrop)
    and mirrored where `flips` says, on the images' device."""
    out = []
    for image, (top, left, bh, bw), flip in zip(images, boxes, flips, strict=True):
        crop = image[None, :, top:top + bh, left:left + bw].float()
        resized = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(resized.flip(-1) if flip else resized)
    return torch.cat(out)


def resize_center_crop(images: list[torch.Tensor], resize: int, size: int) -> torch.Tensor:
    """Float (N, 3, size, size): the reference evaluation crop (short side to `resize`, aspect kept,
    centre crop), each image on its device."""
    out = []
    for image in images:
        h, w = image.shape[-2:]
        # torchvision's Resize(resize): the short side to `resize`, the long one truncated to an integer.
        nh, nw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
        resized = F.interpolate(image[None].float(), size=(nh, nw), mode="bilinear", antialias=True,
                                align_corners=False)
        top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))  # torchvision's CenterCrop
        out.append(resized[:, :, top:top + size, left:left + size])
    return torch.cat(out)


# ---------------------------------------------------------------------------------------------
# mini scale: decode once, keep in memory, batched tensor augmentation
# ---------------------------------------------------------------------------------------------
def load_resident(index: ImageIndex, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode a whole split into one uint8 tensor on the device (all images must share a size)."""
    images = [decode(p) for p in index.paths]
    shapes = {tuple(img.shape) for img in images}
    if len(shapes) != 1:
        raise TrainperfError(f"{index.paths[0].parent.parent}: in-memory loading needs images of one size, "
                             f"found {sorted(shapes)[:3]}")
    return torch.stack(images).to(device), torch.tensor(index.labels, device=device)


def random_resized_crop(images: torch.Tensor, min_area: float, hflip: bool,
                        generator: torch.Generator) -> torch.Tensor:
    """Batched distorted crop (area min_area-1, aspect 3/4-4/3, random position) resized back to the
    input size with one affine grid_sample; optional horizontal flip. Float in, float out."""
    n = images.shape[0]
    dev = images.device
    area = torch.empty(n, device=dev).uniform_(min_area, 1.0, generator=generator)
    log_ratio = torch.empty(n, device=dev).uniform_(np.log(3 / 4), np.log(4 / 3), generator=generator)
    ratio = torch.exp(log_ratio)
    sx = torch.sqrt(area * ratio).clamp(max=1.0)
    sy = torch.sqrt(area / ratio).clamp(max=1.0)
    tx = (torch.rand(n, device=dev, generator=generator) * 2 - 1) * (1 - sx)
    ty = (torch.rand(n, device=dev, generator=generator) * 2 - 1) * (1 - sy)
    if hflip:
        flip = torch.rand(n, device=dev, generator=generator) < 0.5
        sx = torch.where(flip, -sx, sx)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 1, 1], theta[:, 0, 2], theta[:, 1, 2] = sx, sy, tx, ty
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


# ---------------------------------------------------------------------------------------------
# the mini dataset: scikit-learn's digits written as an ImageNet-layout JPEG folder
# ---------------------------------------------------------------------------------------------
def mini_wnid(digit: int) -> str:
    return f"n{digit:08d}"


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def generate_mini(root: Path, image_size: int = 32, val_fraction: float = 0.2, quality: int = 95,
                  say: Callable[[str], None] = print) -> None:
    """Write scikit-learn's bundled handwritten digits (1,797 real 8x8 scans) as RGB JPEGs in the
    ImageNet folder layout, with a stratified held-out val split fixed by seed 0.

    Written into a temporary sibling folder and renamed into place, so an interrupted generation
    never leaves a half dataset behind.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0 * 255.0).round().astype(np.uint8)
    idx = np.arange(len(images))
    train_idx, val_idx = train_test_split(idx, test_size=val_fraction, stratify=digits.target, random_state=0)
    with AtomicOutput(root, directory=True) as tmp:
        for split, ids in (("train", train_idx), ("val", val_idx)):
            for i in ids:
                label = int(digits.target[i])
                folder = tmp / split / mini_wnid(label)
                folder.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(images[i], mode="L").resize((image_size, image_size), Image.BICUBIC)
                img.convert("RGB").save(folder / f"{mini_wnid(label)}_{i:05d}.JPEG", quality=quality)
        manifest = {
            "dataset": "sklearn-digits-imagenet-layout",
            "format_version": MINI_FORMAT_VERSION,
            "image_size": image_size,
            "train_samples": len(train_idx),
            "eval_samples": len(val_idx),
            "classes": [mini_wnid(d) for d in range(10)],
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    say(f"wrote {len(train_idx)} train and {len(val_idx)} val JPEGs ({image_size}x{image_size}) to {root}")


def mini_ready(root: Path, image_size: int) -> bool:
    manifest = read_manifest(root)
    return bool(manifest and manifest.get("format_version") == MINI_FORMAT_VERSION
                and manifest.get("image_size") == image_size and not layout_problems(root))


def indexes(data_dir: Path) -> tuple[ImageIndex, ImageIndex, int]:
    """Train and val, without the images `prepare --verify` found bad; and how many it skipped."""
    train = scan_split(data_dir, "train")
    val = scan_split(data_dir, "val", train.classes)
    bad = bad_images(data_dir, [train, val])
    return without(train, bad), without(val, bad), len(bad)


class _ImageFolders(DataSource):
    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / "val", len(indexes(data_dir)[1].paths)  # without the images --verify found bad


class Digits(_ImageFolders):
    """The mini: real handwritten digits written as an ImageNet-style folder of JPEGs."""

    generated = True

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def problems(self, data_dir: Path) -> list[str]:
        if mini_ready(data_dir, self.image_size):
            return []
        return [f"{data_dir}: mini dataset not generated yet (trainperf prepare resnet)"]

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        if mini_ready(data_dir, self.image_size):
            say(f"mini dataset already present in {data_dir}")
            return
        generate_mini(data_dir, image_size=self.image_size, say=say)


class ImageNetFolder(_ImageFolders):
    """ILSVRC-2012 as train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (the reference's layout)."""

    def problems(self, data_dir: Path) -> list[str]:
        problems = layout_problems(data_dir)
        if not problems:
            try:
                indexes(data_dir)  # a list of bad images that no longer describes the folder
            except TrainperfError as exc:
                problems.append(str(exc))
        return problems

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = layout_problems(data_dir)
        if problems:
            more = f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise TrainperfError(problems[0] + more)
        train, val, skipped = indexes(data_dir)
        say(f"{data_dir}: {len(train.paths)} train images in {len(train.classes)} classes, "
            f"{len(val.paths)} val images")
        if skipped:
            say(f"{skipped} images that do not decode are skipped ({data_dir / BAD_IMAGES})")
        if (len(train.paths), len(val.paths), len(train.classes)) != (IMAGENET_TRAIN, IMAGENET_VAL,
                                                                      IMAGENET_CLASSES):
            say(f"note: ILSVRC-2012 has {IMAGENET_TRAIN} train / {IMAGENET_VAL} val images in "
                f"{IMAGENET_CLASSES} classes; results on this copy are not comparable to MLPerf's")

    def verify(self, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]) -> list[str]:
        problems = layout_problems(data_dir)
        if problems:
            raise TrainperfError(problems[0])
        record = verify_images(data_dir, workers, progress)
        # A name that is not UTF-8 is shown as a Python literal (printing it as it is fails on a UTF-8 terminal).
        return [f"{shown(str(data_dir / item['path']), limit=4096)}: {item['reason']}" for item in record["bad"]]
