"""Mask R-CNN R50-FPN on COCO 2017 (MLPerf key `maskrcnn`, ruleset 1.0.0), and its mini scale on the
synthetic shapes (with polygon masks, shapes never covering each other). Two metrics, one target: box
AP >= 0.377 and mask AP >= 0.339, logged as {"BBOX": ..., "SEGM": ...}; both scored by pycocotools
off the training path."""

from __future__ import annotations

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
    LengthBuckets,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    StepProbe,
    bare_model,
)
from trainperf.optim import kernels
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import loading as coco_loading
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import Detector
from trainperf.workloads.maskrcnn import model as maskrcnn_model
from trainperf.workloads.maskrcnn import weights as maskrcnn_weights
from trainperf.workloads.maskrcnn.recipes import COCO_CLASSES, COCO_COUNTS, FULL_RECIPES, MINI, MaskRCNNRecipe

DATA = coco_loading.DetectionData("maskrcnn", coco.COCO2017, "COCO 2017", *COCO_COUNTS, COCO_CLASSES - 1, masks=True,
                       mini_overlap=False)


def lr_factor(recipe: MaskRCNNRecipe) -> Callable[[int], float]:
    """The multiplier of base_lr at optimizer step `step` (from 0): the reference's WarmupMultiStepLR."""

    def factor(step: int) -> float:
        decay = recipe.decay_factor ** sum(step >= s for s in recipe.decay_steps)
        if step < recipe.warmup_steps:
            alpha = step / recipe.warmup_steps
            return (recipe.warmup_factor * (1 - alpha) + alpha) * decay
        return decay

    return factor


def param_groups(model: nn.Module, recipe: MaskRCNNRecipe) -> list[dict[str, Any]]:
    """Weights at the base LR with weight decay; biases at bias_lr_factor x the LR without (the
    reference's make_optimizer). Frozen parameters are left out."""
    weights, biases = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (biases if name.endswith(".bias") else weights).append(p)
    return [{"params": weights, "lr": recipe.base_lr, "weight_decay": recipe.weight_decay},
            {"params": biases, "lr": recipe.base_lr * recipe.bias_lr_factor, "weight_decay": 0.0}]


def _forward(model: nn.Module, batch: Any) -> list[dict[str, torch.Tensor]]:
    # torchvision's evaluation (thresholds, NMS: data-dependent shapes) runs eagerly, never compiled.
    return bare_model(model)(batch[0])


