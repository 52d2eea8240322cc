"""What a detector's dataset is, for every detector alike: checked and prepared (mini or full), read into
memory or streamed by DataLoader workers, and the synthetic batches of `bench`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.workloads.common.coco.data import (
    MINI_COUNTS,
    MINI_SIZE,
    CocoDetection,
    CocoIndex,
    Layout,
    collate,
    decode,
    generate_mini,
    layout_problems,
    mini_ready,
    read_instances,
)
from trainperf.workloads.common.coco.masks import rasterize


@dataclass(frozen=True)
class DetectionData:
    """A detector's dataset: its layout, and the real dataset's name and sizes (train images with
    boxes, val images, classes), so that `prepare` can say when a copy differs from MLPerf's."""

    workload: str
    layout: Layout
    dataset: str
    train_images: int
    val_images: int
    classes: int
    masks: bool = False  # instance segmentations read too (Mask R-CNN)
    mini_overlap: bool = True  # whether the mini's shapes may cover each other

    def read(self, root: Path) -> tuple[CocoIndex, CocoIndex]:
        """Both splits, checked; val's labels follow train's categories."""
        train = read_instances(root, self.layout.splits[0], layout=self.layout, masks=self.masks)
        return train, read_instances(root, self.layout.splits[1], train.category_ids, layout=self.layout,
                                     masks=self.masks)


class _DetectionSource(DataSource):
    def __init__(self, data: DetectionData) -> None:
        self.data = data

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        # The evaluation split alone (train's annotations are ten times larger), without its masks.
        val = read_instances(data_dir, self.data.layout.splits[1], layout=self.data.layout)
        return val.annotation_file, len(val.without_empty_images())  # no annotated object: AP is undefined


class Shapes(_DetectionSource):
    """The mini: synthetic shapes on noise, written as JPEGs with COCO-format annotations in the real
    dataset's layout."""

    generated = True

    def ready(self, root: Path) -> bool:
        return mini_ready(root, MINI_SIZE, MINI_COUNTS, self.data.mini_overlap)

    def problems(self, data_dir: Path) -> list[str]:
        if self.ready(data_dir):
            return []
        return [f"{data_dir}: mini dataset not generated yet (trainperf prepare {self.data.workload})"]

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        if self.ready(data_dir):
            say(f"mini dataset already present in {data_dir}")
            return
        generate_mini(data_dir, self.data.layout, MINI_COUNTS, MINI_SIZE, say=say, overlap=self.data.mini_overlap)


