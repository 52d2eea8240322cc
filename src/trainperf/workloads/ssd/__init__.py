"""SSD-ResNet34 on COCO 2017 (MLPerf key `ssd`, the v0.7–v1.1 form), and its mini scale on synthetic
shapes written in COCO format. COCO box AP by pycocotools, scored off the training path."""

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
    GoldenSpec,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    per_epoch_schedule,
)
from trainperf.optim import kernels
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import loading as coco_loading
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import Detector
from trainperf.workloads.ssd import model as ssd_model
from trainperf.workloads.ssd.recipes import FULL_RECIPES, MINI, SSDRecipe

LAYOUT = coco.COCO2017
COCO_TRAIN_IMAGES = 117_266  # train2017 images with at least one non-crowd box (the reference's count)
DATA = coco_loading.DetectionData("ssd", LAYOUT, "COCO 2017", COCO_TRAIN_IMAGES, 5000, 80)
MINI_SIZE, MINI_COUNTS = coco.MINI_SIZE, coco.MINI_COUNTS
MINI_BOXES = ssd_model.DefaultBoxSpec(fig_size=MINI_SIZE, feat_sizes=(8, 4, 2, 1), steps=(8, 16, 32, 64),
                              scales=(9, 16, 26, 40, 60), aspect_ratios=((2,), (2,), (2,), (2,)))
