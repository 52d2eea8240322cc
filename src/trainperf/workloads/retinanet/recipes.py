"""RetinaNet's recipes: the MLPerf reference convergence points (RCPs, OpenImages-MLPerf) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainperf.contract import LengthBuckets
from trainperf.contract.fields import Count, Positive
from trainperf.errors import TrainperfError
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import DetectorRecipe

OPENIMAGES_CLASSES, OPENIMAGES_COUNTS = 264, (1_170_301, 24_781)


@dataclass(frozen=True)
class RetinaNetRecipe(DetectorRecipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_epochs",)
    model: str = "retinanet"  # retinanet (ResNeXt50-32x4d FPN, the reference) | mini
    num_classes: Count = OPENIMAGES_CLASSES  # sigmoid classes: no background class
    image_size: Count = 800  # every image is resized to this square inside the model
    # Adam (the closed rules' only optimizer); the learning rate is absolute, not scaled by the batch.
    base_lr: Positive = 1e-4
    weight_decay: float = 0.0
    warmup_epochs: float = 1.0
    warmup_factor: float = 1e-3  # the LR ramps linearly from base_lr * warmup_factor over warmup_epochs
    lr_schedule: str = "constant"  # constant after warmup (the reference) | cosine (to 0 at max_epochs)
    eval_batch_size: Count = 32
    max_detections: Count = 300
    width: Count = 32  # mini body width
    fpn_channels: Count = 64  # mini FPN and head width
    # --static-shapes (and --cuda-graphs): every image's boxes padded to the bucket of the batch's largest box
    # count (images are one square already), so a step has one of these few shapes.
    bucket_boxes: tuple[int, ...] = (8, 16, 32, 64, 128, 256)

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"model": ("retinanet", "mini"),
                                                     "lr_schedule": ("constant", "cosine"),
                                                     "coco_backend": scoring.BACKENDS}

    def validate(self) -> None:
        super().validate()
        if self.base_lr <= 0 or self.warmup_epochs < 0 or not 0 <= self.warmup_factor <= 1:
            raise TrainperfError("recipe: need base_lr > 0, warmup_epochs >= 0, 0 <= warmup_factor <= 1")
        LengthBuckets.from_recipe("bucket_boxes", self.bucket_boxes)
        if self.num_classes < 1 or self.width < 1 or self.fpn_channels < 16 or self.fpn_channels % 16:
            raise TrainperfError("recipe: need num_classes >= 1, width >= 1 and fpn_channels a multiple of 16 "
                                 "(GroupNorm of 16 groups)")


def _full(batch: int, max_epochs: int = 26) -> RetinaNetRecipe:
    return RetinaNetRecipe(name=f"rcp-{batch}", global_batch_size=batch, max_epochs=max_epochs, target=0.34,
                           eval_every=1, eval_first=1)


# The reference convergence points of the v2.0 round (mlperf_logging RCPs 2.0.0, rcps_ssd.json: Adam
# 1e-4, one warmup epoch from 1e-3): 4, 5 and ~15 epochs to converge at BS 256, 512 and 4096.
FULL_RECIPES = {r.name: r for r in (_full(256), _full(512), _full(4096, 30))}
MINI = RetinaNetRecipe(name="mini", global_batch_size=16, max_epochs=10, target=0.25, eval_every=1, eval_first=4,
                       model="mini", num_classes=len(coco.MINI_CATEGORIES), image_size=coco.MINI_SIZE, base_lr=2e-3,
                       warmup_epochs=1.0, warmup_factor=1e-3, lr_schedule="cosine", num_workers=0,
                       eval_batch_size=250, max_detections=100, channels_last=True)
