"""ResNet-50 v1.5 on ImageNet (MLPerf key `resnet`), and its mini scale on real handwritten digits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck

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
from trainperf.optim import LARS, kernels, multi_tensor, warmup_poly
from trainperf.workloads.resnet import data as resnet_data
from trainperf.workloads.resnet import images as resnet_images
from trainperf.workloads.resnet.model import MiniResNet, build_resnet50
from trainperf.workloads.resnet.recipes import FULL_RECIPES, MINI_RECIPE, ResNetRecipe

__all__ = ["FULL_RECIPES", "MINI_RECIPE", "ResNetRecipe", "ResNetWorkload"]

def _predict(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The evaluation forward: the predicted class of each image."""
    return model(batch[0]).argmax(1)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """BatchNorm parameters and biases get no weight decay (and no LARS scaling), as in the reference."""
    decay, skip = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, nn.modules.batchnorm._BatchNorm) or name == "bias":
                skip.append(param)
            else:
                decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": skip, "weight_decay": 0.0, "lars_exclude": True},
    ]


class ResNetWorkload(Workload[ResNetRecipe]):
    name = "resnet"
    mlperf = MLPerf(ruleset="1.0.0", runs=5, full_epoch_samples=1_281_167, full_eval_forwards=50_000,
                    full_eval_samples=50_000)
    benchmark = "resnet"
    metric = Metric("top1", higher_is_better=True)
    summary = "ResNet-50 v1.5 on ImageNet (mini: a small ResNet on real handwritten digits)"
    step_budget = StepBudget(ops=2_300)
    device_probe = DeviceProbe(batch=256)
    real_layout = ("train/n01440764/n01440764_10026.JPEG", "val/n01440764/ILSVRC2012_val_00000293.JPEG")
    speedups = frozenset({"precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer",
                          "async_eval", "regional_compile"})

    mini = Scale(MINI_RECIPE, resnet_data.Digits(MINI_RECIPE.image_size))
    full = Scale(FULL_RECIPES, resnet_data.ImageNetFolder())

    def mlperf_hyperparameters(self, recipe: ResNetRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        # BN statistics are per process (not synchronised): the span is the per-process micro-batch.
        bn_span = recipe.global_batch_size // (ctx.world_size * recipe.grad_accum_steps)
        if recipe.optimizer == "lars":
            return {
                "opt_name": "lars",
                "lars_opt_base_learning_rate": recipe.base_lr,
                "lars_opt_end_learning_rate": recipe.end_lr,
                "lars_opt_learning_rate_decay_poly_power": recipe.poly_power,
                "lars_epsilon": recipe.lars_epsilon,
                "lars_opt_learning_rate_warmup_epochs": recipe.warmup_epochs,
                "lars_opt_momentum": recipe.momentum,
                "lars_opt_weight_decay": recipe.weight_decay,
                "model_bn_span": bn_span,
            }
        return {
            "opt_name": "sgd",
            "sgd_opt_base_learning_rate": recipe.base_lr,
            "sgd_opt_end_learning_rate": recipe.end_lr,
            "sgd_opt_learning_rate_decay_poly_power": recipe.poly_power,
            "sgd_opt_weight_decay": recipe.weight_decay,
            "sgd_opt_momentum": recipe.momentum,
            "opt_learning_rate_warmup_epochs": recipe.warmup_epochs,
            "model_bn_span": bn_span,
        }

    # -- parts ----------------------------------------------------------------------------------
    def build(self, recipe: ResNetRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if recipe.model == "mini":
            model: nn.Module = MiniResNet(recipe.num_classes, recipe.stem_width, recipe.widths, recipe.blocks)
        else:
            model = build_resnet50(recipe.num_classes)
        model = model.to(ctx.device)
        groups = _param_groups(model, recipe.weight_decay)
        if recipe.optimizer == "lars":
            # torch has no fused LARS: fused_optimizer selects trainperf's multi-tensor (foreach) form.
            optimizer: torch.optim.Optimizer = LARS(
                groups, lr=recipe.base_lr, momentum=recipe.momentum, trust_coefficient=recipe.lars_eta,
                eps=recipe.lars_epsilon, foreach=multi_tensor(recipe.fused_optimizer),
            )
        else:
            for group in groups:
                group.pop("lars_exclude", None)
            impl = kernels(recipe.fused_optimizer)
            optimizer = torch.optim.SGD(groups, lr=recipe.base_lr, momentum=recipe.momentum, **impl)

        smoothing = recipe.label_smoothing

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            images, labels = batch
            return F.cross_entropy(model(images), labels, label_smoothing=smoothing)

        def lr_schedule(steps_per_epoch: int) -> Callable[[int], float]:
            return warmup_poly(
                recipe.base_lr, recipe.end_lr, round(recipe.warmup_epochs * steps_per_epoch),
                round(recipe.train_epochs * steps_per_epoch), recipe.poly_power,
            )

        def epoch_hyperparameters(steps_per_epoch: int | None) -> dict[str, Any]:
            # The decay's length in optimizer steps, as the reference logs it (the 2.0.0 RCP: 14,523 at batch
            # 3,264), counted as the schedule above counts it: known once the data says its steps per epoch.
            if not steps_per_epoch:
                return {}
            decay = round(recipe.train_epochs * steps_per_epoch) - round(recipe.warmup_epochs * steps_per_epoch)
            return {f"{recipe.optimizer}_opt_learning_rate_decay_steps": decay}

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn,
                          lr_schedule=per_epoch_schedule(self.name, lr_schedule), eval_forward=_predict,
                          epoch_hyperparameters=epoch_hyperparameters,
                          regions=tuple(m for m in model.modules() if isinstance(m, Bottleneck)))

    def synthetic_batch(self, recipe: ResNetRecipe, ctx: RuntimeContext,
                        model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        n = ctx.batch_share(recipe.global_batch_size)
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        images = torch.randint(0, 256, (n, 3, recipe.image_size, recipe.image_size), device=ctx.device,
                               generator=gen, dtype=torch.uint8)
        labels = torch.randint(0, recipe.num_classes, (n,), device=ctx.device, generator=gen)
        return resnet_images.normalize(images), labels

    def load_data(self, recipe: ResNetRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return resnet_data.open_imagenet(recipe, data_dir, ctx)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = ResNetWorkload
