"""DLRM on Criteo Terabyte (MLPerf key `dlrm`, the v0.7–v1.0 form), and its mini scale on day files
generated in the same raw format from a planted teacher."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Imported with the workload, not at the first evaluation: the import (~1.4 s here) is not training time.
from trainperf import optional
from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    ShardedTables,
    StepBudget,
    Workload,
    bare_model,
)
from trainperf.errors import TrainperfError
from trainperf.workloads.common.criteo.evaluation import click_probability
from trainperf.workloads.dlrm import data as dlrm_data
from trainperf.workloads.dlrm import mini as dlrm_mini
from trainperf.workloads.dlrm.model import DLRM
from trainperf.workloads.dlrm.pipeline import CriteoPipeline
from trainperf.workloads.dlrm.recipes import (
    FULL_DAYS,
    FULL_RECIPES,
    MIN_LR,
    MINI,
    MINI_DAYS,
    MINI_ROWS_PER_DAY,
    DLRMRecipe,
)


def lr_factor(recipe: DLRMRecipe) -> Callable[[int], float]:
    """The reference schedule as a multiplier of base_lr: linear warmup from 0, hold, then
    ((remaining decay steps) / decay_steps) ** 2 from decay_start_step, floored at MIN_LR."""
    floor = MIN_LR / recipe.base_lr if recipe.base_lr > 0 else 0.0

    def factor(step: int) -> float:
        if step < recipe.warmup_steps:
            return step / recipe.warmup_steps
        if recipe.decay_steps > 0 and step >= recipe.decay_start_step:
            done = step - recipe.decay_start_step
            if done >= recipe.decay_steps:
                return floor
            return max(floor, ((recipe.decay_steps - done) / recipe.decay_steps) ** recipe.poly_power)
        return 1.0

    return factor


class DLRMWorkload(Workload[DLRMRecipe]):
    name = "dlrm"
    mlperf = MLPerf(ruleset="1.0.0", runs=5, full_epoch_samples=4_195_197_692, full_eval_forwards=89_137_319,
                    full_eval_samples=89_137_319)
    benchmark = "dlrm"
    metric = Metric("auc", higher_is_better=True)
    summary = "DLRM on Criteo Terabyte, ROC AUC (mini: planted-teacher day files in the raw TSV format)"
    speedups = frozenset({"precision", "compile", "cuda_graphs", "async_eval"})
    step_probe = ("global_batch_size=128", "max_ind_range=1000")
    step_budget = StepBudget(ops=620)
    # 96 GB of reference tables: capped
    device_probe = DeviceProbe(batch=8192, sets=("max_ind_range=10000000",))
    real_layout = ("day_0", "day_1")
    model_parallel_sets = ("embeddings=torchrec",)

    mini = Scale(MINI, dlrm_mini.PlantedTeacherDays(MINI_DAYS, MINI_ROWS_PER_DAY))
    full = Scale(FULL_RECIPES, dlrm_data.CriteoDays(FULL_DAYS))

    def mlperf_hyperparameters(self, recipe: DLRMRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_base_learning_rate": recipe.base_lr, "sgd_opt_base_learning_rate": recipe.base_lr,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps, "lr_decay_start_steps": recipe.decay_start_step,
            "sgd_opt_learning_rate_decay_steps": recipe.decay_steps,
            "sgd_opt_learning_rate_decay_poly_power": recipe.poly_power,
        }

    def assets(self, recipe: DLRMRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The tables are sized by the preprocessed dataset; without one (synthetic benchmarks), by the
        # recipe's table_sizes.
        return {"dataset manifest": data_dir / dlrm_data.MANIFEST} if data_dir is not None else {}

    def notes(self, recipe: DLRMRecipe, scale: str) -> list[str]:
        if recipe.max_ind_range:
            return [f"max_ind_range={recipe.max_ind_range}: tables capped at that many rows, ids hashed modulo it "
                    "(the reference caps at 40,000,000): not the reference model"]
        return []

    def build(self, recipe: DLRMRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        if "dataset manifest" in assets:
            table_sizes = dlrm_data.manifest_table_sizes(assets.json("dataset manifest"), assets["dataset manifest"])
        else:
            table_sizes = list(recipe.table_sizes)
        # Sparse embedding gradients (only the rows a batch touched) on one process. Data parallelism
        # all-reduces dense ones instead: DDP's sparse all-reduce is unsupported on NCCL and was slow
        # (and once crashed) on gloo. The full tables (24e9 parameters) do not fit one GPU anyway:
        # full-scale multi-GPU DLRM needs model-parallel embeddings, which trainperf does not have.
        sparse = ctx.world_size == 1
        if recipe.embedding_device == "cpu" and ctx.world_size > 1:
            raise TrainperfError("embedding_device=cpu: supported on a single process only (data parallelism "
                                 "would all-reduce the host tables)")
        if recipe.embeddings == "torchrec":
            return self._build_torchrec(recipe, ctx, table_sizes)
        # Built where it trains: the full tables (up to 10 M rows each) initialised on the host and then copied
        # cost a GPU round tens of seconds a build (host tables: built on the host).
        with torch.device("cpu" if recipe.embedding_device == "cpu" else ctx.device):
            model = DLRM(table_sizes, recipe.embedding_dim, recipe.bottom_mlp, recipe.top_mlp, sparse=sparse,
                         max_ind_range=recipe.max_ind_range)
        model = model.to(ctx.device)
        if recipe.embedding_device == "cpu":
            model.embeddings.to("cpu")
        # Plain SGD on every parameter (the reference: no momentum, no weight decay); sparse gradients
        # take torch's per-tensor path.
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.base_lr)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            dense, sparse, labels = batch
            return F.binary_cross_entropy_with_logits(model(dense, sparse).float(), labels)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=click_probability)

    def _build_torchrec(self, recipe: DLRMRecipe, ctx: RuntimeContext, table_sizes: list[int]) -> ModelParts:
        """The tables as one TorchRec collection, their SGD applied inside the backward by FBGEMM (the
        reference's optimizer), the MLPs with plain SGD; the runtime shards the tables (ShardedTables)."""
        optional.require("torchrec", "embeddings=torchrec", optional.TORCHREC)
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        model = DLRM(table_sizes, recipe.embedding_dim, recipe.bottom_mlp, recipe.top_mlp,
                     max_ind_range=recipe.max_ind_range, engine="torchrec")
        for name, child in model.named_children():
            if name != "embeddings":
                child.to(ctx.device)
        model.pair_rows, model.pair_cols = model.pair_rows.to(ctx.device), model.pair_cols.to(ctx.device)
        apply_optimizer_in_backward(torch.optim.SGD, model.embeddings.parameters(), {"lr": recipe.base_lr})
        dense = [p for name, p in model.named_parameters() if not name.startswith("embeddings.")]
        optimizer = torch.optim.SGD(dense, lr=recipe.base_lr)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            dense_x, sparse_x, labels = batch
            return F.binary_cross_entropy_with_logits(model(dense_x, sparse_x).float(), labels)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, parallel=ShardedTables(),
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=click_probability)

    def synthetic_batch(self, recipe: DLRMRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        bare = bare_model(model)
        n = ctx.batch_share(recipe.global_batch_size)
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        dense = torch.rand((n, dlrm_data.N_DENSE), device=ctx.device, generator=gen) * 5
        tables = ctx.device if bare.engine == "torchrec" else bare.embeddings[0].weight.device
        sparse = torch.stack([torch.randint(0, rows, (n,), device=ctx.device, generator=gen)
                              for rows in bare.table_sizes], dim=1).to(tables)
        return dense, sparse, torch.randint(0, 2, (n,), device=ctx.device, generator=gen).float()

    def load_data(self, recipe: DLRMRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return CriteoPipeline(recipe, data_dir, ctx).parts()


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = DLRMWorkload
