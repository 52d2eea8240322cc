"""NCF (NeuMF) on MovieLens-20m (MLPerf key `ncf`), and its mini scale on a planted-preference
ratings.csv in the same format."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.spec import (
    Assets,
    DataParts,
    EpochView,
    EvalPartial,
    Metric,
    ModelParts,
    Recipe,
    RuntimeContext,
    Workload,
    bare_model,
)
from trainperf.spec.fields import Count, Counts, Fraction, Positive
from trainperf.workloads.ncf import data as ncf_data

TOP_K = 10
# The mini dataset (generated once by `prepare`, so not a recipe field: a recipe cannot change it).
MINI_USERS, MINI_ITEMS = 3000, 1000


@dataclass(frozen=True)
class NCFRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    factors: Count = 64  # GMF embedding size
    mlp_layers: Counts = (256, 256, 128, 64)  # first = concatenated user+item MLP embeddings
    base_lr: Positive = 5e-4
    beta1: Fraction = 0.9
    beta2: Fraction = 0.999
    eps: Positive = 1e-8
    train_negatives: int = 4
    eval_batch_users: Count = 256
    # The embeddings of a run without a converted dataset (synthetic benchmarks): ml-20m's users and
    # items; a dataset's own counts win.
    users: Count = 138_493
    items: Count = 26_744

    def validate(self) -> None:
        super().validate()
        if self.factors < 1 or len(self.mlp_layers) < 2 or self.mlp_layers[0] % 2 or self.train_negatives < 1:
            raise TrainperfError("recipe: need factors >= 1, >= 2 even-first mlp_layers, train_negatives >= 1")
        if self.users < 1 or self.items < 1:
            raise TrainperfError("recipe: need users >= 1 and items >= 1")


FULL = NCFRecipe(name="reference", global_batch_size=2048, max_epochs=20, target=0.635, eval_every=1, eval_first=1)
MINI = NCFRecipe(name="mini", global_batch_size=1024, max_epochs=12, target=0.35, eval_every=1, eval_first=1,
                 factors=16, mlp_layers=(64, 32, 16), base_lr=4e-3, users=MINI_USERS, items=MINI_ITEMS)


class NeuMF(nn.Module):
    """GMF (elementwise product of embeddings) + MLP over concatenated embeddings, joined by a linear
    layer to one logit; initialised as the reference (embeddings N(0, 0.01), MLP Glorot-uniform,
    output LeCun-uniform)."""

    def __init__(self, n_users: int, n_items: int, factors: int, mlp_layers: tuple[int, ...]) -> None:
        super().__init__()
        half = mlp_layers[0] // 2
        self.gmf_user, self.gmf_item = nn.Embedding(n_users, factors), nn.Embedding(n_items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(n_users, half), nn.Embedding(n_items, half)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(mlp_layers[:-1], mlp_layers[1:], strict=True))
        self.out = nn.Linear(factors + mlp_layers[-1], 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, std=0.01)
        for layer in self.mlp:
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        bound = (3.0 / self.out.in_features) ** 0.5
        nn.init.uniform_(self.out.weight, -bound, bound)
        nn.init.zeros_(self.out.bias)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.gmf_user(users) * self.gmf_item(items)
        x = torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1)
        for layer in self.mlp:
            x = F.relu(layer(x))
        return self.out(torch.cat([gmf, x], dim=-1)).squeeze(-1)


def hit_rate_hits(scores_pos: torch.Tensor, scores_neg: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """Hits@k per user, vectorised: the positive's rank is the number of negatives scoring >= it
    (ties are ranked ahead of the positive, as the MLPerf rules require)."""
    rank = (scores_neg >= scores_pos.unsqueeze(1)).sum(dim=1)
    return (rank < k).long()


def _scores(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The evaluation forward: the score of every (user, candidate item) pair."""
    users, items = batch
    return model(users, items).float()


def popularity_hr(train_pairs: np.ndarray, test_pos: np.ndarray, test_neg: np.ndarray, n_items: int) -> float:
    """HR@10 of ranking by training popularity: the baseline a learned model must clearly beat."""
    counts = torch.from_numpy(np.bincount(train_pairs[:, 1], minlength=n_items)).float()
    hits = hit_rate_hits(counts[torch.tensor(test_pos)], counts[torch.tensor(test_neg)])
    return hits.float().mean().item()


