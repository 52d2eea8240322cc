"""Llama 2 70B LoRA's recipes: the RCP points of MLPerf's `rcps_llama2_70b_lora.json` (the same in rulesets
4.0.0-6.1.0) and the mini's. The reference (mlcommons/training `llama2_70b_lora`, `run_and_time.sh`):
AdamW as Hugging Face's Trainer builds it (β 0.9 / 0.999, ε 1e-8), weight decay 1e-4, clipping at 0.3, a
cosine from the base LR to 0 over `max_steps` 1,024 with no warmup, sequences of 8,192, LoRA rank 16, alpha
32, dropout 0.1; an evaluation every 384 samples from the (⌊0.125 GBS + 2⌋ + 1)-th on (the training rules:
the first ⌊0.125 GBS + 2⌋ are skipped; 1,536 samples at GBS 8), of the 173 validation samples."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from trainperf.contract.fields import Count, Fraction, Positive
from trainperf.workloads.common.llm.model import LlamaConfig
from trainperf.workloads.common.llm.recipe import LlamaRecipe
from trainperf.workloads.llama2_70b_lora.model import LLAMA2_70B
from trainperf.workloads.llama2_70b_lora.synthetic import BASE_CONFIG, SEQ_LEN, VALID_ROWS

EVAL_EVERY_SAMPLES = 384
EVAL_SAMPLES = 173
MAX_STEPS = 1_024


def first_eval_samples(gbs: int) -> int:
    """The first evaluation the rules take: after ⌊0.125 GBS + 2⌋ skipped ones, each every 384 samples rounded
    up to whole steps."""
    every = math.ceil(EVAL_EVERY_SAMPLES / gbs) * gbs
    return (math.floor(0.125 * gbs + 2) + 1) * every


@dataclass(frozen=True)
class LoraRecipe(LlamaRecipe):
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ()
    model: LlamaConfig = field(default_factory=lambda: LLAMA2_70B)
    base_lr: Positive = 4e-4
    end_lr_fraction: Fraction = 0.0
    warmup_steps: int = 0
    max_steps: Count = MAX_STEPS
    beta1: Fraction = 0.9
    beta2: Fraction = 0.999
    eps: Positive = 1e-8
    weight_decay: float = 1e-4
    eval_samples: Count = EVAL_SAMPLES
    eval_batch_size: Count = 1
    num_workers: int = 0
    lora_rank: Count = 16
    lora_alpha: Positive = 32.0
    lora_dropout: Fraction = 0.1


def _rcp(gbs: int, lr: float) -> LoraRecipe:
    return LoraRecipe(name=f"gbs{gbs}", global_batch_size=gbs, max_epochs=0, target=0.925, eval_every=1,
                      eval_first=1, eval_every_samples=math.ceil(EVAL_EVERY_SAMPLES / gbs) * gbs,
                      eval_first_samples=first_eval_samples(gbs), log_epoch_num="samples",
                      max_samples=MAX_STEPS * gbs, max_grad_norm=0.3, base_lr=lr, precision="bf16",
                      fused_optimizer=True, checkpointing="full", meta_init=True)


FULL_RECIPES = {r.name: r for r in (_rcp(8, 4e-4), _rcp(16, 4e-4), _rcp(32, 4e-4), _rcp(128, 1e-3))}

# The mini: the shipped 2-block base (synthetic.py) with the reference's adapters (rank 16, alpha 32, dropout
# 0.1) on 128-token rows, the reference's cadence (GBS 8: the first evaluation at 1,536 samples, then every
# 384) and schedule shape.
MINI = LoraRecipe(
    name="mini", global_batch_size=8, max_epochs=0, target=0.45, eval_every=1, eval_first=1,
    eval_every_samples=EVAL_EVERY_SAMPLES, eval_first_samples=first_eval_samples(8), log_epoch_num="samples",
    max_samples=6_144, max_grad_norm=0.3, model=BASE_CONFIG, seq_len=SEQ_LEN, base_lr=5e-3, max_steps=768,
    eval_samples=VALID_ROWS, eval_batch_size=16, meta_init=True)
