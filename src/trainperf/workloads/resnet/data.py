"""ImageNet in the standard folder layout: scanning, decoding, loaders, and the mini generator.

Both scales read the same layout (`train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG`) with the same
scanning and decoding code. `full` streams it through DataLoader workers with per-sample
torchvision transforms; `mini` decodes it once into memory and augments whole batches with tensor
ops (the MLPerf winners keep datasets resident on the device).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from trainperf.contract import DataParts, DataSource, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError, shown
from trainperf.files import AtomicOutput, write_json_atomic
from trainperf.loaders import DevicePrefetcher, one_line_errors
from trainperf.workloads.resnet import images as resnet_images
from trainperf.workloads.resnet.images import decode

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
SPLITS = ("train", "val")
# The reference subtracts the ImageNet RGB means (0-255 scale) and does not divide by a std.
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

    skips_unreadable = True  # verify_images keeps the list the loaders honour

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


# -- the pipelines: what load_data opens -----------------------------------------------------------
def top1(totals: dict[str, torch.Tensor]) -> float:
    return totals["correct"].item() / max(totals["count"].item(), 1)


def open_imagenet(recipe: Any, data_dir: Path, ctx: RuntimeContext) -> DataParts:
    """The training stream and the evaluation of a ResNet recipe (after run_start): images resident on the
    device (the mini), decoded by DataLoader workers, or read by the workers and decoded on the device."""
    train_index, val_index, _skipped = indexes(data_dir)
    if len(train_index.classes) > recipe.num_classes:
        raise TrainperfError(f"{data_dir / 'train'}: {len(train_index.classes)} classes, but the model has "
                             f"{recipe.num_classes} outputs (--set num_classes=N)")
    kind = ResidentImages if recipe.in_memory else DeviceDecoded if recipe.decode == "device" else WorkerDecoded
    return kind(recipe, train_index, val_index, ctx).parts()


class _Pipeline:
    def __init__(self, recipe: Any, train: ImageIndex, val: ImageIndex, ctx: RuntimeContext) -> None:
        self.recipe, self.train, self.val, self.ctx = recipe, train, val, ctx
        self.device = ctx.device
        self.mean = resnet_images.channel_means(ctx.device)

    def parts(self) -> DataParts:
        raise NotImplementedError

    def _count(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
        """Top-1 over normalized (images, labels) batches, counted on the device."""
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        count = torch.zeros((), dtype=torch.long, device=self.device)
        for images, labels in batches:
            correct += (forward((images, labels)) == labels).sum()
            count += labels.shape[0]
        return EvalPartial(metric=top1, sums={"correct": correct, "count": count})


class ResidentImages(_Pipeline):
    """The whole (small) dataset on the device, augmented there: the mini's pipeline."""

    def parts(self) -> DataParts:
        recipe, ctx = self.recipe, self.ctx
        train_x, train_y = resnet_images.load_resident(self.train, self.device)
        val_x, val_y = resnet_images.load_resident(self.val, self.device)
        # Every process draws the same global order (same seed); each takes its share of every global batch,
        # so the global batches do not depend on the number of processes.
        order_gen, aug_gen = ctx.generator("order"), ctx.generator("augment", per_rank=True)
        n, batch = train_x.shape[0], recipe.global_batch_size
        # A last global batch smaller than the number of processes would leave a process empty-handed.
        usable = n if n % batch >= ctx.world_size or n % batch == 0 else n - n % batch
        shard = ctx.shard(val_x.shape[0])
        val_x, val_y = val_x[shard.start:shard.stop], val_y[shard.start:shard.stop]

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            order = torch.randperm(n, device=self.device, generator=order_gen)[:usable]
            for start in range(0, usable, batch):
                global_idx = order[start:start + batch]
                mine = ctx.shard(global_idx.shape[0])
                idx = global_idx[mine.start:mine.stop]
                images = resnet_images.random_resized_crop(train_x[idx].float(), recipe.min_crop_area, recipe.hflip,
                                                           aug_gen)
                yield resnet_images.normalize(images, self.mean), train_y[idx]

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            size = recipe.eval_batch_size
            return self._count(((resnet_images.normalize(val_x[s:s + size], self.mean), val_y[s:s + size])
                                for s in range(0, val_x.shape[0], size)), forward)

        return DataParts(train_batches=train_batches, steps_per_epoch=-(-usable // batch), train_samples=usable,
                         eval_samples=len(self.val.paths), evaluate=evaluate)


class _WorkerLoaded(_Pipeline):
    """Files read by DataLoader workers: the same global order on any number of processes (the sampler
    deals each global batch out), this process's share of the evaluation set."""

    def loaders(self, train_set: Dataset, val_set: Dataset, collate: Callable[..., Any] | None = None
                ) -> tuple[DistributedSampler, DataLoader, DataLoader]:
        recipe, ctx = self.recipe, self.ctx
        workers, per_process = recipe.num_workers, ctx.batch_share(recipe.global_batch_size)
        extra: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
        if collate is not None:
            extra["collate_fn"] = collate
        pin = self.device.type == "cuda"
        sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                     seed=ctx.stream_seed("order") % 2**31, drop_last=True)
        train = DataLoader(train_set, batch_size=per_process, sampler=sampler, num_workers=workers, pin_memory=pin,
                           drop_last=len(sampler) >= per_process, **extra)
        mine = Subset(val_set, list(ctx.shard(len(self.val.paths))))
        val = DataLoader(mine, batch_size=recipe.eval_batch_size, shuffle=False, num_workers=workers, pin_memory=pin,
                         **extra)
        return sampler, train, val


