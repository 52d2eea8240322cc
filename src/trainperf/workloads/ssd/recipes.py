"""SSD's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs, COCO 2017) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import annotated_types as at

from trainperf.contract.fields import Count, Fraction, Positive, Share
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import DetectorRecipe


@dataclass(frozen=True)
class SSDRecipe(DetectorRecipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_epochs",)
    model: str = "ssd300"  # ssd300 | mini
    num_classes: Annotated[int, at.Ge(2)] = 81  # with the background
    optimizer: str = "sgd"  # sgd (the reference) | adamw
    # The learning rate per 32 images: the run's is base_lr * global_batch_size / 32 (the reference).
    base_lr: Positive = 2.5e-3
    momentum: Fraction = 0.9
    weight_decay: float = 5e-4
    warmup_epochs: float = 0.0
    warmup_factor: int = 0  # the MLPerf ramp: lr_b = r0 - (wb - b) r0 / (wb 2^factor)
    lr_schedule: str = "multistep"  # multistep (x decay_factor at decay_epochs) | cosine (to 0 at max_epochs)
    decay_epochs: tuple[int, ...] = (40, 50)
    decay_factor: Share = 0.1
    crop_trials: Count = 1  # SSD random crop retries (MLPerf `max_samples`: 1 or 50)
    color_jitter: bool = True
    score_threshold: Fraction = 0.05
    nms_iou: Share = 0.5
    width: Count = 32  # mini model width

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"model": ("ssd300", "mini"), "optimizer": ("sgd", "adamw"),
                                                     "lr_schedule": ("multistep", "cosine"), "crop_trials": (1, 50),
                                                     "coco_backend": scoring.BACKENDS}


def _full(batch: int, base_lr: float, decay: tuple[int, int], warmup_epochs: float, weight_decay: float,
          max_epochs: int, crop_trials: int = 50) -> SSDRecipe:
    return SSDRecipe(name=f"rcp-{batch}", global_batch_size=batch, max_epochs=max_epochs, target=0.23, eval_every=5,
                     eval_first=5, base_lr=base_lr, decay_epochs=decay, warmup_epochs=warmup_epochs,
                     weight_decay=weight_decay, crop_trials=crop_trials)


# The MLPerf reference convergence points (mlperf_logging RCPs, 1.0.0); then the reference's 1-GPU setup.
FULL_RECIPES = {r.name: r for r in (
    _full(1024, 2.5e-3, (40, 50), 2.619685, 5e-4, 70),
    _full(2048, 4.57e-3, (60, 75), 26.0, 4e-5, 90),
    _full(4096, 2.5e-3, (80, 100), 40.0, 4e-5, 110),
    SSDRecipe(name="reference-32", global_batch_size=32, max_epochs=70, target=0.23, eval_every=5, eval_first=5),
)}
MINI = SSDRecipe(name="mini", global_batch_size=32, max_epochs=12, target=0.33, eval_every=1, eval_first=4,
                 model="mini", num_classes=1 + len(coco.MINI_CATEGORIES), image_size=coco.MINI_SIZE, optimizer="adamw",
                 base_lr=3e-3, weight_decay=1e-4, warmup_epochs=1.0, lr_schedule="cosine", crop_trials=1,
                 color_jitter=False, num_workers=0, eval_batch_size=250, max_detections=100)
