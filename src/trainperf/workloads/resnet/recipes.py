"""ResNet-50's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs: LARS, polynomial
decay of power 2) and the reference's SGD setup, then the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Counts, Fraction, Positive, Share
from trainperf.errors import TrainperfError
from trainperf.workloads.resnet.images import CROPS, DECODERS


@dataclass(frozen=True)
class ResNetRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_epochs",)
    model: str = "resnet50"
    num_classes: Count = 1000
    optimizer: str = "lars"
    base_lr: Positive = 10.5
    end_lr: float = 1e-4
    warmup_epochs: float = 2.0
    # LR horizon: linear warmup, then polynomial decay until this epoch (decay = train - warmup).
    train_epochs: float = 39.0
    poly_power: Positive = 2.0
    momentum: Fraction = 0.9
    weight_decay: float = 5e-5
    label_smoothing: Fraction = 0.1
    lars_eta: Positive = 0.001
    lars_epsilon: float = 0.0
    image_size: Count = 224
    eval_resize: Count = 256
    min_crop_area: Share = 0.05
    # The crop's sampler: "reference" (TensorFlow's, as the reference draws it: no crop under 10 % of
    # the image) or "torchvision" (RandomResizedCrop's, as NVIDIA's DALI: from min_crop_area). The
    # in-memory path (the mini) draws torchvision's only.
    crop: str = "reference"
    hflip: bool = True
    in_memory: bool = False
    num_workers: int = 8
    # Full scale: who decodes the JPEGs. "workers": DataLoader workers (Pillow) decode and augment each
    # image; "device": the workers only read the files, and the training device decodes each batch in one
    # call (nvjpeg on a GPU, through TorchCodec where installed) and crops, resizes and flips it there.
    decode: str = "workers"
    eval_batch_size: Count = 256
    # mini model shape (model=mini)
    stem_width: Count = 32
    widths: Counts = (16, 32, 64)
    blocks: Counts = (1, 1, 1)

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"model": ("resnet50", "mini"), "optimizer": ("sgd", "lars"),
                                                     "decode": DECODERS, "crop": CROPS}

    def validate(self) -> None:
        super().validate()
        if self.train_epochs <= self.warmup_epochs:
            raise TrainperfError("recipe fields train_epochs and warmup_epochs: need train_epochs > warmup_epochs")
        if self.model == "mini" and len(self.widths) != len(self.blocks):
            raise TrainperfError("recipe fields widths and blocks must have the same length")
        if self.in_memory and self.crop != "torchvision":
            raise TrainperfError(f"recipe field crop={self.crop}: the in-memory path (in_memory=true) draws "
                                 "torchvision's crop only; set crop=torchvision")


def _lars(*, global_batch_size: int, decay_epochs: float, **fields: Any) -> ResNetRecipe:
    """An RCP point: LARS, polynomial decay over `decay_epochs` after the warmup."""
    return ResNetRecipe(
        name=f"lars-{global_batch_size}", global_batch_size=global_batch_size, target=0.759, eval_every=4,
        eval_first=3, optimizer="lars", train_epochs=fields["warmup_epochs"] + decay_epochs, channels_last=True,
        **fields,
    )


# Full-scale recipes: the MLPerf reference convergence points (mlperf_logging RCPs, LARS, poly 2).
FULL_RECIPES = {
    r.name: r
    for r in (
        _lars(global_batch_size=3264, base_lr=10.5, warmup_epochs=2, decay_epochs=37, weight_decay=5e-5,
              max_epochs=45),
        _lars(global_batch_size=1632, base_lr=7.4, warmup_epochs=2, decay_epochs=35, weight_decay=5e-5,
              max_epochs=45),
        _lars(global_batch_size=4096, base_lr=10.0, warmup_epochs=5, decay_epochs=42, weight_decay=2e-4,
              max_epochs=50),
        _lars(global_batch_size=8192, base_lr=17.0, warmup_epochs=5, decay_epochs=39, weight_decay=2e-4,
              max_epochs=50),
        ResNetRecipe(
            name="sgd-256", global_batch_size=256, max_epochs=90, target=0.759, eval_every=4, eval_first=4,
            optimizer="sgd", base_lr=0.1, warmup_epochs=5, train_epochs=90, weight_decay=1e-4,
            channels_last=True,
        ),
    )
}

MINI_RECIPE = ResNetRecipe(
    name="mini", global_batch_size=32, max_epochs=12, target=0.97, eval_every=1, eval_first=1,
    model="mini", num_classes=10, optimizer="sgd", base_lr=0.2, warmup_epochs=0.5, train_epochs=6,
    weight_decay=4e-4, image_size=32, eval_resize=32, min_crop_area=0.8, hflip=False, in_memory=True,
    crop="torchvision", num_workers=0, eval_batch_size=512, channels_last=True,
)
