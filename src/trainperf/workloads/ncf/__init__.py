"""NCF (NeuMF) on MovieLens-20m (MLPerf key `ncf`), and its mini scale on a planted-preference
ratings.csv in the same format."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    EpochView,
    EvalPartial,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
    bare_model,
)
from trainperf.optim import kernels
from trainperf.workloads.ncf import data as ncf_data
from trainperf.workloads.ncf.model import NeuMF, hit_rate_hits, pair_scores, popularity_hr
from trainperf.workloads.ncf.recipes import FULL, MINI, MINI_ITEMS, MINI_USERS, NCFRecipe

__all__ = ["FULL", "MINI", "NCFRecipe", "NCFWorkload", "NeuMF", "hit_rate_hits", "popularity_hr"]


class NCFWorkload(Workload[NCFRecipe]):
    name = "ncf"
    mlperf = MLPerf(ruleset="0.7.0", runs=10, own_rules=Path(__file__).with_name("rules.yaml"),
                    full_epoch_samples=99_308_850, full_eval_forwards=138_493_000, full_eval_samples=138_493)
    benchmark = "ncf"
    # No official ruleset of the :::MLLOG format knows ncf (retired after v0.5): the 0.7.0 common rules
    # plus trainperf's own rules file, run by the official checker.
    metric = Metric("hr@10", higher_is_better=True)
    summary = "NeuMF on MovieLens-20m, HR@10 (mini: planted-preference ratings in ml-20m format)"
    speedups = frozenset({"precision", "compile", "cuda_graphs", "fused_optimizer", "async_eval"})
    step_probe = ("global_batch_size=256",)
    step_budget = StepBudget(ops=150)
    device_probe = DeviceProbe(batch=65536)
    real_layout = ("ml-20m/ratings.csv",)
    mini = Scale(MINI, ncf_data.PlantedRatings(MINI_USERS, MINI_ITEMS))
    full = Scale(FULL, ncf_data.MovieLens())

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
        if data_dir is None:
            return {}
        return {"dataset manifest": ncf_data.converted_dir(data_dir) / ncf_data.MANIFEST}

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
                          lr_schedule=lambda steps: (lambda step: 1.0), eval_forward=pair_scores)

    def synthetic_batch(self, recipe: NCFRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        bare = bare_model(model)
        n = ctx.batch_share(recipe.global_batch_size)
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
        root = ncf_data.converted_dir(data_dir)
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