# ImageNet normalisation (the trunk is an ImageNet network), on 0-255 pixels.
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def lr_factor(recipe: SSDRecipe, steps_per_epoch: int) -> Callable[[int], float]:
    """The multiplier of base_lr * GBS / 32 at each step: the MLPerf warmup ramp, then steps down at
    the decay epochs (the reference), or a cosine to 0 at max_epochs (mini)."""
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    boundaries = [round(e * steps_per_epoch) for e in recipe.decay_epochs]
    total = max(1, recipe.max_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return 1.0 - (warmup - step) / (warmup * 2 ** recipe.warmup_factor)
        if recipe.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
        return recipe.decay_factor ** sum(step >= b for b in boundaries)

    return factor


def _coder(recipe: SSDRecipe, device: torch.device) -> ssd_model.BoxCoder:
    """The default boxes of the recipe's model, as a box coder."""
    if recipe.model == "mini":
        return ssd_model.BoxCoder(MINI_BOXES, device)
    return ssd_model.BoxCoder(ssd_model.DefaultBoxSpec(**{**ssd_model.SSD300_BOXES.__dict__,
                                                          "fig_size": recipe.image_size}), device)


def _normalize(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() - mean) / std


def _forward(model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation forward: box and class outputs of every default box (decoded after)."""
    return model(batch[0])


class SSDWorkload(Detector[SSDRecipe]):
    name = "ssd"
    eval_without_empty_images = True  # the reference evaluates 4,952 of val2017's 5,000 images
    mlperf = MLPerf(ruleset="1.0.0", runs=5, full_epoch_samples=117_266, full_eval_forwards=4_952,
                    full_eval_samples=4_952)
    benchmark = "ssd"
    summary = "SSD-ResNet34 on COCO 2017, box AP (mini: a small SSD on synthetic shapes in COCO format)"
    # its matching had 3 boolean-mask indexes
    step_budget = StepBudget(ops=820)
    device_probe = DeviceProbe(batch=32)
    real_layout = ("annotations/instances_val2017.json", "val2017/000000000139.jpg", "train2017/000000000009.jpg")
    speedups = frozenset({"precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer", "async_eval"})
    # Its COCO evaluation (10 s on one thread) is RetinaNet's code, whose golden record evaluates.
    golden = GoldenSpec(evaluate=False)
    dataset = DATA
    mini = Scale(MINI, coco_loading.Shapes(DATA))
    full = Scale(FULL_RECIPES, coco_loading.Folder(DATA))
    background = 1

    def mlperf_hyperparameters(self, recipe: SSDRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        steps_per_epoch = math.ceil((COCO_TRAIN_IMAGES if recipe.model == "ssd300" else MINI_COUNTS[0])
                                    / recipe.global_batch_size)
        return {
            # The run's rate, as the reference logs it (0.08 at 1,024 images): the recipe's is per 32 images.
            "opt_base_learning_rate": recipe.base_lr * recipe.global_batch_size / 32,
            "opt_weight_decay": recipe.weight_decay,
            "opt_learning_rate_warmup_steps": max(1, round(recipe.warmup_epochs * steps_per_epoch)),
            "opt_learning_rate_warmup_factor": recipe.warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": list(recipe.decay_epochs),
            "max_samples": recipe.crop_trials,
            # BatchNorm statistics are per process: the span is the per-process micro-batch.
            "model_bn_span": recipe.global_batch_size // (ctx.world_size * recipe.grad_accum_steps),
        }

    def divergence_hint(self, recipe: SSDRecipe, scale: str) -> str | None:
        if recipe.model == "ssd300" and not recipe.backbone_weights:
            return ("expected without pretrained weights: the reference learning rate assumes an ImageNet-trained "
                    "ResNet-34 body; give one with --set backbone_weights=PATH")
        return None

    def notes(self, recipe: SSDRecipe, scale: str) -> list[str]:
        if recipe.model == "ssd300" and not recipe.backbone_weights:
            return ["no --set backbone_weights=PATH: the ResNet-34 trunk starts from random weights, the reference "
                    "from ImageNet ones (torchvision's resnet34 state dict); this run is not comparable to MLPerf"]
        return []

    def build(self, recipe: SSDRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if recipe.model == "mini":
            model: nn.Module = ssd_model.mini_ssd(recipe.num_classes, MINI_BOXES, recipe.width)
        else:
            weights = None
            if "backbone weights" in assets:
                from torchvision.models import resnet34

                weights = assets.state_dict("backbone weights", like=resnet34().state_dict(),
                                            what="torchvision's resnet34")
            model = ssd_model.ssd300(recipe.num_classes, weights)
        model = model.to(ctx.device)
        coder = _coder(recipe, ctx.device)
        lr = recipe.base_lr * recipe.global_batch_size / 32
        if recipe.optimizer == "adamw":
            impl = kernels(recipe.fused_optimizer)
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr,
                                                                 weight_decay=recipe.weight_decay, **impl)
        else:
            impl = kernels(recipe.fused_optimizer)
            optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=recipe.momentum,
                                        weight_decay=recipe.weight_decay, **impl)
        size = recipe.image_size

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, list[dict[str, torch.Tensor]], Any]
                    ) -> torch.Tensor:
            images, targets = batch[0], batch[1]
            loc, conf = model(images)
            matched, labels = coder.match_batch([t["boxes"] / size for t in targets], [t["labels"] for t in targets])
            return ssd_model.ssd_loss(loc, conf, coder.encode(matched), labels)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=_forward,
                          lr_schedule=per_epoch_schedule(self.name, lambda steps: lr_factor(recipe, steps)))

    def synthetic_batch(self, recipe: SSDRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        images, targets, positions = coco_loading.synthetic_batch(ctx.batch_share(recipe.global_batch_size),
                                                                  recipe.image_size,
                                                       (1, recipe.num_classes), ctx.device)
        return _normalize(images), targets, positions

    # -- data -----------------------------------------------------------------------------------
    def evaluation(self, recipe: SSDRecipe, val: coco.CocoIndex, ctx: RuntimeContext,
                   batches: Callable[[], Iterator[tuple[torch.Tensor, list[int]]]],
                   metric: Callable[[dict[str, Any]], float]) -> Callable[..., EvalPartial]:
        """Detections decoded from the default boxes, as COCO rows in original pixels."""
        coder = _coder(recipe, ctx.device)
        category_ids = np.array(val.category_ids)

        def evaluate(forward: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]) -> EvalPartial:
            kept = coco_loading.DeviceDetections()
            for images, positions in batches():
                loc, conf = forward((images, None, positions))
                found = ssd_model.postprocess(coder, loc, conf, recipe.score_threshold, recipe.nms_iou,
                                      max_detections=recipe.max_detections)
                for (boxes, scores, labels), i in zip(found, positions, strict=True):
                    kept.add(i, boxes=boxes.float(), scores=scores.float(), labels=labels)
            rows: list[np.ndarray] = []  # one array per image
            for i, found in kept.on_host():
                # A model with more classes than the data has categories (the reference's 81 on a smaller
                # tree) may predict classes nobody annotated: they cannot be scored.
                labels = found["labels"]
                known = labels <= len(category_ids)
                height, width = val.sizes[i]
                boxes = found["boxes"][known].astype(np.float64) * np.array([width, height, width, height])
                rows.append(scoring.detection_rows(val.image_ids[i], boxes, found["scores"][known],
                                                   category_ids[labels[known] - 1]))
            return EvalPartial(metric=metric, objects={"detections": rows})

        return evaluate

    def loaders(self, recipe: SSDRecipe, train: coco.CocoIndex, val: coco.CocoIndex,
                ctx: RuntimeContext) -> coco_loading.Loaders:
        """mini: resident in memory, flips only; full: DataLoader workers, the reference augmentation."""
        device = ctx.device

        def to_input(images: torch.Tensor) -> torch.Tensor:
            return _normalize(images.to(device, non_blocking=True))

        if recipe.model == "mini":
            return coco_loading.resident(train, val, ctx, recipe.global_batch_size, recipe.hflip,
                                         recipe.eval_batch_size,
                              to_input)
        from trainperf.workloads.ssd import transforms as ssd_transforms

        return coco_loading.streamed(train, val, ctx, recipe.global_batch_size, recipe.num_workers,
                          ssd_transforms.train_transform(recipe.image_size, recipe.crop_trials, recipe.hflip,
                                                         recipe.color_jitter),
                          ssd_transforms.eval_transform(recipe.image_size), recipe.eval_batch_size, to_input)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = SSDWorkload
