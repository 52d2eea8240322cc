"""COCO-format detection data: per split a folder of images and a COCO instances file, where the
dataset's `Layout` puts them (COCO 2017: `<root>/<split>/*.jpg` and `<root>/annotations/
instances_<split>.json`; OpenImages-MLPerf: `<root>/<split>/data/*.jpg` and `<root>/<split>/labels/
openimages-mlperf.json`).

The instances file is read and checked once: a missing file, an annotation naming an unknown image or
category, or an image entry whose file is missing is one line naming it. What the MLPerf references
silently repair is repaired the same way and counted: boxes are clamped to their image, and boxes
empty after clamping are skipped. Crowd boxes and, for training, images left without any box are
dropped, as the references do. Category ids (COCO's are not contiguous) map to labels 1..C in
increasing id order; 0 is the background.

Batches are `(images, targets)`: images a tensor [N, 3, H, W] (or a list of differently sized ones),
targets a list of {"boxes": [n, 4] xyxy pixels, "labels": [n]} dicts — one per sample, which is how
trainperf's default batch rules split and count them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from trainperf.errors import TrainperfError, shown
from trainperf.files import AtomicOutput
from trainperf.workloads.common.coco.masks import check_segmentation, rasterize

MINI_FORMAT_VERSION = 1
MANIFEST = "trainperf_coco.json"


@dataclass(frozen=True)
class Layout:
    """Where a COCO-format dataset keeps each split's images and instances file (paths under the
    root, `{split}` replaced by the split's name)."""

    splits: tuple[str, str]  # (train, val)
    images: str
    annotations: str

    def image_dir(self, root: Path, split: str) -> Path:
        return root / self.images.format(split=split)

    def annotation_file(self, root: Path, split: str) -> Path:
        return root / self.annotations.format(split=split)


COCO2017 = Layout(("train2017", "val2017"), "{split}", "annotations/instances_{split}.json")
OPENIMAGES_MLPERF = Layout(("train", "validation"), "{split}/data", "{split}/labels/openimages-mlperf.json")


@dataclass
class CocoIndex:
    """One split of a COCO-format dataset, checked: per image its file, size and boxes."""

    root: Path
    split: str
    annotation_file: Path
    image_ids: list[int]
    files: list[Path]
    sizes: list[tuple[int, int]]  # (height, width)
    boxes: list[np.ndarray]  # per image [n, 4] float32 xyxy in pixels (crowd boxes excluded)
    labels: list[np.ndarray]  # per image [n] int64, 1..C
    category_ids: list[int]  # label k is COCO category category_ids[k - 1]
    category_names: list[str]
    skipped: int = 0  # annotations whose box was empty once clamped to its image
    crowd: int = 0  # crowd annotations (not trained on; COCOeval ignores their matches)
    # With masks: per image, each box's checked segmentation (polygons or RLE, see masks.py).
    segmentations: list[list[Any]] | None = None
    no_mask: int = 0  # annotations dropped because every polygon had fewer than 3 points

    def __len__(self) -> int:
        return len(self.image_ids)

    def without_empty_images(self) -> CocoIndex:
        """For training: images with no box left are dropped (the references do)."""
        keep = [i for i, b in enumerate(self.boxes) if len(b)]
        segmentations = None if self.segmentations is None else [self.segmentations[i] for i in keep]
        return CocoIndex(self.root, self.split, self.annotation_file, [self.image_ids[i] for i in keep],
                         [self.files[i] for i in keep], [self.sizes[i] for i in keep],
                         [self.boxes[i] for i in keep], [self.labels[i] for i in keep], self.category_ids,
                         self.category_names, self.skipped, self.crowd, segmentations, self.no_mask)


def _fail(path: Path, what: str) -> TrainperfError:
    return TrainperfError(f"{path}: {what}")