class NCFWorkload(Workload[NCFRecipe]):
    name = "ncf"
    full_epoch_samples = 99_308_850
    full_eval_forwards = 138_493_000
    full_eval_samples = 138_493
    benchmark = "ncf"
    # No official ruleset of the :::MLLOG format knows ncf (retired after v0.5): the 0.7.0 common rules
    # plus trainperf's own rules file, run by the official checker.
    ruleset = "0.7.0"
    own_rules = Path(__file__).with_name("rules.yaml")
    metric = Metric("hr@10", higher_is_better=True)
    summary = "NeuMF on MovieLens-20m, HR@10 (mini: planted-preference ratings in ml-20m format)"
    mlperf_runs = 10
    speedups = frozenset({"precision", "compile", "fused_optimizer", "async_eval"})
    step_probe = ("global_batch_size=256",)

    def recipes(self, scale: str) -> dict[str, NCFRecipe]:
        return {"mini": MINI} if scale == "mini" else {"reference": FULL}

    @staticmethod
    def _converted_dir(data_dir: Path) -> Path:
        """The folder holding ratings.csv (the conversion is cached beside it, as the reference does):
        DIR itself, or DIR/ml-20m when the user points at the folder the zip was extracted into."""
        return data_dir / "ml-20m" if (data_dir / "ml-20m").is_dir() else data_dir

    def eval_set(self, scale: str, data_dir: Path) -> tuple[Path, int] | None:
        root = self._converted_dir(data_dir)  # one test item per user: empty only with no user at all
        manifest = ncf_data.converted(root)
        return (root / ncf_data.MANIFEST, int(manifest["users"])) if manifest else None

    def sources(self, scale: str, data_dir: Path) -> dict[str, Path]:
        return {"ratings.csv": self._converted_dir(data_dir) / "ratings.csv"}

    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        root = self._converted_dir(data_dir)
        again = "trainperf prepare ncf" + (f" --scale full --data {data_dir}" if scale == "full" else "")
        manifest = ncf_data.converted(root)
        if manifest:
            why = ncf_data.staleness(manifest, root / "ratings.csv")
            return [f"{why}; run {again}"] if why else []
        if scale == "mini":
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare ncf)"]
        if not (root / "ratings.csv").is_file():
            return [f"{root / 'ratings.csv'}: missing (expected ml-20m/ratings.csv with header "
                    "userId,movieId,rating,timestamp)"]
        return [f"{root}: ratings.csv not converted yet ({again})"]

    def prepare(self, scale: str, data_dir: Path, say: Callable[[str], None]) -> None:
        root = self._converted_dir(data_dir)
        manifest = ncf_data.converted(root)
        if manifest:
            why = ncf_data.staleness(manifest, root / "ratings.csv")
            if why is None:
                say(f"{root}: already converted")
                return
            say(f"{why}: converting again")
        root.mkdir(parents=True, exist_ok=True)
        if scale == "mini" and not (root / "ratings.csv").is_file():
            rows = ncf_data.generate_ratings(root / "ratings.csv", MINI_USERS, MINI_ITEMS)
            say(f"wrote {rows:,} synthetic ratings to {root / 'ratings.csv'} (ml-20m format)")
        ncf_data.convert(root / "ratings.csv", root, say)

    def mlperf_hyperparameters(self, recipe: NCFRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_name": "adam", "opt_base_learning_rate": recipe.base_lr, "opt_adam_beta_1": recipe.beta1,
            "opt_adam_beta_2": recipe.beta2, "opt_adam_epsilon": recipe.eps,
            "model_hp_mf_dim": recipe.factors, "model_hp_mlp_layer_sizes": list(recipe.mlp_layers),
            "input_hp_num_neg": recipe.train_negatives, "eval_hp_num_neg": ncf_data.NUM_EVAL_NEGATIVES,
        }

    def assets(self, recipe: NCFRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The embeddings are sized by the converted dataset's user and item counts; without one
        # (synthetic benchmarks), by the recipe's.
        return {"dataset manifest": self._converted_dir(data_dir) / ncf_data.MANIFEST} if data_dir is not None else {}

    def build(self, recipe: NCFRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if "dataset manifest" in assets:
            users, items = ncf_data.manifest_sizes(assets.json("dataset manifest"), assets["dataset manifest"])
        else:
            users, items = recipe.users, recipe.items
        model = NeuMF(users, items, recipe.factors, recipe.mlp_layers).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2),
                                     eps=recipe.eps, **impl)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            users, items, labels = batch
            return F.binary_cross_entropy_with_logits(model(users, items).float(), labels)

        # The reference trains at a constant Adam learning rate.
        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn,
                          lr_schedule=lambda steps: (lambda step: 1.0), eval_forward=_scores)

    def synthetic_batch(self, recipe: NCFRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        bare = bare_model(model)
        n = recipe.global_batch_size // ctx.world_size
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        users = torch.randint(0, bare.gmf_user.num_embeddings, (n,), device=ctx.device, generator=gen)
        items = torch.randint(0, bare.gmf_item.num_embeddings, (n,), device=ctx.device, generator=gen)
        return users, items, torch.randint(0, 2, (n,), device=ctx.device, generator=gen).float()

    def synthetic_eval_batch(self, recipe: NCFRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        bare = bare_model(model)
        gen = torch.Generator(device=ctx.device).manual_seed(1)
        shape = (recipe.eval_batch_users, 1 + ncf_data.NUM_EVAL_NEGATIVES)
        users = torch.randint(0, bare.gmf_user.num_embeddings, shape, device=ctx.device, generator=gen)
        return users, torch.randint(0, bare.gmf_item.num_embeddings, shape, device=ctx.device, generator=gen)

    def load_data(self, recipe: NCFRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        root = self._converted_dir(data_dir)
        manifest = ncf_data.converted(root)
        train, test_users, test_pos, test_neg = ncf_data.load(root)
        device = ctx.device
        pos_users = torch.tensor(train[:, 0]).to(device)
        pos_items = torch.tensor(train[:, 1]).to(device)
        n_items = manifest["items"]
        per_epoch = pos_users.numel() * (1 + recipe.train_negatives)
        batch = recipe.global_batch_size
        usable = per_epoch if per_epoch % batch >= ctx.world_size or per_epoch % batch == 0 else \
            per_epoch - per_epoch % batch
        gen = ctx.generator("negatives")
        shard = ctx.shard(test_users.shape[0])
        eval_users = torch.tensor(test_users[shard.start:shard.stop]).to(device)
        eval_pos = torch.tensor(test_pos[shard.start:shard.stop]).to(device)
        eval_neg = torch.tensor(test_neg[shard.start:shard.stop]).to(device)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            # Fresh training negatives every epoch (uniform over all items), the same on every rank.
            k = recipe.train_negatives
            users = torch.cat([pos_users, pos_users.repeat(k)])
            items = torch.cat([pos_items, torch.randint(0, n_items, (pos_items.numel() * k,), device=device,
                                                          generator=gen)])
            labels = torch.cat([torch.ones(pos_users.numel(), device=device),
                                torch.zeros(pos_users.numel() * k, device=device)])
            order = torch.randperm(users.numel(), device=device, generator=gen)[:usable]
            for start in range(0, usable, batch):
                idx = order[start:start + batch]
                mine = ctx.shard(idx.numel())
                idx = idx[mine.start:mine.stop]
                yield users[idx], items[idx], labels[idx]

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            hits = torch.zeros((), dtype=torch.long, device=device)
            for start in range(0, eval_users.numel(), recipe.eval_batch_users):
                u = eval_users[start:start + recipe.eval_batch_users]
                candidates = torch.cat([eval_pos[start:start + recipe.eval_batch_users].unsqueeze(1),
                                        eval_neg[start:start + recipe.eval_batch_users]], dim=1)
                scores = forward((u.unsqueeze(1).expand_as(candidates), candidates))
                hits += hit_rate_hits(scores[:, 0], scores[:, 1:]).sum()
            count = torch.tensor(eval_users.numel(), device=device)
            return EvalPartial(metric=lambda t: t["hits"].item() / max(t["count"].item(), 1),
                               sums={"hits": hits, "count": count})

        return DataParts(train_batches=train_batches, steps_per_epoch=-(-usable // batch), train_samples=usable,
                         eval_samples=int(test_users.shape[0]), evaluate=evaluate)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = NCFWorkload
