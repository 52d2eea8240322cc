"""Small fake workloads, one per capability of the contract (module level: the processes that
distributed tests launch, and asynchronous scoring's worker process, import them by name).

Each is a regression of y = 2x on 16 points (batches of 4) with a tiny linear model, so a run takes
a fraction of a second; what differs is the capability it exercises.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    EpochView,
    EvalPartial,
    Logged,
    Metric,
    MLPerf,
    ModelParts,
    Parallelism,
    Recipe,
    RuntimeContext,
    Workload,
)
from trainperf.errors import TrainperfError

N_TRAIN, N_EVAL = 16, 7


@dataclass(frozen=True)
class FakeRecipe(Recipe):
    lr: float = 0.1
    eval_batch: int = 3


def fake_recipe(**overrides: Any) -> FakeRecipe:
    fields: dict[str, Any] = {"name": "t", "global_batch_size": 4, "max_epochs": 8, "target": 0.9, "eval_every": 1,
                              "eval_first": 1}
    fields.update(overrides)
    return FakeRecipe(**fields)


def _scripted(totals: dict[str, Any]) -> float:
    return float(totals["score"])


class Regression(Workload[FakeRecipe]):
    """The base fake: its quality is scripted (`scores`, one per evaluation) so that a test decides
    when the target is met; training and evaluation run for real."""

    name = "fake"
    benchmark = "resnet"
    mlperf = MLPerf(ruleset="1.0.0", runs=5)
    metric = Metric("score")
    summary = "test double"
    speedups = frozenset({"precision", "compile", "async_eval"})

    def __init__(self, scores: list[Any] | None = None, recipe: FakeRecipe | None = None) -> None:
        self.scores = list(scores or [])
        self._recipe = recipe or fake_recipe()
        self.seen: dict[str, Any] = {"eval_models": [], "after_step": 0, "views": []}

    def recipes(self, scale: str) -> dict[str, FakeRecipe]:
        return {"t": self._recipe}

    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        return []

    def prepare(self, scale: str, data_dir: Path, say: Any) -> None:
        pass

    def mlperf_hyperparameters(self, recipe: FakeRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {"opt_base_learning_rate": recipe.lr}

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        model = nn.Linear(1, 1).to(ctx.device)
        self.seen["model"] = model
        self.seen["seed"] = ctx.seed
        return ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=recipe.lr),
                          loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(),
                          lr_schedule=lambda spe: (lambda s: 1.0), eval_forward=self.eval_forward)

    def eval_forward(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.seen["eval_models"].append(model)
        return model(batch[0])

    def synthetic_batch(self, recipe: FakeRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return torch.zeros(4, 1, device=ctx.device), torch.zeros(4, 1, device=ctx.device)

    def points(self, ctx: RuntimeContext) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.linspace(-1, 1, N_TRAIN, device=ctx.device).unsqueeze(1)
        return x, 2 * x

    def train_batches(self, recipe: FakeRecipe, ctx: RuntimeContext, view: EpochView) -> Iterator[Any]:
        self.seen["views"].append(view)
        x, y = self.points(ctx)
        order = torch.randperm(N_TRAIN, generator=ctx.generator(f"order {view.epoch}"), device=ctx.device)
        per_rank = recipe.global_batch_size // ctx.world_size
        for start in range(0, N_TRAIN, recipe.global_batch_size):
            idx = order[start:start + recipe.global_batch_size][ctx.rank * per_rank:(ctx.rank + 1) * per_rank]
            yield x[idx], y[idx]

    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        x = torch.linspace(-1, 1, N_EVAL, device=ctx.device).unsqueeze(1)
        shard = ctx.shard(N_EVAL)
        for start in range(shard.start, shard.stop, recipe.eval_batch):
            chunk = x[start:min(start + recipe.eval_batch, shard.stop)]
            forward((chunk, 2 * chunk))
        return EvalPartial(metric=_scripted, sums={"score": torch.tensor(self.scores.pop(0), dtype=torch.float64)})

    def load_data(self, recipe: FakeRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return DataParts(train_batches=lambda view: self.train_batches(recipe, ctx, view), steps_per_epoch=4,
                         train_samples=N_TRAIN, eval_samples=N_EVAL,
                         evaluate=lambda forward: self.evaluate(recipe, ctx, forward))


# -- a composite metric: Mask R-CNN's box AND mask AP ----------------------------------------------
@dataclass(frozen=True)
class TwoTargetRecipe(FakeRecipe):
    target: tuple[float, ...]  # one per named value: BBOX, SEGM


def _both(totals: dict[str, Any]) -> dict[str, float]:
    return {"BBOX": float(totals["bbox"]), "SEGM": float(totals["segm"])}


class TwoMetrics(Regression):
    """Quality {"BBOX": …, "SEGM": …} with a target each; logged as Mask R-CNN's closed rules want."""

    benchmark = "maskrcnn"
    metric = Metric("ap", parts=("BBOX", "SEGM"))

    def __init__(self, scores: list[dict[str, float]]) -> None:
        super().__init__(scores, TwoTargetRecipe(name="t", global_batch_size=4, max_epochs=8, target=(0.377, 0.339),
                                                 eval_every=1, eval_first=1))

    def mlperf_hyperparameters(self, recipe: FakeRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        # What the closed maskrcnn rules require, with values they accept.
        return {"opt_base_learning_rate": 0.02, "opt_learning_rate_warmup_steps": 0,
                "opt_learning_rate_warmup_factor": 0.3, "num_image_candidates": 1000,
                "opt_learning_rate_decay_factor": 0.1, "opt_learning_rate_decay_steps": [60000, 80000],
                "min_image_size": 800, "max_image_size": 1333}

    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        forward((torch.zeros(1, 1, device=ctx.device), None))
        value = self.scores.pop(0)
        return EvalPartial(metric=_both, sums={"bbox": torch.tensor(value["BBOX"], dtype=torch.float64),
                                               "segm": torch.tensor(value["SEGM"], dtype=torch.float64)})


# -- Python objects gathered to rank 0, scored there (detections, decoded strings) -------------------
def _exact_strings(totals: dict[str, Any]) -> float:
    """Like BLEU on decoded text: each prediction is a string; the score is the share that equals its
    reference. Every evaluation sample must come exactly once (shards gathered in rank order)."""
    ids = [item["id"] for item in totals["predictions"]]
    if sorted(ids) != list(range(N_EVAL)):
        raise TrainperfError(f"evaluation samples not scored exactly once: {ids}")
    hits = sum(item["text"] == f"{2 * item['x']:.1f}" for item in totals["predictions"])
    return hits / N_EVAL


class ObjectGather(Regression):
    """The prediction for each evaluation sample is a string of varying length (a decoded
    sentence); rank 0 scores the gathered strings. Its quality is real: it rises as y = 2x is learnt."""

    host_scoring = "process"  # Python-heavy scoring, as BLEU or COCO AP (used with --async-eval)

    def __init__(self, recipe: FakeRecipe | None = None) -> None:
        super().__init__(recipe=recipe or fake_recipe(target=1.0, max_epochs=30, lr=0.2))

    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        x = torch.linspace(-1, 1, N_EVAL, device=ctx.device).unsqueeze(1)
        predictions = []
        for i in ctx.shard(N_EVAL):
            out = forward((x[i:i + 1], None))
            predictions.append({"id": i, "x": float(x[i]), "text": f"{float(out):.1f}"})
        return EvalPartial(metric=_exact_strings, objects={"predictions": predictions})


class UnpicklableMetric(ObjectGather):
    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        partial = super().evaluate(recipe, ctx, forward)
        partial.metric = lambda totals: _exact_strings(totals)  # a lambda cannot travel to a process
        return partial


# -- a cadence in samples, no epochs (BERT) -------------------------------------------------------
def sample_recipe(**overrides: Any) -> FakeRecipe:
    fields: dict[str, Any] = {"max_epochs": 0, "max_samples": 40, "eval_every_samples": 8, "eval_first_samples": 8,
                              "log_epoch_num": "samples"}
    fields.update(overrides)
    return fake_recipe(**fields)


class SampleCadence(Regression):
    benchmark = "bert"


# -- training data the model produces, of unknown length (MiniGo self-play) -------------------------
class SelfPlay(Regression):
    """Each epoch (a generation) the current model 'plays' 1 + epoch games; every game yields one
    batch labelled from the model's own output. The games' count is logged inside the timed region,
    as MiniGo's rules require."""

    benchmark = "minigo"

    def train_batches(self, recipe: FakeRecipe, ctx: RuntimeContext, view: EpochView) -> Iterator[Any]:
        self.seen["views"].append(view)
        games = 1 + view.epoch
        view.log("actual_selfplay_games_per_generation", games)
        gen = ctx.generator(f"self-play {view.epoch}")
        for _ in range(games):
            with torch.no_grad():
                x = torch.rand(recipe.global_batch_size, 1, generator=gen, device=ctx.device)
                played = view.model(x)  # the model being trained makes the data
            yield x, 2 * x + 0 * played

    def load_data(self, recipe: FakeRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        parts = super().load_data(recipe, data_dir, ctx)
        parts.steps_per_epoch = None
        parts.train_samples = None
        return parts


# -- batches that are not dim-0 tensors: lists of images of different sizes ------------------------
class ImageList(Regression):
    """A batch is (list of [3, h, w] images of different sizes, labels); the model pools each image."""

    def __init__(self, recipe: FakeRecipe | None = None) -> None:
        super().__init__(scores=[0.1] * 20, recipe=recipe or fake_recipe(global_batch_size=5, max_epochs=2))

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        model = nn.Linear(3, 2).to(ctx.device)

        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            images, labels = batch
            pooled = torch.stack([img.mean(dim=(1, 2)) for img in images])
            return nn.functional.cross_entropy(m(pooled), labels)

        return ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=recipe.lr), loss_fn=loss_fn,
                          lr_schedule=lambda spe: (lambda s: 1.0),
                          eval_forward=lambda m, b: m(torch.stack([img.mean(dim=(1, 2)) for img in b[0]])))

    def synthetic_batch(self, recipe: FakeRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return image_batch(recipe.global_batch_size, ctx.device)

    def train_batches(self, recipe: FakeRecipe, ctx: RuntimeContext, view: EpochView) -> Iterator[Any]:
        for _ in range(3):
            yield image_batch(recipe.global_batch_size, ctx.device)

    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        forward(image_batch(2, ctx.device))
        return EvalPartial(metric=_scripted, sums={"score": torch.tensor(self.scores.pop(0), dtype=torch.float64)})

    def load_data(self, recipe: FakeRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        parts = super().load_data(recipe, data_dir, ctx)
        parts.steps_per_epoch, parts.train_samples = 3, 3 * recipe.global_batch_size
        return parts


def image_batch(n: int, device: torch.device | str = "cpu", seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, 6 + i, 9 - i, generator=gen).to(device) for i in range(n)]
    return images, torch.randint(0, 2, (n,), generator=gen).to(device)


# -- clipping, an after-step hook and EMA weights for evaluation (RNN-T) ----------------------------
class ClippedEMA(Regression):
    speedups = frozenset({"precision", "compile"})

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        parts = super().build(recipe, ctx, assets)
        from trainperf.optim import ema

        parts.eval_model = ema(parts.model, decay=0.5)

        def after_step(step: int) -> None:
            self.seen["after_step"] += 1
            parts.eval_model.update_parameters(parts.model)

        parts.after_step = after_step
        self.seen["ema"] = parts.eval_model
        return parts


# -- a compiled evaluation forward (decoding), warmed up before run_start ---------------------------
class CompiledDecode(Regression):
    """Evaluation decodes greedily for a few steps (a loop the compiler unrolls), at two batch sizes
    (3 and the last, smaller one), under the recipe's precision."""

    speedups = frozenset({"precision", "compile"})

    def eval_forward(self, model: nn.Module, batch: Any) -> torch.Tensor:
        # No Python side effects here: they would be guarded on, and recompile.
        tokens = batch[0]
        for _ in range(3):
            tokens = torch.tanh(model(tokens))
        return tokens

    def evaluate(self, recipe: FakeRecipe, ctx: RuntimeContext, forward: Any) -> EvalPartial:
        x = torch.linspace(-1, 1, N_EVAL, device=ctx.device).unsqueeze(1)
        for start in range(0, N_EVAL, recipe.eval_batch):  # batches of 3, 3 and 1
            self.seen.setdefault("eval_dtypes", []).append(forward((x[start:start + recipe.eval_batch], None)).dtype)
        return EvalPartial(metric=_scripted, sums={"score": torch.tensor(self.scores.pop(0), dtype=torch.float64)})

    def load_data(self, recipe: FakeRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        from torch._dynamo.utils import counters

        # Right after run_start: what was compiled before the clock started.
        self.seen["graphs_at_run_start"] = counters["stats"]["unique_graphs"]
        return super().load_data(recipe, data_dir, ctx)


# -- assets: a file build() reads (a pretrained backbone, a start checkpoint, a target model) --------
class WithAsset(Regression):
    def assets(self, recipe: FakeRecipe, data_dir: Path | None) -> dict[str, Path]:
        return {"start checkpoint": Path(data_dir) / "start.pt"}

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        parts = super().build(recipe, ctx, assets)
        parts.model.load_state_dict(assets.state_dict("start checkpoint"))
        return parts


# -- hyperparameters with metadata, and ones counted in iterations of the opened data ---------------
class EpochCountedHyperparameters(Regression):
    """Logs a hyperparameter with metadata (the Transformer's max_sequence_length) and two that depend
    on the steps per epoch, known once the data is open (GNMT's remain steps and decay interval)."""

    def mlperf_hyperparameters(self, recipe: FakeRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {**super().mlperf_hyperparameters(recipe, ctx), "max_sequence_length": Logged(7, {"method": "discard"})}

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        parts = super().build(recipe, ctx, assets)
        parts.epoch_hyperparameters = lambda steps: {"remain_steps": 3 * steps, "decay_interval": steps // 2}
        return parts


# -- the parallelism capability: a workload saying how its model is distributed ------------------------
@dataclass(frozen=True)
class Recorded(Parallelism):
    """A parallelism of the test's own: its engine (registered by the test) records what it was given."""

    engine: ClassVar[str] = "recorded"
    label: str = "x"


class Distributed(Regression):
    """Declares its own parallelism record; the runtime must apply it through the registered engine."""

    def build(self, recipe: FakeRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        parts = super().build(recipe, ctx, assets)
        parts.parallel = Recorded(label="mine")
        return parts