def read_instances(root: Path, split: str, category_ids: list[int] | None = None, layout: Layout = COCO2017,
                   masks: bool = False) -> CocoIndex:
    """Read and check a split's instances file and the images it names. `category_ids` fixes the
    label order (val uses train's). With `masks`, every kept annotation's segmentation is checked and
    kept too (`masks.check_segmentation`)."""
    path = layout.annotation_file(root, split)
    if not path.is_file():
        raise _fail(path, f"missing (expected a COCO instances file for {split}/)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"not a JSON file ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations",
                                                                                         "categories")):
        raise _fail(path, "not a COCO instances file (expected lists 'images', 'annotations', 'categories')")
    categories: dict[int, str] = {}
    for cat in data["categories"]:
        if not isinstance(cat, dict) or not _is_int(cat.get("id")):
            raise _fail(path, f"category {shown(str(cat))}: expected an integer 'id'")
        categories[cat["id"]] = str(cat.get("name", cat["id"]))
    if category_ids is None:
        category_ids = sorted(categories)
    label_of = {cid: k + 1 for k, cid in enumerate(category_ids)}
    image_dir = layout.image_dir(root, split)
    if not image_dir.is_dir():
        raise _fail(image_dir, "missing folder (the images of the instances file)")
    present = {entry.name for entry in os.scandir(image_dir)}
    row_of: dict[int, int] = {}
    image_ids, files, sizes = [], [], []
    for image in data["images"]:
        if not isinstance(image, dict) or not _is_int(image.get("id")) or not isinstance(image.get("file_name"), str) \
                or not _is_int(image.get("width")) or not _is_int(image.get("height")) \
                or image["width"] < 1 or image["height"] < 1:
            raise _fail(path, f"image {shown(str(image))}: expected integer id, width, height and a file_name")
        if image["id"] in row_of:
            raise _fail(path, f"image id {image['id']} appears twice")
        if image["file_name"] not in present:
            raise _fail(image_dir / image["file_name"], f"missing (image id {image['id']} in {path.name})")
        row_of[image["id"]] = len(image_ids)
        image_ids.append(image["id"])
        files.append(image_dir / image["file_name"])
        sizes.append((image["height"], image["width"]))
    per_image: list[list[tuple[list[float], int, Any]]] = [[] for _ in image_ids]
    skipped = crowd = no_mask = 0
    for ann in data["annotations"]:
        if not isinstance(ann, dict):
            raise _fail(path, f"annotation {shown(str(ann))}: expected an object")
        ann_id = ann.get("id")
        if ann.get("image_id") not in row_of:
            raise _fail(path, f"annotation {ann_id}: unknown image_id {shown(str(ann.get('image_id')))}")
        if ann.get("category_id") not in label_of:
            raise _fail(path, f"annotation {ann_id}: unknown category_id {shown(str(ann.get('category_id')))}")
        bbox = ann.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
            raise _fail(path, f"annotation {ann_id}: expected bbox [x, y, width, height], got {shown(str(bbox))}")
        row = row_of[ann["image_id"]]
        height, width = sizes[row]
        if ann.get("iscrowd", 0):
            # Not trained on, but COCO AP ignores the detections that fall on a crowd region: a crowd
            # RLE of the wrong size or runs would change the score without a word.
            if masks and "segmentation" in ann:
                check_segmentation(ann["segmentation"], ann_id, height, width, path)
            crowd += 1
            continue
        x0, y0 = min(max(bbox[0], 0.0), width), min(max(bbox[1], 0.0), height)
        x1, y1 = min(max(bbox[0] + bbox[2], 0.0), width), min(max(bbox[1] + bbox[3], 0.0), height)
        if x1 <= x0 or y1 <= y0:
            skipped += 1
            continue
        segmentation = None
        if masks:
            if "segmentation" not in ann:
                raise _fail(path, f"annotation {ann_id}: no segmentation (this workload trains masks)")
            segmentation = check_segmentation(ann["segmentation"], ann_id, height, width, path)
            if segmentation is None:
                no_mask += 1
                continue
        per_image[row].append(([x0, y0, x1, y1], label_of[ann["category_id"]], segmentation))
    boxes = [np.array([a[0] for a in anns], dtype=np.float32).reshape(-1, 4) for anns in per_image]
    labels = [np.array([a[1] for a in anns], dtype=np.int64) for anns in per_image]
    return CocoIndex(root=root, split=split, annotation_file=path, image_ids=image_ids, files=files, sizes=sizes,
                     boxes=boxes, labels=labels, category_ids=list(category_ids),
                     category_names=[categories.get(c, str(c)) for c in category_ids], skipped=skipped, crowd=crowd,
                     segmentations=[[a[2] for a in anns] for anns in per_image] if masks else None, no_mask=no_mask)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def layout_problems(root: Path, layout: Layout = COCO2017) -> list[str]:
    """What is missing in a COCO-format tree, one line each (the files are checked by read_instances)."""
    if not root.is_dir():
        return [f"{root}: folder does not exist (expected " + ", ".join(
            f"{layout.images.format(split=s)}/ and {layout.annotations.format(split=s)}" for s in layout.splits) + ")"]
    problems = []
    for split in layout.splits:
        folder = layout.image_dir(root, split)
        if not folder.is_dir():
            problems.append(f"{folder}: missing folder (expected {layout.images.format(split=split)}/*.jpg)")
        if not layout.annotation_file(root, split).is_file():
            problems.append(f"{layout.annotation_file(root, split)}: missing (expected a COCO instances file)")
    return problems


