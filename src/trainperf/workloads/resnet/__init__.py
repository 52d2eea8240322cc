"""ResNet-50 v1.5 on ImageNet (MLPerf key `resnet`), and its mini scale on real handwritten digits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from trainperf.errors import TrainperfError
from trainperf.loaders import DevicePrefetcher, one_line_errors
from trainperf.optim import LARS, kernels, multi_tensor, warmup_poly
from trainperf.spec import (
    Assets,
    DataParts,
    EpochView,
    EvalPartial,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    Workload,
    per_epoch_schedule,
)
from trainperf.workloads.resnet import data as resnet_data
from trainperf.workloads.resnet.model import MiniResNet, build_resnet50
from trainperf.workloads.resnet.recipes import FULL_RECIPES, MINI_RECIPE, ResNetRecipe

__all__ = ["FULL_RECIPES", "MINI_RECIPE", "ResNetRecipe", "ResNetWorkload"]

def _predict(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The evaluation forward: the predicted class of each image."""
    return model(batch[0]).argmax(1)


def _top1(totals: dict[str, torch.Tensor]) -> float:
    return totals["correct"].item() / max(totals["count"].item(), 1)


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
    speedups = frozenset({"precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer", "async_eval"})

    mini = Scale(MINI_RECIPE, resnet_data.Digits(MINI_RECIPE.image_size))
    full = Scale(FULL_RECIPES, resnet_data.ImageNetFolder())

    def mlperf_hyperparameters(self, recipe: ResNetRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        decay_epochs = recipe.train_epochs - recipe.warmup_epochs
        # BN statistics are per process (not synchronised): the span is the per-process micro-batch.
        bn_span = recipe.global_batch_size // (ctx.world_size * recipe.grad_accum_steps)
        if recipe.optimizer == "lars":
            return {
                "opt_name": "lars",
                "lars_opt_base_learning_rate": recipe.base_lr,
                "lars_opt_end_learning_rate": recipe.end_lr,
                "lars_opt_learning_rate_decay_poly_power": recipe.poly_power,
                "lars_opt_learning_rate_decay_steps": decay_epochs,
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
            "sgd_opt_learning_rate_decay_steps": decay_epochs,
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

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn,
                          lr_schedule=per_epoch_schedule(self.name, lr_schedule), eval_forward=_predict)

    def synthetic_batch(self, recipe: ResNetRecipe, ctx: RuntimeContext,
                        model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        n = recipe.global_batch_size // ctx.world_size
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        images = torch.randint(0, 256, (n, 3, recipe.image_size, recipe.image_size), device=ctx.device,
                               generator=gen, dtype=torch.uint8)
        labels = torch.randint(0, recipe.num_classes, (n,), device=ctx.device, generator=gen)
        return resnet_data.normalize(images), labels

    def load_data(self, recipe: ResNetRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        train_index, val_index, _skipped = resnet_data.indexes(data_dir)
        if len(train_index.classes) > recipe.num_classes:
            raise TrainperfError(f"{data_dir / 'train'}: {len(train_index.classes)} classes, but the model has "
                                 f"{recipe.num_classes} outputs (--set num_classes=N)")
        if recipe.in_memory:
            return self._resident_data(recipe, train_index, val_index, ctx)
        if recipe.decode == "device":
            return self._device_decoded_data(recipe, train_index, val_index, ctx)
        return self._streamed_data(recipe, train_index, val_index, ctx)

    def _resident_data(self, recipe: ResNetRecipe, train_index: resnet_data.ImageIndex,
                       val_index: resnet_data.ImageIndex,
                       ctx: RuntimeContext) -> DataParts:
        device = ctx.device
        train_x, train_y = resnet_data.load_resident(train_index, device)
        val_x, val_y = resnet_data.load_resident(val_index, device)
        # Every process draws the same global order (same seed); each takes its share of every
        # global batch, so the global batches do not depend on the number of processes.
        order_gen = ctx.generator("order")
        aug_gen = ctx.generator("augment", per_rank=True)
        n, batch = train_x.shape[0], recipe.global_batch_size
        # A last global batch smaller than the number of processes would leave a process empty-handed.
        usable = n if n % batch >= ctx.world_size or n % batch == 0 else n - n % batch
        steps = -(-usable // batch)
        eval_shard = ctx.shard(val_x.shape[0])
        mean = resnet_data.channel_means(device)
        val_x, val_y = val_x[eval_shard.start:eval_shard.stop], val_y[eval_shard.start:eval_shard.stop]

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            order = torch.randperm(n, device=device, generator=order_gen)[:usable]
            for start in range(0, usable, batch):
                global_idx = order[start:start + batch]
                mine = ctx.shard(global_idx.shape[0])
                idx = global_idx[mine.start:mine.stop]
                images = resnet_data.random_resized_crop(train_x[idx].float(), recipe.min_crop_area, recipe.hflip,
                                                         aug_gen)
                yield resnet_data.normalize(images, mean), train_y[idx]

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            correct = torch.zeros((), dtype=torch.long, device=device)
            for start in range(0, val_x.shape[0], recipe.eval_batch_size):
                labels = val_y[start:start + recipe.eval_batch_size]
                images = resnet_data.normalize(val_x[start:start + recipe.eval_batch_size], mean)
                correct += (forward((images, labels)) == labels).sum()
            count = torch.tensor(val_x.shape[0], device=device)
            return EvalPartial(metric=_top1, sums={"correct": correct, "count": count})

        return DataParts(train_batches=train_batches, steps_per_epoch=steps, train_samples=usable,
                         eval_samples=len(val_index.paths), evaluate=evaluate)

    def _streamed_data(self, recipe: ResNetRecipe, train_index: resnet_data.ImageIndex,
                       val_index: resnet_data.ImageIndex,
                       ctx: RuntimeContext) -> DataParts:
        device = ctx.device
        pin = device.type == "cuda"
        workers = recipe.num_workers
        extra = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
        per_process = recipe.global_batch_size // ctx.world_size
        train_set = resnet_data.FolderDataset(train_index, resnet_data.train_transform(recipe.image_size,
                                                                                       recipe.min_crop_area))
        # The same seed gives the same global order on any number of processes; the sampler deals
        # each global batch out across processes.
        sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                     seed=ctx.stream_seed("order") % 2**31, drop_last=True)
        train_loader = DataLoader(
            train_set, batch_size=per_process, sampler=sampler, num_workers=workers, pin_memory=pin,
            drop_last=len(sampler) >= per_process, **extra,
        )
        shard = ctx.shard(len(val_index.paths))
        val_set = Subset(resnet_data.FolderDataset(val_index, resnet_data.eval_transform(recipe.image_size,
                                                                                         recipe.eval_resize)),
                         list(shard))
        val_loader = DataLoader(val_set, batch_size=recipe.eval_batch_size, shuffle=False, num_workers=workers,
                                pin_memory=pin, **extra)
        train_feed = DevicePrefetcher(train_loader, device)
        val_feed = DevicePrefetcher(val_loader, device)
        mean = resnet_data.channel_means(device)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            sampler.set_epoch(view.epoch)
            for images, labels in train_feed:
                yield resnet_data.normalize(images.to(device), mean), labels.to(device)

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            correct = torch.zeros((), dtype=torch.long, device=device)
            count = torch.zeros((), dtype=torch.long, device=device)
            for images, labels in val_feed:
                labels = labels.to(device)
                correct += (forward((resnet_data.normalize(images.to(device), mean), labels)) == labels).sum()
                count += labels.shape[0]
            return EvalPartial(metric=_top1, sums={"correct": correct, "count": count})

        return DataParts(train_batches=train_batches, steps_per_epoch=len(train_loader),
                         train_samples=len(train_set), eval_samples=len(val_index.paths), evaluate=evaluate)

    def _device_decoded_data(self, recipe: ResNetRecipe, train_index: resnet_data.ImageIndex,
                             val_index: resnet_data.ImageIndex,
                             ctx: RuntimeContext) -> DataParts:
        """decode=device: workers read the files' bytes; the device decodes each batch and augments it
        (the crop boxes drawn on the host from the images' sizes: no value comes back from the device)."""
        device = ctx.device
        workers = recipe.num_workers
        extra = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
        per_process = recipe.global_batch_size // ctx.world_size
        train_set = resnet_data.RawFolder(train_index)
        sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                     seed=ctx.stream_seed("order") % 2**31, drop_last=True)
        pin = device.type == "cuda"
        train_loader = DataLoader(train_set, batch_size=per_process, sampler=sampler, num_workers=workers,
                                  pin_memory=pin, drop_last=len(sampler) >= per_process,
                                  collate_fn=resnet_data.collate_raw,
                                  **extra)
        val_set = Subset(resnet_data.RawFolder(val_index), list(ctx.shard(len(val_index.paths))))
        val_loader = DataLoader(val_set, batch_size=recipe.eval_batch_size, shuffle=False, num_workers=workers,
                                pin_memory=pin, collate_fn=resnet_data.collate_raw, **extra)
        mean = resnet_data.channel_means(device)
        seed = ctx.stream_seed("augment", per_rank=True)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            sampler.set_epoch(view.epoch)
            rng = np.random.default_rng([seed, view.epoch])
            for datas, labels, rows in one_line_errors(train_loader):
                images = resnet_data.decode_batch(datas, [train_index.paths[i] for i in rows], device)
                boxes = resnet_data.crop_boxes([tuple(im.shape[-2:]) for im in images], recipe.min_crop_area, rng)
                flips = (rng.random(len(images)) < 0.5).tolist() if recipe.hflip else [False] * len(images)
                batch = resnet_data.crop_resize(images, boxes, recipe.image_size, flips)
                yield resnet_data.normalize(batch, mean), labels.to(device, non_blocking=True)

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            correct = torch.zeros((), dtype=torch.long, device=device)
            count = torch.zeros((), dtype=torch.long, device=device)
            for datas, labels, rows in one_line_errors(val_loader):
                images = resnet_data.decode_batch(datas, [val_index.paths[i] for i in rows], device)
                batch = resnet_data.normalize(resnet_data.resize_center_crop(images, recipe.eval_resize,
                                                                             recipe.image_size), mean)
                labels = labels.to(device, non_blocking=True)
                correct += (forward((batch, labels)) == labels).sum()
                count += labels.shape[0]
            return EvalPartial(metric=_top1, sums={"correct": correct, "count": count})

        return DataParts(train_batches=train_batches, steps_per_epoch=len(train_loader),
                         train_samples=len(train_set), eval_samples=len(val_index.paths), evaluate=evaluate)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = ResNetWorkload