class WorkerDecoded(_WorkerLoaded):
    """decode=workers: the workers decode (Pillow) and augment each image."""

    def parts(self) -> DataParts:
        recipe, device, mean = self.recipe, self.device, self.mean
        train_set = resnet_images.FolderDataset(self.train, resnet_images.train_transform(recipe.image_size,
                                                                                          recipe.min_crop_area,
                                                                                          recipe.crop))
        val_set = resnet_images.FolderDataset(self.val, resnet_images.eval_transform(recipe.image_size,
                                                                                     recipe.eval_resize))
        sampler, train_loader, val_loader = self.loaders(train_set, val_set)
        train_feed, val_feed = DevicePrefetcher(train_loader, device), DevicePrefetcher(val_loader, device)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            sampler.set_epoch(view.epoch)
            for images, labels in train_feed:
                yield resnet_images.normalize(images.to(device), mean), labels.to(device)

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            return self._count(((resnet_images.normalize(images.to(device), mean), labels.to(device))
                                for images, labels in val_feed), forward)

        return DataParts(train_batches=train_batches, steps_per_epoch=len(train_loader),
                         train_samples=len(train_set), eval_samples=len(self.val.paths), evaluate=evaluate)


class DeviceDecoded(_WorkerLoaded):
    """decode=device: the workers read the files' bytes; the device decodes each batch and augments it (the
    crop boxes drawn on the host from the images' sizes: no value comes back from the device)."""

    def decoded(self, datas: list[torch.Tensor], rows: list[int], index: ImageIndex) -> list[torch.Tensor]:
        return resnet_images.decode_batch(datas, [index.paths[i] for i in rows], self.device)

    def parts(self) -> DataParts:
        recipe, device, mean = self.recipe, self.device, self.mean
        train_set = resnet_images.RawFolder(self.train)
        sampler, train_loader, val_loader = self.loaders(train_set, resnet_images.RawFolder(self.val),
                                                         resnet_images.collate_raw)
        seed = self.ctx.stream_seed("augment", per_rank=True)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            sampler.set_epoch(view.epoch)
            rng = np.random.default_rng([seed, view.epoch])
            for datas, labels, rows in one_line_errors(train_loader):
                images = self.decoded(datas, rows, self.train)
                boxes = resnet_images.crop_boxes([tuple(im.shape[-2:]) for im in images], recipe.min_crop_area, rng,
                                                 crop=recipe.crop)
                flips = (rng.random(len(images)) < 0.5).tolist() if recipe.hflip else [False] * len(images)
                batch = resnet_images.crop_resize(images, boxes, recipe.image_size, flips)
                yield resnet_images.normalize(batch, mean), labels.to(device, non_blocking=True)

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            size, resize = recipe.image_size, recipe.eval_resize
            return self._count(((resnet_images.normalize(resnet_images.resize_center_crop(
                self.decoded(datas, rows, self.val), resize, size), mean), labels.to(device, non_blocking=True))
                for datas, labels, rows in one_line_errors(val_loader)), forward)

        return DataParts(train_batches=train_batches, steps_per_epoch=len(train_loader),
                         train_samples=len(train_set), eval_samples=len(self.val.paths), evaluate=evaluate)