def decode(path: Path) -> torch.Tensor:
    """An image file as a uint8 RGB tensor [3, H, W]; a bad file is one line naming it."""
    try:
        with Image.open(path) as img:
            return torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainperfError(f"{path}: cannot decode image ({reason})") from None


class CocoDetection(Dataset):
    """Samples (image, target, i) of an index through `transform(image, boxes, labels)` ->
    (image, boxes, labels); `i` is the position in the index (for evaluation)."""

    def __init__(self, index: CocoIndex, transform: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                 ) -> None:
        self.index, self.transform = index, transform

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        image = decode(self.index.files[i])
        height, width = self.index.sizes[i]
        if tuple(image.shape[1:]) != (height, width):
            raise TrainperfError(f"{self.index.files[i]}: image is {image.shape[2]}x{image.shape[1]}, its annotation "
                                 f"says {width}x{height}")
        boxes, labels = torch.from_numpy(self.index.boxes[i]), torch.from_numpy(self.index.labels[i])
        if self.index.segmentations is None:
            image, boxes, labels = self.transform(image, boxes, labels)
            return image, {"boxes": boxes, "labels": labels}, i
        masks = torch.from_numpy(rasterize(self.index.segmentations[i], height, width))
        image, boxes, labels, masks = self.transform(image, boxes, labels, masks)
        return image, {"boxes": boxes, "labels": labels, "masks": masks}, i


def collate(samples: list[tuple[torch.Tensor, dict[str, torch.Tensor], int]]) -> tuple[Any, list, list[int]]:
    """Images stacked when they share a size (else a list), targets and positions as lists."""
    images = [s[0] for s in samples]
    stacked = torch.stack(images) if len({tuple(im.shape) for im in images}) == 1 else images
    return stacked, [s[1] for s in samples], [s[2] for s in samples]


# ---------------------------------------------------------------------------------------------
# the mini dataset: shapes on textured, noisy backgrounds, written in COCO format
# ---------------------------------------------------------------------------------------------
# COCO's category ids are not contiguous: the mini ones are not either, so the mapping is exercised.
MINI_CATEGORIES = {1: "square", 3: "disc", 7: "triangle", 9: "cross"}
MINI_SIZE, MINI_COUNTS = 64, (2000, 500)  # generated once by `prepare`: no recipe can change them


def _shape_polygon(kind: str, x0: float, y0: float, size: float) -> list[tuple[float, float]]:
    x1, y1 = x0 + size, y0 + size
    if kind == "square":
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    if kind == "triangle":
        return [(x0 + size / 2, y0), (x1, y1), (x0, y1)]
    if kind == "cross":
        a, b = x0 + size / 3, x0 + 2 * size / 3
        c, d = y0 + size / 3, y0 + 2 * size / 3
        return [(a, y0), (b, y0), (b, c), (x1, c), (x1, d), (b, d), (b, y1), (a, y1), (a, d), (x0, d), (x0, c), (a, c)]
    angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)  # disc
    r = size / 2
    return [(x0 + r + r * np.cos(t), y0 + r + r * np.sin(t)) for t in angles]