class MaskRCNNWorkload(Detector[MaskRCNNRecipe]):
    name = "maskrcnn"
    mlperf = MLPerf(ruleset="1.0.0", runs=5, full_epoch_samples=117_266, full_eval_forwards=5_000,
                    full_eval_samples=5_000)
    benchmark = "maskrcnn"
    metric = Metric("map", higher_is_better=True, parts=("BBOX", "SEGM"))
    summary = "Mask R-CNN R50-FPN on COCO 2017, box AND mask AP (mini: a small Mask R-CNN on shapes with masks)"
    speedups = frozenset({"precision", "channels_last", "fused_optimizer", "async_eval", "static_shapes", "compile",
                          "cuda_graphs"})
    # Its box-and-mask COCO evaluation takes 47 s on one thread: the steps alone (its scoring is tested apart).
    golden = GoldenSpec(evaluate=False)
    step_probe = ("global_batch_size=2", "min_image_size=320", "max_image_size=512")
    # 2,934: had 45 data-dependent shapes (torchvision's RPN and RoI heads selecting proposals and samples,
    # 2,269 ops); the sync-free heads select by masks over fixed slots (workloads/maskrcnn/syncfree.py).
    step_budget = StepBudget(ops=3_230, also=(StepProbe(
        "static shapes", ("static_shapes=true",), host_data=1,
        why="the images' sizes (known on the host) copied from pinned memory without a wait"),))
    device_probe = DeviceProbe(batch=8)
    real_layout = ("annotations/instances_train2017.json", "train2017/000000000009.jpg")
    dataset = DATA
    mini = Scale(MINI, coco_loading.Shapes(DATA))
    full = Scale(FULL_RECIPES, coco_loading.Folder(DATA))
    background = 1
    sample_name = "images"

    def reference_devices(self, recipe: MaskRCNNRecipe) -> int:
        # The RCP runs kept 6 images per accelerator (BS 8 and 16: 1 and 2 each, on 8).
        return recipe.global_batch_size // 6 if recipe.global_batch_size > 16 else 8

    def mlperf_hyperparameters(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        # A logged figure, not the data dealt out: the reference's images per accelerator, rounded down where
        # its RCP runs did not divide the batch evenly (64 images on 10 accelerators: 6 each).
        devices = ctx.world_size
        per_process = max(1, recipe.global_batch_size // devices)
        return {
            "opt_base_learning_rate": recipe.base_lr,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps,
            "opt_learning_rate_warmup_factor": recipe.warmup_factor,
            "opt_learning_rate_decay_factor": recipe.decay_factor,
            "opt_learning_rate_decay_steps": list(recipe.decay_steps),
            # The rules count proposals per accelerator's batch: torchvision keeps them per image.
            "num_image_candidates": recipe.candidates * per_process,
            "min_image_size": recipe.min_image_size,
            "max_image_size": recipe.max_image_size,
        }

    def initialized_tensors(self, recipe: MaskRCNNRecipe, model: nn.Module) -> list[str]:
        return maskrcnn_model.reference_tensor_names(model)

    def divergence_hint(self, recipe: MaskRCNNRecipe, scale: str) -> str | None:
        if recipe.model == "maskrcnn" and not recipe.backbone_weights:
            return ("expected without pretrained weights: the reference learning rate assumes an ImageNet-trained "
                    "ResNet-50 body; give one with --set backbone_weights=PATH")
        return None

    def notes(self, recipe: MaskRCNNRecipe, scale: str) -> list[str]:
        if recipe.model != "maskrcnn":
            return []
        if not recipe.backbone_weights:
            return ["no --set backbone_weights=PATH: the ResNet-50 body starts from random weights, the reference "
                    "from ImageNet ones; this run is not comparable to MLPerf"]
        if maskrcnn_weights.convention(recipe.backbone_weights, recipe.backbone_format) == maskrcnn_weights.TORCHVISION:
            return [f"backbone weights {recipe.backbone_weights}: torchvision's convention (RGB input normalised, "
                    "strides in the 3x3 convolutions: ResNet v1.5), not the reference's MSRA R-50 (R-50.pkl: "
                    "BGR 0..255, strides in the 1x1); the run departs from the reference in its body"]
        return []

    def build(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if recipe.model == "mini":
            model: nn.Module = maskrcnn_model.mini_maskrcnn(recipe.num_classes, recipe.min_image_size, recipe.width,
                                               recipe.fpn_channels, recipe.representation, recipe.candidates,
                                               recipe.rois, recipe.max_detections, recipe.mask_channels,
                                               recipe.mask_pool)
        else:
            weights = None
            kind = maskrcnn_weights.convention(recipe.backbone_weights, recipe.backbone_format)
            if "backbone weights" in assets:
                from torchvision.models import resnet50

                like = {k: v for k, v in resnet50().state_dict().items() if not k.startswith("fc.")}
                if kind == maskrcnn_weights.MSRA and assets["backbone weights"].suffix == ".pkl":
                    weights = maskrcnn_weights.read_detectron(assets["backbone weights"])
                    assets.check_like(assets["backbone weights"], weights, like, "Detectron's ResNet-50")
                else:
                    weights = assets.state_dict("backbone weights", like=like, what="torchvision's resnet50")
            model = maskrcnn_model.maskrcnn_resnet50_fpn(
                recipe.num_classes, recipe.min_image_size, recipe.max_image_size, recipe.candidates,
                self.input_format(recipe) == "bgr255", weights, msra_strides=kind != maskrcnn_weights.TORCHVISION)
            model.roi_heads.fg_bg_sampler.batch_size_per_image = recipe.rois
            model.roi_heads.detections_per_img = recipe.max_detections
        model.rpn.nms_iterations = recipe.nms_iterations
        model = maskrcnn_model.unpasted(model).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.SGD(param_groups(model, recipe), lr=recipe.base_lr, momentum=recipe.momentum, **impl)
        buckets = LengthBuckets.from_recipe("bucket_boxes", recipe.bucket_boxes) if recipe.bucketed else None
        sizes = maskrcnn_model.image_buckets(recipe.min_image_size, recipe.max_image_size)

        def loss_fn(model: nn.Module, batch: tuple[Any, list[dict[str, torch.Tensor]], Any]) -> torch.Tensor:
            images, targets = batch[0], batch[1]
            if buckets is not None:  # the resizing and padding run eagerly, before the compiled model
                images, targets = bare_model(model).static_inputs(images, targets, buckets, sizes)
            losses = model(images, targets)
            return sum(losses.values())

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=_forward,
                          lr_schedule=lambda steps_per_epoch: lr_factor(recipe), eval_compiles=False)

    def synthetic_batch(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        size = recipe.min_image_size
        images, targets, positions = coco_loading.synthetic_batch(ctx.batch_share(recipe.global_batch_size), size,
                                                       (1, recipe.num_classes), ctx.device)
        for t in targets:
            x0, y0, x1, y1 = t["boxes"][0].round().int().tolist()
            mask = torch.zeros(1, size, size, dtype=torch.uint8, device=ctx.device)
            mask[:, y0:y1, x0:x1] = 1
            t["masks"] = mask
        return self._input(recipe, images), targets, positions

    def shape_buckets(self, recipe: MaskRCNNRecipe) -> dict[str, Any] | None:
        if not recipe.bucketed:
            return None
        sizes = maskrcnn_model.image_buckets(recipe.min_image_size, recipe.max_image_size)
        boxes = LengthBuckets.from_recipe("bucket_boxes", recipe.bucket_boxes)
        return boxes.describe(
            shapes=len(boxes.lengths) * len(sizes), what="boxes per image",
            images=" | ".join(f"{h} x {w}" for h, w in sizes) + " (padded batches)",
            padding="boxes marked absent: they match no anchor or proposal; image padding as torchvision's")

    def synthetic_batches(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, model: nn.Module) -> list[Any]:
        if not recipe.bucketed:
            return [self.synthetic_batch(recipe, ctx, model)]
        per_process = ctx.batch_share(recipe.global_batch_size)
        short, long = recipe.min_image_size, recipe.max_image_size
        # Images whose resized batch is each image bucket: landscape, portrait, then (two or more images) both.
        shapes = [[(short, long)] * per_process] if short == long else [
            [(short, long)] * per_process, [(long, short)] * per_process]
        if short != long and per_process > 1:
            shapes.append([(short, long), *[(long, short)] * (per_process - 1)])
        return [self._synthetic(recipe, ctx, sizes, boxes) for sizes in shapes for boxes in recipe.bucket_boxes]

    def _synthetic(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, sizes: list[tuple[int, int]], boxes: int
                   ) -> Any:
        """A batch of images of these sizes, each with `boxes` copies of one box and its mask."""
        generator = torch.Generator().manual_seed(0)
        images, targets = [], []
        for h, w in sizes:
            images.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator).to(ctx.device))
            mask = torch.zeros(boxes, h, w, dtype=torch.uint8, device=ctx.device)
            mask[:, h // 4:h // 2, w // 4:w // 2] = 1
            box = torch.tensor([[w // 4, h // 4, w // 2, h // 2]], dtype=torch.float32).repeat(boxes, 1)
            labels = torch.ones(boxes, dtype=torch.int64, device=ctx.device)
            targets.append({"boxes": box.to(ctx.device), "labels": labels, "masks": mask})
        return self._input(recipe, images), targets, list(range(len(sizes)))

    # -- data -----------------------------------------------------------------------------------
    @staticmethod
    def input_format(recipe: MaskRCNNRecipe) -> str:
        """bgr255 | rgb: the recipe's, or the backbone weights' convention's (weights.py)."""
        if recipe.model == "mini":
            return "rgb" if recipe.input_format == "auto" else recipe.input_format
        return maskrcnn_weights.input_format(recipe.input_format, recipe.backbone_weights, recipe.backbone_format)

    @staticmethod
    def _input(recipe: MaskRCNNRecipe, images: torch.Tensor | list[torch.Tensor]) -> Any:
        """uint8 RGB images as the model's input: BGR 0..255 (the reference) or RGB 0..1."""

        bgr255 = MaskRCNNWorkload.input_format(recipe) == "bgr255"

        def one(x: torch.Tensor) -> torch.Tensor:
            return x.flip(-3).float() if bgr255 else x.float().div_(255)

        return [one(x) for x in images] if isinstance(images, list) else one(images)

    def loaders(self, recipe: MaskRCNNRecipe, train: coco.CocoIndex, val: coco.CocoIndex, ctx: RuntimeContext
                ) -> coco_loading.Loaders:
        """mini: resident in memory with masks rasterised once; full: DataLoader workers rasterise each
        image's masks and flip them with it (the reference's only augmentation); the model resizes."""
        device = ctx.device

        def to_input(images: torch.Tensor | list[torch.Tensor]) -> Any:
            if isinstance(images, list):
                return self._input(recipe, [im.to(device, non_blocking=True) for im in images])
            return self._input(recipe, images.to(device, non_blocking=True))

        if recipe.model == "mini":
            return coco_loading.resident(train, val, ctx, recipe.global_batch_size, recipe.hflip,
                                         recipe.eval_batch_size,
                              to_input, label_base=1)
        from trainperf.workloads.maskrcnn import transforms as maskrcnn_transforms

        return coco_loading.streamed(train, val, ctx, recipe.global_batch_size, recipe.num_workers,
                          maskrcnn_transforms.train_transform(recipe.hflip), maskrcnn_transforms.eval_transform(),
                          recipe.eval_batch_size, to_input,
                          label_base=1)

    def evaluation(self, recipe: MaskRCNNRecipe, val: coco.CocoIndex, ctx: RuntimeContext,
                   batches: Callable[[], Iterator[tuple[Any, list[int]]]],
                   metric: Callable[[dict[str, Any]], Any]) -> Callable[..., EvalPartial]:
        """Detections as COCO rows, and each one's mask as the head's MxM probabilities (float16): the
        scoring process pastes them into their boxes at the image's size, thresholds and RLE-encodes
        them (`scoring.box_and_mask_ap`), off the training path with --async-eval."""
        category_ids = np.array(val.category_ids)

        def evaluate(forward: Callable[[Any], list[dict[str, torch.Tensor]]]) -> EvalPartial:
            kept = coco_loading.DeviceDetections()
            for images, positions in batches():
                for found, i in zip(forward((images, None, positions)), positions, strict=True):
                    kept.add(i, boxes=found["boxes"].float(), scores=found["scores"].float(), labels=found["labels"],
                             masks=found["masks"][:, 0].to(torch.float16))
            rows: list[np.ndarray] = []
            masks: list[np.ndarray] = []
            for i, found in kept.on_host():
                labels = found["labels"]
                known = (labels >= 1) & (labels <= len(category_ids))  # classes nobody annotated: unscorable
                rows.append(scoring.detection_rows(val.image_ids[i], found["boxes"][known], found["scores"][known],
                                                   category_ids[labels[known] - 1]))
                masks.append(found["masks"][known])
            return EvalPartial(metric=metric, objects={"detections": rows, "masks": masks})

        return evaluate


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = MaskRCNNWorkload