class Folder(_DetectionSource):
    """The real dataset in its COCO-format layout: checked, both splits read, what was repaired reported."""

    def problems(self, data_dir: Path) -> list[str]:
        return layout_problems(data_dir, self.data.layout)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        data = self.data
        problems = layout_problems(data_dir, data.layout)
        if problems:
            raise TrainperfError(problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        train, val = data.read(data_dir)
        used = train.without_empty_images()
        say(f"{data_dir}: {len(used)} train images with boxes (of {len(train)}), {len(val)} {val.split} images, "
            f"{len(train.category_ids)} categories")
        for index in (train, val):
            if index.skipped or index.crowd:
                say(f"  {index.annotation_file}: {index.skipped} empty boxes skipped, {index.crowd} crowd (group) "
                    "boxes not trained on (as the reference)")
        if (len(used), len(val), len(train.category_ids)) != (data.train_images, data.val_images, data.classes):
            say(f"note: {data.dataset} has {data.train_images} train images with boxes and {data.val_images} "
                f"{val.split} images of {data.classes} categories; results on this copy are not comparable to "
                "MLPerf's")



def synthetic_batch(n: int, size: int, labels: tuple[int, int], device: torch.device
                    ) -> tuple[torch.Tensor, Targets, list[int]]:
    """A random batch shaped like real ones (uint8 images, one box each, labels in [low, high)), for
    warm-up, compilation and throughput runs."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), generator=gen, dtype=torch.uint8).to(device)
    targets = []
    for _ in range(n):
        xy = torch.rand(2, 2, generator=gen) * size
        box = torch.cat([xy.min(0).values, xy.max(0).values + 4]).clamp(max=size).unsqueeze(0)
        label = torch.randint(labels[0], labels[1], (1,), generator=gen)
        targets.append({"boxes": box.to(device), "labels": label.to(device)})
    return images, targets, list(range(n))


# ---------------------------------------------------------------------------------------------
# batches: the same loaders for every detector (each says how its images enter the model)
# ---------------------------------------------------------------------------------------------
Targets = list[dict[str, torch.Tensor]]


@dataclass
class Loaders:
    """A detector's batches: train_batches(epoch) -> (images, targets, positions) on the device;
    val_batches() -> (images, positions) of this process's share of val (positions index `val`)."""

    train_batches: Callable[[int], Any]
    val_batches: Callable[[], Any]
    steps_per_epoch: int


def resident(train: CocoIndex, val: CocoIndex, ctx: Any, batch: int, hflip: bool, eval_batch: int,
             images: Callable[[torch.Tensor], torch.Tensor], label_base: int = 1) -> Loaders:
    """Small datasets (mini): every image decoded once into device memory, batches flipped as whole
    tensors. `images` turns uint8 batches into the model's input; labels count from `label_base`."""
    device = ctx.device
    train_x = torch.stack([decode(p) for p in train.files]).to(device)
    val_x = torch.stack([decode(p) for p in val.files]).to(device)
    width = train_x.shape[-1]
    boxes = [torch.from_numpy(b).to(device) for b in train.boxes]
    labels = [torch.from_numpy(lab - 1 + label_base).to(device) for lab in train.labels]
    masks = None if train.segmentations is None else [
        torch.from_numpy(rasterize(s, *hw)).to(device) for s, hw in zip(train.segmentations, train.sizes, strict=True)]
    order_gen, aug_gen = ctx.generator("order"), ctx.generator("augment", per_rank=True)
    n = len(train)
    steps = n // batch  # whole global batches: static shapes
    mine, shard = ctx.shard(batch), ctx.shard(len(val))

    def train_batches(epoch: int) -> Any:
        order = torch.randperm(n, device=device, generator=order_gen)
        for s in range(steps):
            idx = order[s * batch:(s + 1) * batch][mine.start:mine.stop]
            flip = (torch.rand(idx.shape[0], device=device, generator=aug_gen) < 0.5) & hflip
            x = torch.where(flip.view(-1, 1, 1, 1), train_x[idx].flip(3), train_x[idx])
            targets = []
            for i, f in zip(idx.tolist(), flip.tolist(), strict=True):
                b = boxes[i]
                if f:
                    b = torch.stack([width - b[:, 2], b[:, 1], width - b[:, 0], b[:, 3]], dim=1)
                targets.append({"boxes": b, "labels": labels[i]})
                if masks is not None:
                    targets[-1]["masks"] = masks[i].flip(-1) if f else masks[i]
            yield images(x), targets, idx.tolist()

    def val_batches() -> Any:
        for start in range(shard.start, shard.stop, eval_batch):
            positions = list(range(start, min(start + eval_batch, shard.stop)))
            yield images(val_x[positions[0]:positions[-1] + 1]), positions

    return Loaders(train_batches, val_batches, steps)


def streamed(train: CocoIndex, val: CocoIndex, ctx: Any, batch: int, workers: int,
             train_transform: Callable[..., tuple[torch.Tensor, ...]],
             eval_transform: Callable[..., tuple[torch.Tensor, ...]], eval_batch: int,
             images: Callable[[Any], Any], label_base: int = 1) -> Loaders:
    """Full datasets: DataLoader workers decode and transform each image; each process reads its
    shard of train (reshuffled every epoch) and its contiguous share of val. `images` moves a collated
    batch (a tensor, or a list of differently sized images) to the model's input on the device."""
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from trainperf.loaders import one_line_errors

    device = ctx.device
    extra: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
    pin = device.type == "cuda"
    train_set = CocoDetection(train, train_transform)
    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                 seed=ctx.stream_seed("order") % 2**31, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=ctx.batch_share(batch), sampler=sampler, num_workers=workers,
                              pin_memory=pin, drop_last=True, collate_fn=collate, **extra)
    val_set = Subset(CocoDetection(val, eval_transform), list(ctx.shard(len(val))))
    val_loader = DataLoader(val_set, batch_size=eval_batch, shuffle=False, num_workers=workers, pin_memory=pin,
                            collate_fn=collate, **extra)
    shift = label_base - 1

    def to_device(targets: Targets) -> Targets:
        return [{**{k: v.to(device, non_blocking=True) for k, v in t.items()},
                 "labels": (t["labels"] + shift).to(device, non_blocking=True)} for t in targets]

    def train_batches(epoch: int) -> Any:
        sampler.set_epoch(epoch)
        for x, targets, positions in one_line_errors(train_loader):
            yield images(x), to_device(targets), positions

    def val_batches() -> Any:
        for x, _targets, positions in one_line_errors(val_loader):
            yield images(x), positions

    return Loaders(train_batches, val_batches, len(train_loader))


class DeviceDetections:
    """An evaluation's detections kept on the device that made them until the evaluation ends, then moved
    to the host in one transfer per field however many images it scored: on a GPU every `.cpu()` waits for
    the device, and one per image and field made the detectors' evaluations host-bound."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.counts: list[int] = []
        self.fields: dict[str, list[torch.Tensor]] = {}

    def add(self, position: int, **fields: torch.Tensor) -> None:
        """One image's detections (each field's first dimension: its detections), by its position in val."""
        self.positions.append(position)
        self.counts.append(int(next(iter(fields.values())).shape[0]))
        for name, tensor in fields.items():
            self.fields.setdefault(name, []).append(tensor)

    def on_host(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(position, {field: array}) per image, in the order added, after one transfer per field."""
        moved = {name: torch.cat(parts).cpu().numpy() for name, parts in self.fields.items()}
        start = 0
        for position, count in zip(self.positions, self.counts, strict=True):
            yield position, {name: array[start:start + count] for name, array in moved.items()}
            start += count