def _polygon_area(points: list[tuple[float, float]]) -> float:
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """A smooth random colour gradient with noise and faint strokes: texture the detector must ignore."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = rng.uniform(40, 200, 3)
    slope = rng.uniform(-60, 60, (2, 3))
    pixels = base + xx[..., None] * slope[0] + yy[..., None] * slope[1] + rng.normal(0, 12, (size, size, 3))
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.integers(2, 6)):
        points = [tuple(rng.uniform(0, size, 2)) for _ in range(2)]
        draw.line(points, fill=tuple(int(v) for v in rng.uniform(0, 255, 3)), width=int(rng.integers(1, 3)))
    return img


def _mini_image(rng: np.random.Generator, size: int, image_id: int, first_ann: int, overlap: bool = True
                ) -> tuple[Image.Image, list[dict]]:
    """One image of 1-4 shapes. With overlap, later shapes may cover earlier ones (whose polygons
    then include hidden parts: fine for boxes); without, each shape's square is drawn where it
    intersects no earlier one (up to 20 draws, else the shape is left out), so every polygon is its
    object's visible mask."""
    img = _background(rng, size)
    draw = ImageDraw.Draw(img)
    anns: list[dict] = []
    placed: list[tuple[float, float, float]] = []
    for _ in range(int(rng.integers(1, 5))):
        category = int(rng.choice(list(MINI_CATEGORIES)))
        side = float(rng.uniform(0.16, 0.5) * size)
        x0, y0 = (float(v) for v in rng.uniform(0, size - side, 2))
        if not overlap:
            for _ in range(20):
                if all(x0 + side <= px or px + ps <= x0 or y0 + side <= py or py + ps <= y0 for px, py, ps in placed):
                    break
                x0, y0 = (float(v) for v in rng.uniform(0, size - side, 2))
            else:
                continue
            placed.append((x0, y0, side))
        k = len(anns)
        polygon = _shape_polygon(MINI_CATEGORIES[category], x0, y0, side)
        colour = tuple(int(v) for v in rng.uniform(0, 255, 3))
        draw.polygon(polygon, fill=colour, outline=tuple(255 - c for c in colour))
        xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
        bx, by = min(xs), min(ys)
        anns.append({"id": first_ann + k, "image_id": image_id, "category_id": category,
                     "bbox": [round(bx, 2), round(by, 2), round(max(xs) - bx, 2), round(max(ys) - by, 2)],
                     "area": round(_polygon_area(polygon), 2), "iscrowd": 0,
                     "segmentation": [[round(v, 2) for point in polygon for v in point]]})
    return img, anns


def generate_mini(root: Path, layout: Layout, counts: tuple[int, int], size: int = 64, seed: int = 0,
                  say: Callable[[str], None] = print, overlap: bool = True) -> None:
    """Write the mini dataset in the layout (JPEGs and COCO instances files), as one atomic folder: an
    interrupted generation leaves nothing that looks prepared."""
    rng = np.random.default_rng(seed)
    next_image, next_ann = 1, 1
    with AtomicOutput(root, directory=True) as tmp:
        for split, count in zip(layout.splits, counts, strict=True):
            layout.image_dir(tmp, split).mkdir(parents=True)
            layout.annotation_file(tmp, split).parent.mkdir(parents=True, exist_ok=True)
            images, anns = [], []
            for _ in range(count):
                img, objects = _mini_image(rng, size, next_image, next_ann, overlap)
                name = f"{next_image:012d}.jpg"
                img.save(layout.image_dir(tmp, split) / name, quality=92)
                images.append({"id": next_image, "file_name": name, "width": size, "height": size})
                anns.extend(objects)
                next_image, next_ann = next_image + 1, next_ann + len(objects)
            instances = {"info": {"description": "trainperf mini detection (synthetic shapes)"},
                         "images": images, "annotations": anns,
                         "categories": [{"id": c, "name": n, "supercategory": "shape"}
                                        for c, n in MINI_CATEGORIES.items()]}
            layout.annotation_file(tmp, split).write_text(json.dumps(instances))
        manifest = _manifest(size, counts, seed, overlap)
        (tmp / MANIFEST).write_text(json.dumps(manifest))
    say(f"wrote {counts[0]} train and {counts[1]} val images ({size}x{size}, COCO format) to {root}")


def _manifest(size: int, counts: tuple[int, int], seed: int, overlap: bool) -> dict[str, Any]:
    manifest = {"format_version": MINI_FORMAT_VERSION, "size": size, "counts": list(counts), "seed": seed}
    return manifest if overlap else {**manifest, "overlap": False}


def mini_ready(root: Path, size: int, counts: tuple[int, int], overlap: bool = True) -> bool:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest == _manifest(size, counts, 0, overlap)
