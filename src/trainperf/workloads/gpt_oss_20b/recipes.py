"""The MoE pretraining recipes: GPT-OSS-20B's RCP points (`rcps_gpt_oss_20b.json`, ruleset 6.0.0) and its
mini; DeepSeek-V3's (`rcps_deepseekv3_671b.json`: its closed rules derive the learning rate from the batch).

GPT-OSS trains as llama31_8b does (the reference's Primus/Megatron configuration, read at mlcommons/training
aa344c7f): C4 tokenized with Llama 3.1's tokenizer, 8,192-token sequences, AdamW 0.9/0.95, eps 1e-5, weight
decay 0.1, clipping 1.0, a linear warmup then a cosine to a tenth of the peak over 1,200,000 steps, 1,024
evaluation sequences every 12,288 samples from the first 12,288; dropless routing, no balancing loss
(`moe_router_load_balancing_type: none`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainperf.errors import TrainperfError
from trainperf.spec import Recipe
from trainperf.spec.fields import Count
from trainperf.spec.parallel import CHECKPOINTING
from trainperf.workloads.gpt_oss_20b.model import ATTENTIONS, GPT_OSS_20B, MLPERF_DEEPSEEK_V3, MoEModelConfig
from trainperf.workloads.llama31_8b.recipes import BUDGET_SAMPLES, EVAL_EVERY_SAMPLES, LlamaRecipe


@dataclass(frozen=True)
class MoERecipe(LlamaRecipe):
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"checkpointing": CHECKPOINTING}
    model: MoEModelConfig = field(default_factory=lambda: GPT_OSS_20B)  # type: ignore[assignment]
    # Expert parallelism: the processes each layer's experts are split over (adjacent ranks, a divisor of
    # the data-parallel processes; the rest of the model fully sharded over all of them).
    ep: Count = 1

    def validate(self) -> None:
        Recipe.validate(self)
        m = self.model
        m.moe.check("model")
        if m.attention not in ATTENTIONS:
            raise TrainperfError(f"recipe field model.attention={m.attention!r}: expected one of "
                                 + ", ".join(ATTENTIONS))
        if m.attention == "grouped" and m.heads % m.kv_heads:
            raise TrainperfError(f"recipe field model.kv_heads={m.kv_heads}: must divide heads={m.heads}")
        if m.rotary_dim % 2:
            raise TrainperfError(f"recipe field model: rotary dimension {m.rotary_dim} must be even (rotary pairs)")
        if m.dense_layers and not m.ffn_dim:
            raise TrainperfError(f"recipe field model.dense_layers={m.dense_layers}: needs model.ffn_dim")
        if self.tp != 1:
            raise TrainperfError(f"recipe field tp={self.tp}: tensor parallelism of the MoE models is not built "
                                 "(the reference trains GPT-OSS with TP 1 and EP 8); use ep")
        if m.experts % self.ep:
            raise TrainperfError(f"recipe field ep={self.ep}: must divide model.experts={m.experts}")
        if self.warmup_steps >= self.max_steps:
            raise TrainperfError(f"recipe fields warmup_steps={self.warmup_steps} and max_steps={self.max_steps}: "
                                 "the warmup must end before the schedule does")


def _rcp(gbs: int, lr: float, warmup_samples: int, accum: int) -> MoERecipe:
    """One RCP point of GPT-OSS-20B: its batch, learning rate, warmup (in samples) and accumulation; expert
    parallelism over 8 processes as the reference (one 8-GPU node)."""
    return MoERecipe(name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=accum, max_epochs=0, target=3.34,
                     eval_every=1, eval_first=1, eval_every_samples=EVAL_EVERY_SAMPLES, log_epoch_num="samples",
                     max_samples=BUDGET_SAMPLES, max_grad_norm=1.0, base_lr=lr,
                     warmup_steps=math.ceil(warmup_samples / gbs), precision="bf16", fused_optimizer=True, ep=8)


FULL_RECIPES = {r.name: r for r in (_rcp(16, 4e-4, 2_048, 1), _rcp(32, 8e-4, 4_096, 2), _rcp(64, 1e-3, 12_288, 4))}

# The mini: a 2-block MoE (8 experts of 128, top 2; the first block's sliding window the reference's 128 keys)
# on llama31_8b's generated Markov corpus, at the reference's 8,192 tokens a sequence (the open rules of
# gpt_oss_20b, the division a mini logs, check max_sequence_length == 8192).
MINI_MODEL = MoEModelConfig(layers=2, dim=128, vocab_size=64, heads=2, kv_heads=1, head_dim=32, window=128,
                            experts=8, top_k=2, expert_dim=128, init_std=0.02)
# Two sequences of 8,192 tokens a step (a step's cost is the full-attention block's 8,192^2 scores; two, so that
# two processes split a batch); 8 validation sequences (65,536 tokens) every 8 steps.
MINI = MoERecipe(
    name="mini", global_batch_size=2, max_epochs=0, target=1.0, eval_every=1, eval_first=1,
    eval_every_samples=16, log_epoch_num="samples", max_samples=480, max_grad_norm=1.0,
    model=MINI_MODEL, seq_len=8_192, base_lr=4e-3, warmup_steps=8, max_steps=400, eval_samples=8,
    eval_batch_size=1, num_workers=0)


DEEPSEEK_SEQ_LEN = 4_096
DEEPSEEK_MAX_STEPS = 12_000
DEEPSEEK_END_LR = 1e-8


def _deepseek(gbs: int) -> MoERecipe:
    """DeepSeek-V3's closed rules (6.0.0) and reference (mlcommons/training llm_moe_pretraining/nemo at
    aa344c7f): 4,096-token sequences, batch >= 15,360 in micro-batches of 64 per step of accumulation (the
    reference's GBS / 240 at 15,360), LR 2.4e-5 x sqrt(GBS / 16,384) to 1e-8, 4 warmup steps, the cosine over
    12,000 steps, eps 1e-8; 1,024 evaluation sequences after every step, as the v6.0 reference evaluates
    (it continues from a checkpoint: about 47 steps reach the target); a budget of 100 steps (NVIDIA's v6.0
    max_steps). Expert parallelism over 64 processes with full recomputation; the reference adds pipeline
    parallelism of 4 (256 GPUs), which trainperf has not built."""
    base_lr = round(2.4e-5 * math.sqrt(gbs / 16_384), 9)
    return MoERecipe(
        name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=gbs // 64, max_epochs=0, target=3.6,
        eval_every=1, eval_first=1, eval_every_samples=gbs, log_epoch_num="samples", max_samples=100 * gbs,
        max_grad_norm=1.0, model=MLPERF_DEEPSEEK_V3, seq_len=DEEPSEEK_SEQ_LEN, base_lr=base_lr,
        end_lr_fraction=DEEPSEEK_END_LR / base_lr, warmup_steps=4, max_steps=DEEPSEEK_MAX_STEPS, eps=1e-8,
        precision="bf16", fused_optimizer=True, ep=64, checkpointing="full", meta_init=True)


DEEPSEEK_RECIPES = {r.name: r for r in (_deepseek(15_360), _deepseek(16_384), _deepseek(18_432))}
