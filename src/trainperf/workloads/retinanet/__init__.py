"""RetinaNet on OpenImages-MLPerf (the MLPerf v2.0 single-stage detector, logged as `ssd` under ruleset
2.0.0), and its mini scale on synthetic shapes written in the same layout. COCO box AP by pycocotools,
scored off the training path."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DeviceProbe,
    EvalPartial,
    LengthBuckets,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    bare_model,
    per_epoch_schedule,
)
from trainperf.optim import kernels
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import loading as coco_loading
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import Detector
from trainperf.workloads.retinanet import model as retinanet_model
from trainperf.workloads.retinanet.recipes import (
    FULL_RECIPES,
    MINI,
    OPENIMAGES_CLASSES,
    OPENIMAGES_COUNTS,
    RetinaNetRecipe,
)

LAYOUT = coco.OPENIMAGES_MLPERF
# OpenImages-MLPerf: 264 classes; train images with at least one box, and the validation subset.
DATA = coco_loading.DetectionData("retinanet", LAYOUT, "OpenImages-MLPerf", *OPENIMAGES_COUNTS, OPENIMAGES_CLASSES)
MINI_SIZE = coco.MINI_SIZE


def lr_factor(recipe: RetinaNetRecipe, steps_per_epoch: int) -> Callable[[int], float]:
    """The multiplier of base_lr at each step: the reference's linear warmup from warmup_factor, then
    constant (the reference) or a cosine to 0 at max_epochs (mini)."""
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    total = max(1, recipe.max_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            alpha = step / warmup
            return recipe.warmup_factor * (1 - alpha) + alpha
        if recipe.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
        return 1.0

    return factor


def _forward(model: nn.Module, batch: Any) -> list[dict[str, torch.Tensor]]:
    """The evaluation forward: post-processed detections (boxes in the input images' pixels)."""
    return model(batch[0])


class RetinaNetWorkload(Detector[RetinaNetRecipe]):
    name = "retinanet"
    mlperf = MLPerf(ruleset="2.0.0", runs=5, full_epoch_samples=1_170_301, full_eval_forwards=24_781,
                    full_eval_samples=24_781)
    benchmark = "ssd"  # the v2.0 round's key for RetinaNet
    # Logged as `ssd`, the key it was submitted under in the v2.0 round, whose rules are 2.0.0 (the key
    # meant SSD-ResNet34 under 1.0.0): its logs name the workload, so check and score know which.
    summary = "RetinaNet ResNeXt50-32x4d FPN on OpenImages-MLPerf, box AP (mini: a small RetinaNet on shapes)"
    speedups = frozenset({"precision", "channels_last", "fused_optimizer", "async_eval", "static_shapes", "compile",
                          "cuda_graphs"})
    step_probe = ("global_batch_size=2", "image_size=256")
    # had 7 syncs: one_hot's range check, nonzero, torchvision's box check
    step_budget = StepBudget(ops=2_200)
    device_probe = DeviceProbe(batch=16)
    real_layout = ("annotations/instances_val2017.json", "val2017/000000000139.jpg")
    dataset = DATA
    mini = Scale(MINI, coco_loading.Shapes(DATA))
    full = Scale(FULL_RECIPES, coco_loading.Folder(DATA))
    background = 0

    def mlperf_hyperparameters(self, recipe: RetinaNetRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_name": "adam",
            "opt_base_learning_rate": recipe.base_lr,
            "opt_weight_decay": recipe.weight_decay,
            "opt_learning_rate_warmup_epochs": recipe.warmup_epochs,
            "opt_learning_rate_warmup_factor": recipe.warmup_factor,
        }

    def initialized_tensors(self, recipe: RetinaNetRecipe, model: nn.Module) -> list[str]:
        return retinanet_model.reference_tensor_names(model)

    def divergence_hint(self, recipe: RetinaNetRecipe, scale: str) -> str | None:
        if recipe.model == "retinanet" and not recipe.backbone_weights:
            return ("expected without pretrained weights: the reference learning rate assumes an ImageNet-trained "
                    "ResNeXt50-32x4d body; give one with --set backbone_weights=PATH")
        return None

    def notes(self, recipe: RetinaNetRecipe, scale: str) -> list[str]:
        if recipe.model == "retinanet" and not recipe.backbone_weights:
            return ["no --set backbone_weights=PATH: the ResNeXt50-32x4d body starts from random weights, the "
                    "reference from ImageNet ones (torchvision's resnext50_32x4d state dict); this run is not "
                    "comparable to MLPerf"]
        return []

    def build(self, recipe: RetinaNetRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if recipe.model == "mini":
            model: nn.Module = retinanet_model.mini_retinanet(recipe.num_classes, recipe.image_size, recipe.width,
                                                recipe.fpn_channels, recipe.max_detections)
        else:
            weights = None
            if "backbone weights" in assets:
                from torchvision.models import resnext50_32x4d

                weights = assets.state_dict("backbone weights", like=resnext50_32x4d().state_dict(),
                                            what="torchvision's resnext50_32x4d")
            model = retinanet_model.retinanet_resnext50(recipe.num_classes, recipe.image_size, weights)
            model.detections_per_img = recipe.max_detections
        model = model.to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(trainable, lr=recipe.base_lr, weight_decay=recipe.weight_decay, **impl)

        buckets = LengthBuckets.from_recipe("bucket_boxes", recipe.bucket_boxes) if recipe.bucketed else None

        def loss_fn(model: nn.Module, batch: tuple[Any, list[dict[str, torch.Tensor]], Any]) -> torch.Tensor:
            images, targets = batch[0], batch[1]
            if buckets is not None:  # the resizing and padding run eagerly, before the compiled model
                images, targets = bare_model(model).static_inputs(images, targets, buckets)
            losses = model(images, targets)
            return losses["classification"] + losses["bbox_regression"]

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=_forward,
                          lr_schedule=per_epoch_schedule(self.name, lambda steps: lr_factor(recipe, steps)))

    def synthetic_batch(self, recipe: RetinaNetRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        images, targets, positions = coco_loading.synthetic_batch(ctx.batch_share(recipe.global_batch_size),
                                                                  recipe.image_size,
                                                       (0, recipe.num_classes), ctx.device)
        return images.float().div_(255), targets, positions

    def shape_buckets(self, recipe: RetinaNetRecipe) -> dict[str, Any] | None:
        if not recipe.bucketed:
            return None
        return LengthBuckets.from_recipe("bucket_boxes", recipe.bucket_boxes).describe(
            what="boxes per image", images=f"{recipe.image_size} x {recipe.image_size} (resized before the model)",
            padding="boxes marked absent: they match no anchor")

    def synthetic_batches(self, recipe: RetinaNetRecipe, ctx: RuntimeContext, model: nn.Module) -> list[Any]:
        if not recipe.bucketed:
            return [self.synthetic_batch(recipe, ctx, model)]
        found = []
        for boxes in recipe.bucket_boxes:  # the first image holds a bucket's worth of boxes: that bucket
            images, targets, positions = self.synthetic_batch(recipe, ctx, model)
            first = targets[0]
            targets = [{"boxes": first["boxes"].repeat(boxes, 1), "labels": first["labels"].repeat(boxes)},
                       *targets[1:]]
            found.append((images, targets, positions))
        return found

    # -- data -----------------------------------------------------------------------------------
    def loaders(self, recipe: RetinaNetRecipe, train: coco.CocoIndex, val: coco.CocoIndex, ctx: RuntimeContext
                 ) -> coco_loading.Loaders:
        """Images enter the model as float [0, 1] (it normalises and resizes them); labels count from 0
        (sigmoid classes). mini: resident in memory; full: DataLoader workers, flips only (the reference)."""
        device = ctx.device

        def to_input(images: torch.Tensor | list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
            if isinstance(images, list):  # differently sized images (full scale: the model resizes them)
                return [im.to(device, non_blocking=True).float().div_(255) for im in images]
            return images.to(device, non_blocking=True).float().div_(255)

        if recipe.model == "mini":
            return coco_loading.resident(train, val, ctx, recipe.global_batch_size, recipe.hflip,
                                         recipe.eval_batch_size,
                              to_input, label_base=0)
        from trainperf.workloads.retinanet import transforms as retinanet_transforms

        return coco_loading.streamed(train, val, ctx, recipe.global_batch_size, recipe.num_workers,
                          retinanet_transforms.train_transform(recipe.hflip), retinanet_transforms.eval_transform(),
                          recipe.eval_batch_size, to_input,
                          label_base=0)

    def evaluation(self, recipe: RetinaNetRecipe, val: coco.CocoIndex, ctx: RuntimeContext,
                   batches: Callable[[], Iterator[tuple[Any, list[int]]]],
                   metric: Callable[[dict[str, Any]], float]) -> Callable[..., EvalPartial]:
        """The model's post-processed detections (in input pixels: original sizes), as COCO rows."""
        category_ids = np.array(val.category_ids)

        def evaluate(forward: Callable[[Any], list[dict[str, torch.Tensor]]]) -> EvalPartial:
            kept = coco_loading.DeviceDetections()
            for images, positions in batches():
                for found, i in zip(forward((images, None, positions)), positions, strict=True):
                    kept.add(i, boxes=found["boxes"].float(), scores=found["scores"].float(), labels=found["labels"])
            rows: list[np.ndarray] = []  # one array per image
            for i, found in kept.on_host():
                # A model with more classes than the data has (the reference's 264 on a smaller tree) may
                # predict classes nobody annotated: they cannot be scored.
                known = found["labels"] < len(category_ids)
                rows.append(scoring.detection_rows(val.image_ids[i], found["boxes"][known], found["scores"][known],
                                                   category_ids[found["labels"][known]]))
            return EvalPartial(metric=metric, objects={"detections": rows})

        return evaluate


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = RetinaNetWorkload
