"""What every COCO-format detector workload shares: the recipe fields of its data and evaluation, and
the workload methods that only depend on them (data checks, preparation, backbone weights, reading
the splits into DataParts). A detector supplies its model, its loaders' input conversion and its
evaluation."""

from __future__ import annotations

import importlib.util
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from trainperf.contract import DataParts, EvalPartial, Metric, Recipe, RuntimeContext, Workload
from trainperf.contract.fields import Count
from trainperf.errors import TrainperfError
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import loading as coco_loading
from trainperf.workloads.common.coco import scoring


@dataclass(frozen=True)
class DetectorRecipe(Recipe):
    num_classes: Count = 81
    image_size: Count = 300
    hflip: bool = True
    backbone_weights: str = ""  # a torchvision ImageNet state dict of the backbone (the references start from one)
    num_workers: int = 8
    eval_batch_size: Count = 64
    max_detections: Count = 200
    # COCO AP by pycocotools (the reference), or faster-coco-eval (the same AP to 1e-4 on our tests, ~9x
    # faster here; `pip install trainperf[coco-fast]`).
    coco_backend: str = "pycocotools"

    def validate(self) -> None:
        super().validate()
        if self.max_detections < 1 or self.eval_batch_size < 1:
            raise TrainperfError("recipe: need max_detections >= 1 and eval_batch_size >= 1")
        if self.coco_backend == "faster-coco-eval" and importlib.util.find_spec("faster_coco_eval") is None:
            raise TrainperfError("coco_backend=faster-coco-eval: not installed (pip install 'trainperf[coco-fast]')")


D = TypeVar("D", bound=DetectorRecipe)


class Detector(Workload[D]):
    """A detector on a COCO-format dataset, scored by COCO box AP in a worker process when asynchronous."""

    dataset: ClassVar[coco_loading.DetectionData]
    background: ClassVar[int]  # 1: the model's class 0 is the background (labels from 1); 0: none
    metric = Metric("box_ap", higher_is_better=True)
    # COCO AP is Python-heavy (pycocotools): scored in a worker process with --async-eval.
    host_scoring = "process"
    # Whether evaluation skips the validation images without a box, as training does. SSD's reference does
    # (its COCO dataset drops them for both splits: 4,952 of val2017's 5,000 images evaluated and logged as
    # eval_samples); RetinaNet's and Mask R-CNN's drop them for training only. An image left out has no
    # ground truth: only detections the model would make on it would count (as false positives).
    eval_without_empty_images: ClassVar[bool] = False

    def assets(self, recipe: D, data_dir: Path | None) -> dict[str, Path]:
        return {"backbone weights": Path(recipe.backbone_weights).expanduser()} if recipe.backbone_weights else {}

    def synthetic_eval_batch(self, recipe: D, ctx: RuntimeContext, model: Any) -> Any:
        images, targets, positions = self.synthetic_batch(recipe, ctx, model)
        n = min(recipe.eval_batch_size, len(positions))
        return images[:n], targets[:n], positions[:n]

    def load_data(self, recipe: D, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        train, val = self.dataset.read(data_dir)
        if len(train.category_ids) + self.background > recipe.num_classes:
            background = ", background included" if self.background else ""
            raise TrainperfError(f"{train.annotation_file}: {len(train.category_ids)} categories, but the model has "
                                 f"{recipe.num_classes - self.background} (--set num_classes=N{background})")
        train = train.without_empty_images()
        if self.eval_without_empty_images:
            val = val.without_empty_images()
        loaders = self.loaders(recipe, train, val, ctx)
        metric = scoring.metric(val.annotation_file, val.image_ids, recipe.coco_backend, masks=self.dataset.masks)
        return DataParts(train_batches=lambda view: loaders.train_batches(view.epoch),
                         steps_per_epoch=loaders.steps_per_epoch,
                         train_samples=loaders.steps_per_epoch * recipe.global_batch_size, eval_samples=len(val),
                         evaluate=self.evaluation(recipe, val, ctx, loaders.val_batches, metric))

    @abstractmethod
    def loaders(self, recipe: D, train: coco.CocoIndex, val: coco.CocoIndex,
                ctx: RuntimeContext) -> coco_loading.Loaders:
        """The batches, images converted to the model's input (labels from `background`)."""

    @abstractmethod
    def evaluation(self, recipe: D, val: coco.CocoIndex, ctx: RuntimeContext,
                   batches: Callable[[], Iterator[tuple[Any, list[int]]]],
                   metric: Callable[[dict[str, Any]], float]) -> Callable[..., EvalPartial]:
        """evaluate(forward): inference on this process's share of val, detections as COCO rows."""
