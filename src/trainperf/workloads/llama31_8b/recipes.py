"""Llama 3.1 8B's recipes: the RCP points of MLPerf's `rcps_llama31_8b.json` (rulesets 5.1.0-6.1.0) and the
mini's; and the 405B's (its closed rules derive the learning rate, warmup and decay from the batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainperf.errors import TrainperfError
from trainperf.spec import Recipe
from trainperf.spec.fields import Count, Fraction, Positive, Share
from trainperf.spec.parallel import CHECKPOINTING
from trainperf.workloads.llama31_8b.model import LLAMA31_8B, MLPERF_405B, LlamaConfig

MAX_STEPS = 1_200_000  # the rules' fixed schedule length (opt_learning_rate_decay_steps = it - warmup)
EVAL_EVERY_SAMPLES = 12_288
EVAL_SAMPLES = 1_024
SEQ_LEN = 8_192
# A run's budget: 40 evaluations, 1.5x the slowest RCP run's samples to converge (319,488 at GBS 128).
BUDGET_SAMPLES = 40 * EVAL_EVERY_SAMPLES


@dataclass(frozen=True)
class LlamaRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"checkpointing": CHECKPOINTING}
    model: LlamaConfig = field(default_factory=lambda: LLAMA31_8B)
    seq_len: Count = SEQ_LEN
    base_lr: Positive = 4e-4
    end_lr_fraction: Fraction = 0.1  # the cosine decays to this share of base_lr (opt_end_learning_rate)
    warmup_steps: int = 16
    max_steps: Count = MAX_STEPS  # the cosine's length: warmup + decay
    beta1: Fraction = 0.9
    beta2: Share = 0.95
    eps: Positive = 1e-5
    weight_decay: float = 0.1
    eval_samples: Count = EVAL_SAMPLES
    eval_batch_size: Count = 8
    num_workers: int = 2  # DataLoader processes cutting samples from the memory-mapped corpus
    # Parallelism (spec/parallel.py FullyShard): tensor-parallel processes per block, activation
    # checkpointing of the blocks.
    tp: Count = 1
    checkpointing: str = "none"
    # Build the model on the meta device and initialise each process's shard after sharding (the 405B's
    # 1.6 TB of fp32 weights fit no device whole). Off: built whole on the device, then sharded.
    meta_init: bool = False

    def validate(self) -> None:
        super().validate()
        if self.model.dim % self.model.heads or self.model.heads % self.model.kv_heads:
            raise TrainperfError(f"recipe field model: dim {self.model.dim}, heads {self.model.heads} and kv_heads "
                                 f"{self.model.kv_heads}: heads must divide dim and kv_heads divide heads")
        if self.model.head_dim % 2:
            raise TrainperfError(f"recipe field model: head dimension {self.model.head_dim} must be even "
                                 "(rotary pairs)")
        split = {"model.heads": self.model.heads, "model.kv_heads": self.model.kv_heads,
                 "model.ffn_dim": self.model.ffn_dim, "seq_len": self.seq_len}
        uneven = [f"{name}={value}" for name, value in split.items() if value % self.tp]
        if uneven:
            raise TrainperfError(f"recipe field tp={self.tp}: tensor parallelism splits the heads, key/value heads, "
                                 f"feed-forward and sequence evenly; not " + ", ".join(uneven))
        if self.warmup_steps >= self.max_steps:
            raise TrainperfError(f"recipe fields warmup_steps={self.warmup_steps} and max_steps={self.max_steps}: "
                                 "the warmup must end before the schedule does")

    @property
    def end_lr(self) -> float:
        return self.base_lr * self.end_lr_fraction


def _rcp(gbs: int, lr: float, warmup_samples: int, accum: int) -> LlamaRecipe:
    """One RCP point: its batch, learning rate, warmup (in samples in the RCP file) and accumulation."""
    return LlamaRecipe(name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=accum, max_epochs=0, target=3.3,
                       eval_every=1, eval_first=1, eval_every_samples=EVAL_EVERY_SAMPLES, log_epoch_num="samples",
                       max_samples=BUDGET_SAMPLES,
                       max_grad_norm=1.0, base_lr=lr, warmup_steps=math.ceil(warmup_samples / gbs),
                       precision="bf16", fused_optimizer=True)


FULL_RECIPES = {r.name: r for r in (
    _rcp(16, 4e-4, 256, 1), _rcp(32, 8e-4, 4_096, 1), _rcp(64, 8e-4, 6_144, 2), _rcp(96, 1e-3, 16_348, 6),
    _rcp(128, 2e-3, 32_768, 4),
)}

# The mini: a 2-layer, 128-wide Llama (GQA 4:2) on 256-token sequences of the generated Markov corpus.
MINI = LlamaRecipe(
    name="mini", global_batch_size=16, max_epochs=0, target=0.9, eval_every=1, eval_first=1,
    eval_every_samples=1_024, log_epoch_num="samples", max_samples=24_576, max_grad_norm=1.0,
    model=LlamaConfig(layers=2, dim=128, heads=4, kv_heads=2, ffn_dim=384, vocab_size=64,
                      rope_original_context=256),
    seq_len=256, base_lr=3e-3, warmup_steps=16, max_steps=1_600, eval_samples=128, eval_batch_size=32,
    num_workers=0)


END_LR_405B = 8e-7


def _405b(gbs: int) -> LlamaRecipe:
    """The 405B's closed rules (5.0.0-6.0.0) and reference (large_language_model_pretraining/nemo,
    pretrain_llama31.py): LR 8e-5 x GBS / 1152 decaying to 8e-7, warmup ceil(8000 x 1152 / GBS) steps, the
    cosine over ceil(1.2M x 1152 / GBS) steps, evaluation of 5,760 sequences every 18,432 samples from
    18,432 x floor(0.0026 x GBS + 12) samples on (258,048 at GBS 1,152)."""
    warmup = math.ceil(8000 * 1152 / gbs)
    first = math.floor(0.0026 * gbs + 12)
    base_lr = round(8e-5 * gbs / 1152, 8)
    return LlamaRecipe(
        name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=max(1, gbs // 8), max_epochs=0, target=5.6,
        eval_every=1, eval_first=1, eval_every_samples=18_432, eval_first_samples=first * 18_432,
        log_epoch_num="samples", max_samples=(first + 40) * 18_432, max_grad_norm=1.0, model=MLPERF_405B,
        base_lr=base_lr, end_lr_fraction=END_LR_405B / base_lr, warmup_steps=warmup,
        max_steps=math.ceil(1_200_000 * 1152 / gbs),
        eval_samples=5_760, precision="bf16", fused_optimizer=True, tp=8, checkpointing="full", meta_init=True)


FULL_405B = {r.name: r for r in (_405b(1152), _405b(2304), _405b(4608))}
