"""An out-of-tree workload: points inside the unit circle, a small MLP. Its mini generates the points; its
full scale reads a folder holding a points.csv of the same format. It logs under the `resnet` key with
the SGD hyperparameters that key's closed rules ask for, so that its full recipe's log passes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainperf.contract import DataParts, DataSource, EvalPartial, Metric, MLPerf, ModelParts, Recipe, Scale, Workload
from trainperf.errors import TrainperfError


@dataclass(frozen=True)
class CircleRecipe(Recipe):
    lr: float = 0.5


class Points(DataSource):
    """A points.csv (x, y, inside) in the folder."""

    def problems(self, data_dir: Path) -> list[str]:
        return [] if (data_dir / "points.csv").is_file() else [f"{data_dir / 'points.csv'}: missing"]

    def prepare(self, data_dir: Path, say: Any) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError(problems[0])

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / "points.csv", 1000


class GeneratedPoints(Points):
    generated = True

    def prepare(self, data_dir: Path, say: Any) -> None:
        if not self.problems(data_dir):
            say(f"mini dataset already present in {data_dir}")
            return
        xy = np.random.default_rng(0).uniform(-1.5, 1.5, size=(4000, 2))
        data_dir.mkdir(parents=True, exist_ok=True)
        np.savetxt(data_dir / "points.csv", np.c_[xy, (xy**2).sum(1) < 1], delimiter=",", fmt="%.5f")


def accuracy(totals: dict[str, Any]) -> float:
    return float(totals["correct"]) / float(totals["count"])


class Circles(Workload[CircleRecipe]):
    name, benchmark = "circles", "resnet"
    mlperf = MLPerf(ruleset="1.0.0", runs=5, full_eval_samples=1000)
    metric = Metric("accuracy")
    summary = "is a point inside the unit circle? (an out-of-tree example)"
    mini = Scale(CircleRecipe(name="mini", global_batch_size=64, max_epochs=20, target=0.95, eval_every=1,
                              eval_first=1), GeneratedPoints())
    full = Scale(CircleRecipe(name="reference", global_batch_size=256, max_epochs=40, target=0.759, eval_every=4,
                              eval_first=4), Points())

    def mlperf_hyperparameters(self, recipe: CircleRecipe, ctx: Any) -> dict[str, Any]:
        # A constant learning rate, logged as the values the SGD closed rules of the key require.
        return {"opt_name": "sgd", "sgd_opt_base_learning_rate": recipe.lr, "sgd_opt_end_learning_rate": 1e-4,
                "sgd_opt_learning_rate_decay_poly_power": 2.0, "sgd_opt_learning_rate_decay_steps": recipe.max_epochs,
                "sgd_opt_weight_decay": 1e-4, "sgd_opt_momentum": 0.9, "opt_learning_rate_warmup_epochs": 0,
                "model_bn_span": recipe.global_batch_size // ctx.world_size}

    def build(self, recipe: CircleRecipe, ctx: Any, assets: Any) -> ModelParts:
        model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 2)).to(ctx.device)
        return ModelParts(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=0.9),
            loss_fn=lambda m, batch: nn.functional.cross_entropy(m(batch[0]), batch[1]),
            lr_schedule=lambda steps_per_epoch: (lambda step: 1.0),
            eval_forward=lambda m, batch: m(batch[0]).argmax(1))

    def synthetic_batch(self, recipe: CircleRecipe, ctx: Any, model: nn.Module) -> Any:
        n = recipe.global_batch_size // ctx.world_size
        return torch.rand(n, 2, device=ctx.device), torch.zeros(n, dtype=torch.long, device=ctx.device)

    def load_data(self, recipe: CircleRecipe, data_dir: Path, ctx: Any) -> DataParts:
        table = torch.tensor(np.loadtxt(data_dir / "points.csv", delimiter=","), dtype=torch.float32)
        x, y = table[:, :2].to(ctx.device), table[:, 2].long().to(ctx.device)
        (train_x, val_x), (train_y, val_y) = x.split([3000, 1000]), y.split([3000, 1000])
        batch, order = recipe.global_batch_size, ctx.generator("order")
        mine, val = ctx.shard(batch), ctx.shard(1000)

        def train_batches(view: Any) -> Any:
            perm = torch.randperm(3000, generator=order, device=ctx.device)
            for start in range(0, 3000 - batch + 1, batch):
                idx = perm[start:start + batch][mine.start:mine.stop]
                yield train_x[idx], train_y[idx]

        def evaluate(forward: Any) -> EvalPartial:
            correct = (forward((val_x[val.start:val.stop], None)) == val_y[val.start:val.stop]).sum()
            return EvalPartial(metric=accuracy, sums={"correct": correct, "count": torch.tensor(len(val))})

        return DataParts(train_batches=train_batches, steps_per_epoch=3000 // batch,
                         train_samples=3000 // batch * batch, eval_samples=1000, evaluate=evaluate)
