"""ImageNet's image operations: the workers' transforms, batched decoding and augmentation on the device,
and the in-memory (resident) crops of the mini."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from trainperf.errors import TrainperfError, shown

RGB_MEANS = (123.68, 116.78, 103.94)


class Labelled(Protocol):
    """Image files and their class labels (data.ImageIndex is one)."""

    paths: list[Path]
    labels: list[int]


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
    def __init__(self, index: Labelled, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.index = index
        self.transform = transform

    def __len__(self) -> int:
        return len(self.index.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(decode(self.index.paths[i])), self.index.labels[i]


CROPS = ("reference", "torchvision")
# The reference's tf.image.sample_distorted_bounding_box arguments (image_classification/tensorflow2).
MIN_OBJECT_COVERED, ASPECT_RANGE, REFERENCE_ATTEMPTS = 0.1, (0.75, 1.33), 100


def reference_crop_box(height: int, width: int, min_area: float, uniform: Callable[[], float]
                       ) -> tuple[int, int, int, int]:
    """(top, left, height, width) drawn as TensorFlow's sample_distorted_bounding_box draws it for the
    reference: the whole image as the only box, min_object_covered 0.1 (so no crop under 10 % of the
    image, whatever `min_area`), aspect (width/height) uniform in [0.75, 1.33), then the height a uniform
    integer between the area range's bounds for that aspect, the width rounded from it; 100 attempts,
    else the whole image. `uniform()` returns a float in [0, 1)."""
    image_area = float(height * width)
    lo, hi = min_area * image_area, image_area
    for _ in range(REFERENCE_ATTEMPTS):
        aspect = ASPECT_RANGE[0] + uniform() * (ASPECT_RANGE[1] - ASPECT_RANGE[0])
        h = int(np.rint(np.sqrt(lo / aspect)))
        max_h = int(np.rint(np.sqrt(hi / aspect)))
        if np.rint(max_h * aspect) > width:  # the widest crop must still fit: TF's same correction
            max_h = int((width + 0.5 - 1e-7) / aspect)
            if np.rint(max_h * aspect) > width:
                max_h -= 1
        max_h = min(max_h, height)
        h = min(h, max_h)
        if h < max_h:
            h += int(uniform() * (max_h - h + 1))
        w = int(np.rint(h * aspect))
        if w * h < lo:  # rounding fixes, as TF tries them
            h += 1
            w = int(np.rint(h * aspect))
        if w * h > hi:
            h -= 1
            w = int(np.rint(h * aspect))
        area = w * h
        if not (lo <= area <= hi and 0 < w <= width and 0 < h <= height):
            continue
        if area / image_area < MIN_OBJECT_COVERED:
            continue
        top = int(uniform() * (height - h)) if h < height else 0
        left = int(uniform() * (width - w)) if w < width else 0
        return top, left, h, w
    return 0, 0, height, width


class ReferenceResizedCrop(torch.nn.Module):
    """The reference's distorted crop (`reference_crop_box`, torch's generator: a DataLoader worker's
    seed) resized to the training size without keeping the aspect."""

    def __init__(self, size: int, min_area: float) -> None:
        super().__init__()
        self.size, self.min_area = size, min_area

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        height, width = image.shape[-2:]
        top, left, h, w = reference_crop_box(height, width, self.min_area, lambda: float(torch.rand(())))
        return v2.functional.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)


def train_transform(image_size: int, min_area: float, crop: str = "reference"
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The training augmentation: distorted crop resized to the training size (aspect not kept), random
    horizontal flip. crop="reference": the reference's TensorFlow sampling (`reference_crop_box`);
    "torchvision": RandomResizedCrop's (area uniform in min_area-1, aspect log-uniform in 3/4-4/3, 10
    attempts, else a centre crop), as NVIDIA's DALI pipelines sample."""
    cropper = (ReferenceResizedCrop(image_size, min_area) if crop == "reference" else
               v2.RandomResizedCrop(image_size, scale=(min_area, 1.0), ratio=(3 / 4, 4 / 3), antialias=True))
    return v2.Compose([cropper, v2.RandomHorizontalFlip()])


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

    def __init__(self, index: Labelled) -> None:
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
               attempts: int = 10, crop: str = "torchvision") -> list[tuple[int, int, int, int]]:
    """crop="reference": `reference_crop_box` for each image. Else torchvision's RandomResizedCrop
    sampling, for a batch at once on the host from the images' sizes (no value is read back from the
    device): (top, left, height, width) of a crop of area min_area-1 of the image and aspect 3/4-4/3,
    tried `attempts` times, else the centre crop of the aspect clamped to that range."""
    if crop == "reference":
        return [reference_crop_box(h, w, min_area, rng.random) for h, w in sizes]
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
def load_resident(index: Labelled, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
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
