"""dlrmv4's recipes: the reference convergence points of MLPerf's `rcps_dlrmv4.json` (ruleset 6.1.0: global
batches 8,192, 16,384 and 32,768 at learning rates 1e-6, 2e-6 and 4e-6, the same rate for the dense Adam and
the tables' row-wise Adagrad, a 24,000-step linear warmup from 0 and no decay) and the mini's.

The closed rules (`closed_dlrmv4.yaml`) fix the rest: Adam (0.95, 0.999, 1e-8), no weight decay, gradients
clipped at norm 1, RowWiseAdagrad for the tables, the learning rate within 0.5-1.5 x 1e-6 x GBS / 8,192,
sequences of 4,096, an evaluation every 0.1 % of the 2,290,835,423 training samples (a whole number of
steps, rounded up) and the first one at the grid point at or after floor((4,480 x GBS + 135,331,840) / 3)
samples. One pass at most over the training days, in time order."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Counts, Fraction, Positive
from trainperf.errors import TrainperfError
from trainperf.workloads.dlrmv4 import data, synthetic


def eval_interval(train_samples: int, gbs: int, pct: float = 0.001) -> int:
    """Samples between evaluations: `pct` of the training samples, rounded up to whole steps (the checker's
    `eval_interval_samples`)."""
    return max(1, math.ceil(pct * train_samples / gbs)) * gbs


def first_eval(gbs: int, interval: int) -> int:
    """The first evaluation's samples: the grid point at or after the reference's linear fit through the RCP
    runs' earliest crossings, backed off by two intervals (the checker's `first_eval_samples`)."""
    return math.ceil(((4480 * gbs + 135_331_840) // 3) / interval) * interval


@dataclass(frozen=True)
class DLRMv4Recipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr", "sparse_lr")
    base_lr: Positive = 1e-6  # the dense Adam's
    sparse_lr: Positive = 1e-6  # the tables' RowWiseAdagrad (the closed rules: equal to base_lr)
    adam_beta1: Fraction = 0.95
    adam_beta2: Fraction = 0.999
    adam_eps: Positive = 1e-8
    adagrad_eps: Positive = 1e-8
    warmup_steps: int = 24_000  # linear from warmup_start_lr, on both optimizers; then constant
    warmup_start_lr: float = 0.0
    embedding_dim: Count = 512  # every table's width
    model_dim: Count = 512  # the transducer's
    layers: Count = 3  # STU layers (the gin's HSTU_NUM_LAYERS)
    heads: Count = 4
    qk_dim: Count = 128  # per head
    linear_dim: Count = 128  # per head (U and V)
    hidden_dim: Count = 256  # the preprocessor's MLPs
    item_hidden: Count = 512  # the item tower's and the prediction head's
    input_dropout: Fraction = 0.2
    linear_dropout: Fraction = 0.1
    action_dim: Count = 8
    max_seq_len: Count = 4096
    history_length: Count = data.HISTORY_LENGTH
    scan_window: Count = data.SCAN_WINDOW
    position_buckets: Count = 8192
    time_buckets: Count = 2048
    multitask_weight: Positive = 0.2  # the loss's factor (causal_multitask_weights)
    # Rows of the id tables (items, artists, albums, users) and of the crossed ones, in data.CROSS_SPECS' order.
    id_tables: Counts = tuple(data.ID_TABLES.values())
    cross_tables: Counts = tuple(rows for _, _, rows, _ in data.CROSS_SPECS)
    train_windows: Count = data.TRAIN_WINDOWS  # days of training anchors, read in order
    eval_window: int = data.EVAL_WINDOW
    window_seconds: Count = data.WINDOW_SECONDS
    eval_batch_size: Count = 1024  # per process
    eval_every_pct: Positive = 0.001  # of the training samples (logged: eval_every_data_pct)
    # The evaluation grid the closed rules compute from the batch (every eval_every_pct of train_samples, rounded
    # up to whole steps; the first at the rules' fit): recomputed whenever the batch changes. False: the
    # recipe's own eval_every_samples and eval_first_samples (the mini's).
    rules_grid: bool = False
    # At most this many rows per table, ids taken modulo it; 0: none. A full-shape step on a machine that cannot
    # hold the 150 billion table parameters (the CPU's step probe, bench): not the reference model.
    max_rows: int = 0
    # The tables' engine: TorchRec's EmbeddingCollection, sharded by its planner, RowWiseAdagrad fused into the
    # backward by FBGEMM, as the reference's DistributedModelParallel.
    embeddings: str = "torchrec"

    CHOICES = {"embeddings": ("torchrec",)}

    def __post_init__(self) -> None:
        # Values out of their ranges are left for validate() to name (the grid is computed from valid ones only).
        if self.rules_grid and self.global_batch_size > 0 and math.isfinite(self.eval_every_pct) and (
                self.eval_every_pct > 0 and self.eval_every_samples >= 0 and self.eval_first_samples >= 0):
            interval = eval_interval(data.TRAIN_SAMPLES, self.global_batch_size, self.eval_every_pct)
            object.__setattr__(self, "eval_every_samples", interval)
            object.__setattr__(self, "eval_first_samples", first_eval(self.global_batch_size, interval))

    def validate(self) -> None:
        super().validate()
        if len(self.id_tables) != len(data.ID_TABLES):
            raise TrainperfError(f"recipe field id_tables: {len(data.ID_TABLES)} values expected (items, artists, "
                                 f"albums, users), got {len(self.id_tables)}")
        if len(self.cross_tables) != len(data.CROSS_SPECS):
            raise TrainperfError(f"recipe field cross_tables: {len(data.CROSS_SPECS)} values expected, got "
                                 f"{len(self.cross_tables)}")
        if self.max_seq_len < 2 + 1 + len(self.cross_tables):
            raise TrainperfError(f"recipe field max_seq_len {self.max_seq_len}: the candidate and "
                                 f"{1 + len(self.cross_tables)} contextual slots leave no room for a history")
        if self.position_buckets < self.max_seq_len:
            raise TrainperfError(f"recipe field position_buckets {self.position_buckets}: fewer than max_seq_len "
                                 f"{self.max_seq_len}")
        if self.warmup_start_lr and self.sparse_lr != self.base_lr:
            # One factor drives both optimizers' rates (the runtime's schedule); the reference starts each at
            # min(start, its own rate): the same only when the rates are equal (the closed rules') or the start 0.
            raise TrainperfError("recipe field warmup_start_lr: a non-zero start needs sparse_lr equal to base_lr")
        if self.grad_accum_steps > 1:
            raise TrainperfError("recipe field grad_accum_steps > 1: the tables' update is fused into each backward "
                                 "pass, so it cannot wait for several micro-batches")

    @property
    def cross_specs(self) -> tuple[tuple[str, tuple[str, ...], int, int], ...]:
        return tuple((name, keys, rows, salt) for (name, keys, _, salt), rows
                     in zip(data.CROSS_SPECS, self.cross_tables, strict=True))


def _rcp(gbs: int, lr: float) -> DLRMv4Recipe:
    return DLRMv4Recipe(name=f"gbs{gbs}", global_batch_size=gbs, base_lr=lr, sparse_lr=lr, max_epochs=1,
                        target=0.75, eval_every=1, eval_first=1, rules_grid=True, max_samples=data.TRAIN_SAMPLES,
                        log_epoch_num="samples", max_grad_norm=1.0, precision="bf16")


# 8,192 first: the reference's single-node point (8 GPUs of 1,024).
FULL_RECIPES = {r.name: r for r in (_rcp(8192, 1e-6), _rcp(16_384, 2e-6), _rcp(32_768, 4e-6))}

_MINI_GBS = 128
MINI = DLRMv4Recipe(
    name="mini", global_batch_size=_MINI_GBS, base_lr=5e-3, sparse_lr=0.1, warmup_steps=20, max_epochs=1,
    target=0.72, eval_every=1, eval_first=1, eval_every_samples=32 * _MINI_GBS, eval_first_samples=128 * _MINI_GBS,
    max_samples=800 * _MINI_GBS, log_epoch_num="samples", max_grad_norm=1.0, embedding_dim=32, model_dim=32,
    layers=3, heads=2, qk_dim=16, linear_dim=16, hidden_dim=32, item_hidden=32, max_seq_len=40,
    history_length=synthetic.HISTORY, scan_window=300, position_buckets=40, time_buckets=128,
    id_tables=synthetic.ID_ROWS, cross_tables=synthetic.CROSS_ROWS, train_windows=synthetic.DAYS - 1,
    eval_window=synthetic.DAYS - 1, eval_batch_size=1024)
