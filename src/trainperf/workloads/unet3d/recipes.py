"""3D U-Net's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs, KiTS19) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import annotated_types as at

from trainperf.contract import (
    Recipe,
)
from trainperf.contract.fields import Count, Counts, Fraction, Positive, Share
from trainperf.errors import TrainperfError
from trainperf.workloads.unet3d import data as unet3d_data
from trainperf.workloads.unet3d import model as unet3d_model


@dataclass(frozen=True)
class UNet3DRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_epochs",)
    # global_batch_size in patches; an epoch is one patch per training case (the last global batch
    # filled with random cases: the rules count it padded).
    channels: Counts = unet3d_model.REFERENCE_CHANNELS
    patch: Count = 128
    oversampling: Annotated[float, at.Interval(ge=0, le=1)] = 0.4
    # SGD with Nesterov momentum; the LR rises linearly from init_lr to base_lr over warmup_epochs
    # (per epoch, as the reference), then is multiplied by decay_factor at each decay boundary.
    base_lr: Positive = 0.8
    init_lr: Positive = 1e-4
    momentum: Fraction = 0.9
    weight_decay: float = 0.0
    warmup_epochs: int = 200
    decay_epochs: tuple[int, ...] = ()
    decay_factor: Share = 1.0
    overlap: Fraction = 0.5
    eval_windows: Count = 4  # windows per forward pass of the sliding-window inference
    eval_cases: str = "reference"  # the reference's 42, or a comma-separated list of case ids

    def validate(self) -> None:
        super().validate()
        if not self.channels:
            raise TrainperfError("recipe field channels: at least one level expected")
        if self.patch % 2 ** len(self.channels):
            raise TrainperfError(f"recipe field patch={self.patch}: must be divisible by 2 ** {len(self.channels)}")
        if self.eval_cases != "reference":
            ids = [c.strip() for c in self.eval_cases.split(",") if c.strip()]
            if not ids or not all(c.isdigit() for c in ids):
                raise TrainperfError(f"recipe field eval_cases={self.eval_cases!r}: expected 'reference' or a "
                                     "comma-separated list of case numbers (at least one)")

    @property
    def evaluation_cases(self) -> tuple[str, ...]:
        if self.eval_cases == "reference":
            return unet3d_data.EVAL_CASES
        return tuple(f"{int(c):05d}" for c in self.eval_cases.split(",") if c.strip())


def _full(name: str, gbs: int, lr: float, warmup: int) -> UNet3DRecipe:
    # The v1.0 rules' cadence in epochs of 168 samples: first evaluation at 1000, every 20, 10000 at most.
    return UNet3DRecipe(name=name, global_batch_size=gbs, max_epochs=10_000, target=0.908, eval_every=20,
                        eval_first=1000, cadence_epoch_samples=168, base_lr=lr, warmup_epochs=warmup)


# The reference's run_and_time.sh (batch 2, LR 0.8, 200 warmup epochs), then the RCP points of
# mlperf_logging's rcps_unet3d.json (1.0.0).
FULL_RECIPES: dict[str, UNet3DRecipe] = {
    "reference": _full("reference", 2, 0.8, 200),
    "bs32": _full("bs32", 32, 4.0, 1000),
    "bs56": _full("bs56", 56, 2.0, 1000),
    "bs80": _full("bs80", 80, 1.5, 1000),
}

# The default full recipe: the dataset `prepare --scale full` readies is the one it reads.
FULL = next(iter(FULL_RECIPES.values()))

MINI = UNet3DRecipe(name="mini", global_batch_size=4, max_epochs=60, target=0.8, eval_every=2, eval_first=4,
                    channels=(8, 16, 32), patch=32, base_lr=0.05, init_lr=1e-3, warmup_epochs=2,
                    eval_windows=8, eval_cases=",".join(str(i) for i in range(32, 40)))
