"""3D U-Net on KiTS19 (MLPerf key `unet3d`, ruleset 1.0.0), and its mini scale on synthetic CT-like
volumes in the reference's preprocessed layout. Mean Dice of kidney and tumour per case over the
evaluation cases by sliding-window inference, the cases sharded across processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
    per_epoch_schedule,
)
from trainperf.optim import kernels
from trainperf.workloads.unet3d import data as unet3d_data
from trainperf.workloads.unet3d import model as unet3d_model
from trainperf.workloads.unet3d import prepare, synthetic
from trainperf.workloads.unet3d.pipeline import KiTS19Pipeline
from trainperf.workloads.unet3d.recipes import FULL, FULL_RECIPES, MINI, UNet3DRecipe


class UNet3DWorkload(Workload[UNet3DRecipe]):
    name = "unet3d"
    mlperf = MLPerf(ruleset="1.0.0", runs=40, olympic_drop=4, full_epoch_samples=168, full_eval_forwards=1_410,
                    full_eval_samples=42)
    benchmark = "unet3d"
    metric = Metric("mean_dice", higher_is_better=True)
    summary = ("3D U-Net on KiTS19, mean Dice of kidney and tumour by sliding-window inference (mini: synthetic "
               "CT-like volumes in the reference's layout)")
    sample_name = "patches"
    speedups = frozenset({"precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer"})
    step_probe = ("global_batch_size=1", "patch=64")
    # one_hot's range check synced twice
    step_budget = StepBudget(ops=780)
    device_probe = DeviceProbe(batch=2)
    real_layout = ("data/case_00000/imaging.nii.gz", "data/case_00000/segmentation.nii.gz")

    mini = Scale(MINI, synthetic.SyntheticKidneys(MINI.evaluation_cases))
    full = Scale(FULL_RECIPES, prepare.KiTS19(FULL.evaluation_cases))

    def mlperf_hyperparameters(self, recipe: UNet3DRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        shape = [recipe.patch] * 3
        return {
            "opt_name": "sgd", "opt_base_learning_rate": recipe.base_lr, "opt_momentum": recipe.momentum,
            # The reference's keys (runtime/logging.py mlperf_run_param_log): the warmup's starting rate
            # (init_lr) is not among them.
            "opt_learning_rate_warmup_epochs": recipe.warmup_epochs,
            "opt_learning_rate_decay_boundary_epochs": list(recipe.decay_epochs),
            "opt_learning_rate_decay_factor": recipe.decay_factor, "opt_weight_decay": recipe.weight_decay,
            "oversampling": recipe.oversampling, "training_input_shape": shape, "validation_input_shape": shape,
            "validation_overlap": recipe.overlap,
        }

    def build(self, recipe: UNet3DRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        torch.manual_seed(ctx.stream_seed("init"))
        model = unet3d_model.UNet3D(recipe.channels).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.base_lr, momentum=recipe.momentum, nesterov=True,
                                    weight_decay=recipe.weight_decay, **impl)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            images, labels = batch
            return unet3d_model.dice_ce_loss(model(images), labels)

        def forward(model: nn.Module, windows: torch.Tensor) -> torch.Tensor:
            return model(windows)

        def schedule(steps_per_epoch: int) -> Callable[[int], float]:
            return lr_factor(recipe, steps_per_epoch)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward,
                          lr_schedule=per_epoch_schedule(self.name, schedule))

    def synthetic_batch(self, recipe: UNet3DRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        gen = ctx.generator("synthetic")
        b = ctx.batch_share(recipe.global_batch_size)
        size = (b, 1, recipe.patch, recipe.patch, recipe.patch)
        images = torch.randn(size, generator=gen, device=ctx.device)
        labels = torch.randint(0, unet3d_data.CLASSES, size, generator=gen, device=ctx.device).to(torch.uint8)
        return images, labels

    def synthetic_eval_batch(self, recipe: UNet3DRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return self.synthetic_batch(recipe, ctx, model)[0][:1]

    def load_data(self, recipe: UNet3DRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return KiTS19Pipeline(recipe, data_dir, ctx).parts()


def lr_factor(recipe: UNet3DRecipe, steps_per_epoch: int) -> Callable[[int], float]:
    """The LR multiplier at optimizer step `step` (from 1): epoch e (from 1) of the warmup runs at
    init_lr + (base_lr - init_lr) * e / warmup_epochs (the reference sets it at each epoch's start),
    then base_lr times decay_factor per boundary passed."""

    def factor(step: int) -> float:
        epoch = (step - 1) // steps_per_epoch + 1
        if epoch <= recipe.warmup_epochs:
            lr = recipe.init_lr + (recipe.base_lr - recipe.init_lr) * epoch / recipe.warmup_epochs
        else:
            lr = recipe.base_lr * recipe.decay_factor ** sum(epoch > b for b in recipe.decay_epochs)
        return lr / recipe.base_lr

    return factor


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = UNet3DWorkload
