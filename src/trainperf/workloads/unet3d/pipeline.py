"""3D U-Net's data pipeline: the preprocessed cases in memory (the reference's loader reads every file each
epoch; NVIDIA's submissions cache it), random patches of the training cases, and the sliding-window
evaluation of this rank's share of the evaluation cases."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.unet3d import data as unet3d_data
from trainperf.workloads.unet3d import model as unet3d_model
from trainperf.workloads.unet3d.inference import gaussian_importance, sliding_window


def mean_dice(combined: dict[str, Any]) -> float:
    kidney, tumour, count = combined["dice"].tolist()
    if count <= 0:
        raise TrainperfError("unet3d evaluation: no evaluation cases")
    return (kidney + tumour) / (2 * count)


class KiTS19Pipeline:
    """Opened after run_start: every training case with its foreground boxes found once, this rank's
    evaluation cases."""

    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        cases = unet3d_data.list_cases(data_dir)
        train_ids, eval_ids = unet3d_data.split(cases, recipe.evaluation_cases)
        if not train_ids:
            raise TrainperfError(f"{data_dir}: no training cases besides the {len(eval_ids)} evaluation cases")
        self.train = []
        for case in train_ids:
            image, label = unet3d_data.load_case(case, *cases[case])
            if min(image.shape[1:]) < recipe.patch:
                raise TrainperfError(f"case {case}: shape {image.shape[1:]} is smaller than the {recipe.patch}^3 patch")
            self.train.append(unet3d_data.Case(image, label, unet3d_data.foreground_boxes(label)))
        mine = [eval_ids[i] for i in ctx.shard(len(eval_ids))]
        self.evaluation = [(c, *unet3d_data.load_case(c, *cases[c])) for c in mine]
        self.eval_cases = len(eval_ids)
        self.recipe, self.ctx, self.device = recipe, ctx, ctx.device
        self.steps = -(-len(self.train) // recipe.global_batch_size)
        self.seed = ctx.stream_seed("patches")
        self.importance = gaussian_importance(recipe.patch).to(ctx.device)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's training cases, the same on every rank: a permutation, padded with random cases to
        whole global batches."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.train))
        extra = rng.integers(0, len(self.train), self.steps * self.recipe.global_batch_size - len(self.train))
        return np.concatenate([order, extra])

    def train_batches(self, view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        recipe, device, rank = self.recipe, self.device, self.ctx.rank
        gbs = recipe.global_batch_size
        per_rank = gbs // self.ctx.world_size
        order = self.order(view.epoch)
        rng = np.random.default_rng([self.seed, view.epoch, rank])
        gen = torch.Generator(device=device)
        gen.manual_seed(int(rng.integers(2**62)))
        for step in range(self.steps):
            rows = order[step * gbs + rank * per_rank: step * gbs + (rank + 1) * per_rank]
            patches = [unet3d_data.sample_patch(self.train[i], recipe.patch, recipe.oversampling, rng) for i in rows]
            images = torch.from_numpy(np.stack([p[0] for p in patches])).to(device, non_blocking=True)
            labels = torch.from_numpy(np.stack([p[1] for p in patches])).to(device, non_blocking=True)
            yield unet3d_data.augment(images, labels, gen)

    def evaluate(self, forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
        recipe, device = self.recipe, self.device
        total = torch.zeros(3, dtype=torch.float64, device=device)
        for _case, image, label in self.evaluation:
            scores, bounds = sliding_window(torch.from_numpy(image).to(device), forward, recipe.patch,
                                            unet3d_data.CLASSES, recipe.overlap, batch=recipe.eval_windows,
                                            importance=self.importance)
            kept = label[0, bounds[0][0]: bounds[0][1], bounds[1][0]: bounds[1][1], bounds[2][0]: bounds[2][1]]
            dice = unet3d_model.case_dice(scores.argmax(0), torch.from_numpy(kept).to(device))
            total += torch.cat([dice.double(), torch.ones(1, dtype=torch.float64, device=device)])
        return EvalPartial(metric=mean_dice, sums={"dice": total})

    def parts(self) -> DataParts:
        return DataParts(train_batches=self.train_batches, steps_per_epoch=self.steps,
                         train_samples=len(self.train), eval_samples=self.eval_cases, evaluate=self.evaluate)
