"""DLRMv4-HSTU on Yambda-5B (MLPerf key `dlrmv4`, round 6.1): the reference's HSTU ranker (3 STU layers of
512 over 4,096-event listening histories, 11 embedding tables of 512 sharded by TorchRec, RowWiseAdagrad fused
into the backward by FBGEMM, the dense part data-parallel with Adam), trained one pass over 299 days of anchors
in time order to 0.75 AUC on the day after. Its mini trains on a listening log in the trainer's own format drawn
from a hidden listener model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf import optional
from trainperf.contract import (
    Assets,
    DataParts,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    ShardedTables,
    StepBudget,
    Workload,
)
from trainperf.workloads.dlrmv4 import data, synthetic
from trainperf.workloads.dlrmv4.data import Batch
from trainperf.workloads.dlrmv4.model import HSTU
from trainperf.workloads.dlrmv4.pipeline import StreamingYambda
from trainperf.workloads.dlrmv4.recipes import FULL_RECIPES, MINI, DLRMv4Recipe

__all__ = ["DLRMv4Workload"]


def listen_plus_probability(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The evaluation forward: each anchor's predicted listen_plus probability."""
    return torch.sigmoid(model(batch).float())


def hstu_flops(recipe: DLRMv4Recipe) -> float:
    """Training FLOPs of one sample as the reference counts them (`_hstu_layer_flops` at max_seq_len): 315.7 G at
    the full recipe (its README: 77.3 G projections in, 180.4 G attention, 58.0 G projection out)."""
    s, d, h = float(recipe.max_seq_len), recipe.model_dim, recipe.heads
    projections_in = 6 * s * d * (2 * recipe.linear_dim + 2 * recipe.qk_dim) * h
    attention = 7 * (s * s / 2) * h * (recipe.qk_dim + recipe.linear_dim)
    projection_out = 6 * s * (3 * h * recipe.linear_dim) * d
    return recipe.layers * (projections_in + attention + projection_out) + 6 * d


