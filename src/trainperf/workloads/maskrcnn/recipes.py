"""Mask R-CNN's recipes: the MLPerf reference convergence points (RCPs, COCO 2017) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainperf.contract import LengthBuckets
from trainperf.contract.fields import Count, Fraction, Positive, Share
from trainperf.errors import TrainperfError
from trainperf.workloads.common.coco import data as coco
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.common.coco.detector import DetectorRecipe
from trainperf.workloads.maskrcnn import weights as maskrcnn_weights

COCO_CLASSES, COCO_COUNTS = 81, (117_266, 5_000)  # background included; train images with a valid annotation


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
    # ImageNet resnet50 weights expect rgb: RGB 0..1 normalised by their mean and std. auto: the weights'
    # convention (workloads/maskrcnn/weights.py), bgr255 without weights; an explicit choice must agree.
    input_format: str = "auto"
    # Which convention backbone_weights follow: auto (a .pkl is Detectron's MSRA R-50, any other file
    # torchvision's resnet50), msra (MSRA weights under torchvision's names) or torchvision.
    backbone_format: str = "auto"
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
    # Greedy NMS of the RPN's proposals as a fixed-point iteration of this many matrix products (a fixed
    # amount of work, no read-back: workloads/maskrcnn/syncfree.py); exact unless a chain of boxes, each
    # suppressing the next, is longer (then fewer proposals are kept, never two overlapping ones).
    nms_iterations: Count = 15
    # --static-shapes (and --cuda-graphs): every image's boxes padded to the bucket of the batch's largest box
    # count, and the batch to one of three sizes (landscape, portrait, square: see MaskRCNNWorkload.image_buckets).
    bucket_boxes: tuple[int, ...] = (8, 16, 32, 64, 128)

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"model": ("maskrcnn", "mini"),
                                                     "input_format": ("auto", "bgr255", "rgb"),
                                                     "backbone_format": ("auto", "msra", "torchvision"),
                                                     "coco_backend": scoring.BACKENDS}

    def validate(self) -> None:
        super().validate()
        maskrcnn_weights.input_format(self.input_format, self.backbone_weights, self.backbone_format)
        if self.base_lr <= 0 or self.warmup_steps < 0 or not 0 < self.warmup_factor <= 1:
            raise TrainperfError("recipe: need base_lr > 0, warmup_steps >= 0, 0 < warmup_factor <= 1")
        if list(self.decay_steps) != sorted(self.decay_steps) or not 0 < self.decay_factor <= 1:
            raise TrainperfError("recipe: decay_steps must increase and 0 < decay_factor <= 1")
        LengthBuckets.from_recipe("bucket_boxes", self.bucket_boxes)
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
