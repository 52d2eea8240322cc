"""Mask R-CNN R50-FPN on COCO 2017 (MLPerf key `maskrcnn`, ruleset 1.0.0), and its mini scale on the
synthetic shapes (with polygon masks, shapes never covering each other). Two metrics, one target: box
AP >= 0.377 and mask AP >= 0.339, logged as {"BBOX": ..., "SEGM": ...}; both scored by pycocotools
off the training path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.spec import Assets, EvalPartial, Metric, ModelParts, RuntimeContext
from trainperf.spec.fields import Count, Fraction, Positive, Share
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import loading as coco_loading
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import Detector, DetectorRecipe
from trainperf.workloads.maskrcnn import model as maskrcnn_model

COCO_CLASSES, COCO_COUNTS = 81, (117_266, 5_000)  # background included; train images with a valid annotation
DATA = coco_loading.DetectionData("maskrcnn", coco.COCO2017, "COCO 2017", *COCO_COUNTS, COCO_CLASSES - 1, masks=True,
                       mini_overlap=False)


@dataclass(frozen=True)
class MaskRCNNRecipe(DetectorRecipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps", "decay_steps")
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    target: tuple[float, ...]  # box AP and mask AP, both to be reached
    model: str = "maskrcnn"  # maskrcnn (the reference's R50-FPN) | mini
    num_classes: Count = COCO_CLASSES  # background included
    min_image_size: Count = 800
    max_image_size: Count = 1333
    # The reference feeds BGR 0..255 minus the Caffe2 means (its MSRA R-50 weights); torchvision's
    # ImageNet resnet50 weights expect rgb: RGB 0..1 normalised by their mean and std.
    input_format: str = "bgr255"
    # SGD with momentum; biases at bias_lr_factor x the LR and no weight decay (the reference's
    # BIAS_LR_FACTOR 2, WEIGHT_DECAY_BIAS 0). Linear warmup from warmup_factor over warmup_steps
    # (optimizer steps), then x decay_factor at each of decay_steps.
    base_lr: Positive = 0.02
    momentum: Fraction = 0.9
    weight_decay: float = 1e-4
    bias_lr_factor: float = 2.0
    warmup_steps: int = 500
    warmup_factor: float = 1.0 / 3
    decay_steps: tuple[int, ...] = (60_000, 80_000)
    decay_factor: Share = 0.1
    candidates: Count = 1000  # RPN post-NMS proposals per image in training (logged x images per process)
    max_detections: Count = 100
    eval_batch_size: Count = 8
    width: Count = 16  # mini body width
    fpn_channels: Count = 32  # mini FPN width
    representation: Count = 128  # mini box head FC width
    mask_channels: Count = 32  # mini mask head width (one convolution)
    mask_pool: Count = 7  # mini mask RoI size (its masks are twice that)
    rois: Count = 512  # RoIs sampled per image for the box and mask heads

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"model": ("maskrcnn", "mini"),
                                                     "input_format": ("bgr255", "rgb"),
                                                     "coco_backend": scoring.BACKENDS}

    def validate(self) -> None:
        super().validate()
        if self.base_lr <= 0 or self.warmup_steps < 0 or not 0 < self.warmup_factor <= 1:
            raise TrainperfError("recipe: need base_lr > 0, warmup_steps >= 0, 0 < warmup_factor <= 1")
        if list(self.decay_steps) != sorted(self.decay_steps) or not 0 < self.decay_factor <= 1:
            raise TrainperfError("recipe: decay_steps must increase and 0 < decay_factor <= 1")
        if self.candidates < 1 or self.rois < 1 or self.min_image_size < 1 or self.max_image_size < self.min_image_size:
            raise TrainperfError("recipe: need candidates >= 1, rois >= 1, 1 <= min_image_size <= max_image_size")


def _full(name: str, batch: int, lr: float, steps: tuple[int, int], warmup: int, factor: float,
          ruleset: str = "") -> MaskRCNNRecipe:
    return MaskRCNNRecipe(name=name, global_batch_size=batch, max_epochs=24, target=(0.377, 0.339), eval_every=1,
                          eval_first=1, base_lr=lr, decay_steps=steps, warmup_steps=warmup, warmup_factor=factor,
                          eval_batch_size=8, ruleset=ruleset)


# The reference's config (e2e_mask_rcnn_R_50_FPN_1x at 16 images: LR 0.02, 500 warmup steps from 1/3,
# decay at 60k and 80k), then the RCP points of mlperf_logging's rcps_maskrcnn.json: 1.0.0's, and
# 2.0.0's BS 8, whose LR 0.02/2 only the 2.0.0 rules allow (1.0.0: a multiple of 0.02), so the recipe
# names its ruleset.
FULL_RECIPES: dict[str, MaskRCNNRecipe] = {r.name: r for r in (
    _full("reference", 16, 0.02, (60_000, 80_000), 500, 1.0 / 3),
    _full("rcp-8", 8, 0.01, (144_000, 192_000), 500, 2e-05, ruleset="2.0.0"),
    _full("rcp-48", 48, 0.06, (24_000, 32_000), 800, 9.6e-05),
    _full("rcp-64", 64, 0.08, (18_000, 24_000), 800, 0.0001),
    _full("rcp-96", 96, 0.12, (12_000, 16_000), 625, 0.000192),
    _full("rcp-128", 128, 0.16, (9_000, 12_000), 625, 0.000256),
    _full("rcp-256", 256, 0.24, (5_625, 7_500), 1800, 0.000133),
    _full("rcp-272", 272, 0.24, (5_294, 7_058), 1800, 0.000133),
)}

MINI = MaskRCNNRecipe(name="mini", global_batch_size=16, max_epochs=12, target=(0.70, 0.58), eval_every=1,
                      eval_first=2, model="mini", num_classes=len(coco.MINI_CATEGORIES) + 1,
                      min_image_size=coco.MINI_SIZE,
                      max_image_size=coco.MINI_SIZE, input_format="rgb", base_lr=0.04, weight_decay=1e-4,
                      warmup_steps=100, warmup_factor=1e-3, decay_steps=(1000, 1250), candidates=300, rois=32,
                      num_workers=0, eval_batch_size=100, channels_last=False)


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
    return model(batch[0])


class MaskRCNNWorkload(Detector[MaskRCNNRecipe]):
    name = "maskrcnn"
    full_epoch_samples = 117_266
    full_eval_forwards = 5_000
    full_eval_samples = 5_000
    benchmark = "maskrcnn"
    ruleset = "1.0.0"
    metric = Metric("map", higher_is_better=True, parts=("BBOX", "SEGM"))
    summary = "Mask R-CNN R50-FPN on COCO 2017, box AND mask AP (mini: a small Mask R-CNN on shapes with masks)"
    speedups = frozenset({"precision", "channels_last", "fused_optimizer", "async_eval"})
    step_probe = ("global_batch_size=2", "min_image_size=320", "max_image_size=512")
    data = DATA
    background = 1
    sample_name = "images"

    def recipes(self, scale: str) -> dict[str, MaskRCNNRecipe]:
        return {"mini": MINI} if scale == "mini" else dict(FULL_RECIPES)

    def reference_devices(self, recipe: MaskRCNNRecipe) -> int:
        # The RCP runs kept 6 images per accelerator (BS 8 and 16: 1 and 2 each, on 8).
        return recipe.global_batch_size // 6 if recipe.global_batch_size > 16 else 8

    def mlperf_hyperparameters(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        per_process = max(1, recipe.global_batch_size // ctx.world_size)
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
        if recipe.model == "maskrcnn" and not recipe.backbone_weights:
            return ["no --set backbone_weights=PATH: the ResNet-50 body starts from random weights, the reference "
                    "from ImageNet ones; this run is not comparable to MLPerf"]
        return []

    def build(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if recipe.model == "mini":
            model: nn.Module = maskrcnn_model.mini_maskrcnn(recipe.num_classes, recipe.min_image_size, recipe.width,
                                               recipe.fpn_channels, recipe.representation, recipe.candidates,
                                               recipe.rois, recipe.max_detections, recipe.mask_channels,
                                               recipe.mask_pool)
        else:
            weights = None
            if "backbone weights" in assets:
                from torchvision.models import resnet50

                weights = assets.state_dict("backbone weights", like=resnet50().state_dict(),
                                            what="torchvision's resnet50")
            model = maskrcnn_model.maskrcnn_resnet50_fpn(recipe.num_classes, recipe.min_image_size,
                                                         recipe.max_image_size,
                                            recipe.candidates, recipe.input_format == "bgr255", weights)
            model.roi_heads.fg_bg_sampler.batch_size_per_image = recipe.rois
            model.roi_heads.detections_per_img = recipe.max_detections
        model = maskrcnn_model.unpasted(model).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.SGD(param_groups(model, recipe), lr=recipe.base_lr, momentum=recipe.momentum, **impl)

        def loss_fn(model: nn.Module, batch: tuple[Any, list[dict[str, torch.Tensor]], Any]) -> torch.Tensor:
            losses = model(batch[0], batch[1])
            return sum(losses.values())

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=_forward,
                          lr_schedule=lambda steps_per_epoch: lr_factor(recipe))

    def synthetic_batch(self, recipe: MaskRCNNRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        size = recipe.min_image_size
        images, targets, positions = coco_loading.synthetic_batch(recipe.global_batch_size // ctx.world_size, size,
                                                       (1, recipe.num_classes), ctx.device)
        for t in targets:
            x0, y0, x1, y1 = t["boxes"][0].round().int().tolist()
            mask = torch.zeros(1, size, size, dtype=torch.uint8, device=ctx.device)
            mask[:, y0:y1, x0:x1] = 1
            t["masks"] = mask
        return self._input(recipe, images), targets, positions

    # -- data -----------------------------------------------------------------------------------
    @staticmethod
    def _input(recipe: MaskRCNNRecipe, images: torch.Tensor | list[torch.Tensor]) -> Any:
        """uint8 RGB images as the model's input: BGR 0..255 (the reference) or RGB 0..1."""

        def one(x: torch.Tensor) -> torch.Tensor:
            return x.flip(-3).float() if recipe.input_format == "bgr255" else x.float().div_(255)

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
            rows: list[np.ndarray] = []
            masks: list[np.ndarray] = []
            for images, positions in batches():
                for found, i in zip(forward((images, None, positions)), positions, strict=True):
                    labels = found["labels"].cpu().numpy()
                    known = (labels >= 1) & (labels <= len(category_ids))  # classes nobody annotated: unscorable
                    rows.append(scoring.detection_rows(val.image_ids[i], found["boxes"].float().cpu().numpy()[known],
                                                       found["scores"].float().cpu().numpy()[known],
                                                       category_ids[labels[known] - 1]))
                    masks.append(found["masks"][:, 0].to(torch.float16).cpu().numpy()[known])
            return EvalPartial(metric=metric, objects={"detections": rows, "masks": masks})

        return evaluate


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = MaskRCNNWorkload