class DLRMv4Workload(Workload[DLRMv4Recipe]):
    name = "dlrmv4"
    benchmark = "dlrmv4"
    mlperf = MLPerf(ruleset="6.1.0", runs=10, rcp_in_samples=True, full_epoch_samples=data.TRAIN_SAMPLES,
                    full_eval_forwards=data.EVAL_SAMPLES, full_eval_samples=data.EVAL_SAMPLES, mini_waivers=(
                        ("opt_base_learning_rate", 1e-6 * MINI.global_batch_size / 8192,
                         "open_dlrmv4.yaml bounds it to 0.5-1.5e-6 x GBS / 8192, 7.8e-9 to 2.3e-8 at the mini's "
                         "128: a mini trains at 5e-3"),
                        ("opt_sparse_base_learning_rate", 1e-6 * MINI.global_batch_size / 8192,
                         "the same band; the mini's tables train at 0.1"),
                        ("train_samples", data.TRAIN_SAMPLES, "Yambda-5B's count; the mini's days hold 202,175"),
                        ("eval_samples", data.EVAL_SAMPLES, "Yambda-5B's evaluation window; the mini's holds 9,286")))
    metric = Metric("auc", higher_is_better=True)
    summary = ("DLRMv4-HSTU on Yambda-5B, listen_plus ROC AUC on the day after training (mini: a listening log "
               "from a hidden listener model in the trainer's own format)")
    sample_name = "samples"
    speedups = frozenset({"precision", "compile"})
    # A full step at a CPU's size: two samples, tables capped, the sequence cut (the operators are the same).
    step_probe = ("global_batch_size=2", "max_rows=1000", "history_length=30", "max_seq_len=40",
                  "position_buckets=40")
    # 1,083 ops. One blocking copy a step, TorchRec's own (as DLRM-DCNv2's): its KeyedJaggedTensor all-to-all builds
    # the recat indices with torch.tensor(..., device=) in every step's input distribution
    # (torchrec/distributed/dist_data.py, _get_recat). The lengths' maximum (the attention's divisor) and the
    # histories' positions stay on the device; the values' count is the batch's, known on the host.
    step_budget = StepBudget(ops=1190, syncs={"blocking copy": 1}, host_data=1)
    real_layout = ("processed_5b/hstu_cache_L4086/flat_uid.npy", "processed_5b/hstu_cache_L4086/_READY",
                   "shared_metadata/artist_item_mapping.parquet")
    model_parallel_sets = ("embeddings=torchrec",)
    mini = Scale(MINI, synthetic.GeneratedYambda())
    full = Scale(FULL_RECIPES, data.YambdaCache())

    def mlperf_hyperparameters(self, recipe: DLRMv4Recipe, ctx: RuntimeContext) -> dict[str, Any]:
        # The order the closed rules read them in: the batch (logged by the harness) before the rates.
        return {"opt_name": "Adam", "opt_base_learning_rate": recipe.base_lr, "opt_adam_beta_1": recipe.adam_beta1,
                "opt_adam_beta_2": recipe.adam_beta2, "opt_adam_epsilon": recipe.adam_eps, "opt_weight_decay": 0.0,
                "opt_gradient_clip_norm": recipe.max_grad_norm, "opt_sparse_name": "RowWiseAdagrad",
                "opt_sparse_base_learning_rate": recipe.sparse_lr,
                "opt_learning_rate_warmup_steps": recipe.warmup_steps,
                "opt_learning_rate_warmup_start_lr": recipe.warmup_start_lr,
                "max_sequence_length": recipe.max_seq_len, "eval_every_data_pct": recipe.eval_every_pct}

    def notes(self, recipe: DLRMv4Recipe, scale: str) -> list[str]:
        if recipe.max_rows:
            return [f"max_rows={recipe.max_rows}: tables capped at that many rows, ids taken modulo it: not the "
                    "reference model"]
        return []

    def build(self, recipe: DLRMv4Recipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        with torch.device("cpu"):
            optional.require("torchrec", "dlrmv4", optional.TORCHREC)
            from torchrec.optim import RowWiseAdagrad
            from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        model = HSTU(recipe.id_tables, [(name, rows) for name, _, rows, _ in recipe.cross_specs],
                     recipe.embedding_dim, recipe.model_dim, recipe.layers, recipe.heads, recipe.qk_dim,
                     recipe.linear_dim, recipe.hidden_dim, recipe.item_hidden, recipe.input_dropout,
                     recipe.linear_dropout, recipe.action_dim, recipe.max_seq_len, recipe.position_buckets,
                     recipe.time_buckets, ctx.device, recipe.max_rows)
        # The tables' RowWiseAdagrad fused into the backward (FBGEMM's EXACT_ROWWISE_ADAGRAD), the dense part Adam,
        # fused (torch's per-tensor Adam reads each parameter's step count on the host).
        apply_optimizer_in_backward(RowWiseAdagrad, model.tables.parameters(),
                                    {"lr": recipe.sparse_lr, "eps": recipe.adagrad_eps})
        dense = [p for name, p in model.named_parameters() if not name.startswith("tables.")]
        optimizer = torch.optim.Adam(dense, lr=recipe.base_lr, betas=(recipe.adam_beta1, recipe.adam_beta2),
                                     eps=recipe.adam_eps, weight_decay=0.0, fused=True)
        weight = recipe.multitask_weight

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            # The reference's masked BCE of its one task, weighted by causal_multitask_weights.
            return weight * F.binary_cross_entropy_with_logits(model(batch).float(), batch.labels)

        start, warmup = recipe.warmup_start_lr / recipe.base_lr, recipe.warmup_steps

        def schedule(steps_per_epoch: int) -> Any:
            # Linear from the start rate to the base over the warmup, then constant: both optimizers (the
            # reference pushes the same factor through the fused optimizer's groups).
            return lambda step: start + (1.0 - start) * min(1.0, step / warmup) if warmup else 1.0

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, parallel=ShardedTables(),
                          lr_schedule=schedule, eval_forward=listen_plus_probability, eval_compiles=False)

    def formula_flops(self, recipe: DLRMv4Recipe) -> tuple[float, int, str] | None:
        return (hstu_flops(recipe), recipe.max_seq_len,
                "the reference's MFU yardstick (DlrmHSTU.get_num_flops_per_sample): each STU layer's projections at "
                "6 FLOPs a multiply-add and attention's half of the S x S scores at 7, every sequence at max_seq_len, "
                "plus the task head's 6 x width; the towers and tables not counted")

    def synthetic_batch(self, recipe: DLRMv4Recipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        n = ctx.batch_share(recipe.global_batch_size)
        gen = torch.Generator().manual_seed(0)
        history = 3 * (recipe.history_length // 3)
        lengths = torch.randint(1, history + 1, (n,), generator=gen)
        total = int(lengths.sum())
        items, artists, albums, users = recipe.id_tables

        def ids(rows: int, count: int) -> torch.Tensor:
            return torch.randint(0, rows, (count,), generator=gen)

        times = torch.sort(torch.randint(0, 10**6, (total,), generator=gen)).values
        context = torch.stack([ids(users, n), *(ids(rows, n) for _, _, rows, _ in recipe.cross_specs)], 1)
        batch = Batch(context=context, lengths=lengths, items=ids(items, total), artists=ids(artists, total),
                      albums=ids(albums, total), actions=torch.tensor([1, 2, 4])[ids(3, total)], times=times,
                      candidates=torch.stack([ids(items, n), ids(artists, n), ids(albums, n)], 1),
                      query_time=torch.full((n,), 10**6), labels=torch.randint(0, 2, (n,), generator=gen).float())
        return batch.to(ctx.device)

    def batch_samples(self, batch: Batch) -> int:
        return len(batch)

    def split_batch(self, batch: Batch, parts: int) -> list[Batch]:
        return batch.split(parts)

    def load_data(self, recipe: DLRMv4Recipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return StreamingYambda(recipe, data_dir, ctx).parts()


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = DLRMv4Workload
