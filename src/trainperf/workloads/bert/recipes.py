"""BERT's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs, phase 2 from the
phase-1 checkpoint) and the mini's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import annotated_types as at

from trainperf.contract import (
    Recipe,
)
from trainperf.contract.fields import Count, Fraction, Positive
from trainperf.errors import TrainperfError
from trainperf.workloads.bert import data as bert_data
from trainperf.workloads.bert import model as bert_model


def eval_interval(global_batch_size: int) -> int:
    """The v1.0 rules' evaluation interval in training samples:
    floor(0.05 * (230.23 * GBS + 3,000,000) / 25,000) * 25,000."""
    return math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000


@dataclass(frozen=True)
class BertRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("train_steps", "warmup_steps", "start_warmup_step")
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    # LAMB and the reference schedule (opt_learning_rate_training_steps = train_steps).
    base_lr: Positive = 4e-4
    train_steps: Count = 8103
    warmup_steps: int = 0
    start_warmup_step: Annotated[int, at.Le(0)] = 0
    beta1: Fraction = 0.9
    beta2: Fraction = 0.999
    weight_decay: float = 0.01
    eps: Positive = 1e-6
    # The network, BERT-Large by default (`--set model.hidden=…` or `--set hidden=…`): a checkpoint
    # must have its sizes; vocab_size and max_positions are the checkpoint's where there is one.
    model: bert_model.BertConfig = bert_model.BertConfig()
    max_seq_length: Count = 512  # synthetic batches' length (real ones: the shards')
    max_predictions: Count = 76
    max_per_row: Count = 3  # sequences per packed row (packing=true)
    eval_batch_size: Count = 64
    cache_shards: bool = False  # keep every training shard in memory after its first read
    # The phase-1 state dict: "" = DIR/phase1/model.ckpt-28252.pt, "shipped" = the mini checkpoint in the
    # package (its vocabulary and SHA-256 checked), "none" = random initialisation, else a path.
    checkpoint: str = ""

    def validate(self) -> None:
        super().validate()
        if self.base_lr <= 0 or self.train_steps < 1 or self.warmup_steps < 0:
            raise TrainperfError("recipe: need base_lr > 0, train_steps >= 1 and warmup_steps >= 0")
        if self.model.hidden % self.model.heads:
            raise TrainperfError(f"recipe fields model.hidden={self.model.hidden} and model.heads={self.model.heads}: "
                                 "the hidden size must be divisible by the heads")
        if self.packing and self.cuda_graphs:
            raise TrainperfError("cuda_graphs with packing=true: a packed batch's row count changes with the lengths "
                                 "it packs (no row buckets yet), so every new count would be recorded again; "
                                 "unpacked rows are all max_seq_length long")
        if self.max_predictions + 3 > self.max_seq_length:
            raise TrainperfError(f"recipe fields max_predictions={self.max_predictions} and max_seq_length="
                                 f"{self.max_seq_length}: a sequence holds [CLS], two [SEP] and at most "
                                 "max_seq_length - 3 masked positions")


def _rcp(*, global_batch_size: int, train_steps: int, **fields: Any) -> BertRecipe:
    """A full recipe at one of the RCP points (mlperf_logging's rcps_bert.json, ruleset 2.0.0 file)."""
    gbs = global_batch_size
    return BertRecipe(name=f"gbs{gbs}", global_batch_size=gbs, max_epochs=0, target=0.720, eval_every=1,
                      eval_first=1, eval_every_samples=eval_interval(gbs), log_epoch_num="samples",
                      max_samples=train_steps * gbs, max_grad_norm=1.0, train_steps=train_steps,
                      fused_optimizer=True, **fields)


FULL_RECIPES = {r.name: r for r in (
    _rcp(global_batch_size=256, base_lr=3.5e-4, train_steps=13700, warmup_steps=0, start_warmup_step=0,
         beta1=0.9, beta2=0.999, weight_decay=0.01),
    _rcp(global_batch_size=1536, base_lr=2e-3, train_steps=2254, warmup_steps=0, start_warmup_step=0,
         beta1=0.66, beta2=0.996, weight_decay=0.01),
    _rcp(global_batch_size=4096, base_lr=2.4e-3, train_steps=855, warmup_steps=0, start_warmup_step=0,
         beta1=0.66, beta2=0.998, weight_decay=0.01),
    _rcp(global_batch_size=8192, base_lr=0.00288293, train_steps=600, warmup_steps=287, start_warmup_step=-76,
         beta1=0.88, beta2=0.88, weight_decay=0.0166629),
    _rcp(global_batch_size=16384, base_lr=3.3e-3, train_steps=600, warmup_steps=290, start_warmup_step=-100,
         beta1=0.75, beta2=0.9, weight_decay=0.0166629),
)}

# The mini: a 2-layer, 128-wide BERT from the shipped phase-1 checkpoint, sequences of 128 tokens.
# Budget 40,000 samples (625 steps of 64, where the LR reaches 0); evaluation every 3,200 samples.
# Dropout 0: at this size and budget it only slowed learning, and cost 30 % of a CPU step.
MINI = BertRecipe(name="mini", global_batch_size=64, max_epochs=0, target=0.305, eval_every=1, eval_first=1,
                  eval_every_samples=3200, log_epoch_num="samples", max_samples=40_000, max_grad_norm=1.0,
                  base_lr=2e-3, train_steps=625, warmup_steps=0, start_warmup_step=0, beta1=0.9, beta2=0.999,
                  weight_decay=0.01,
                  model=bert_model.BertConfig(hidden=128, layers=2, heads=4, intermediate=512, dropout=0.0,
                                              vocab_size=4096),
                  max_seq_length=bert_data.MINI.max_seq_length, max_predictions=bert_data.MINI.max_predictions,
                  eval_batch_size=250,
                  cache_shards=True, checkpoint="shipped")
