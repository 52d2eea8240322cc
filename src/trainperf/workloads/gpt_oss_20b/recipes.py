"""The MoE pretraining recipes: GPT-OSS-20B's RCP points (`rcps_gpt_oss_20b.json`, ruleset 6.0.0) and its
mini.

GPT-OSS trains as llama31_8b does (the reference's Primus/Megatron configuration, read at mlcommons/training
aa344c7f): C4 tokenized with Llama 3.1's tokenizer, 8,192-token sequences, AdamW 0.9/0.95, eps 1e-5, weight
decay 0.1, clipping 1.0, a linear warmup then a cosine to a tenth of the peak over 1,200,000 steps, 1,024
evaluation sequences every 12,288 samples from the first 12,288; dropless routing, no balancing loss
(`moe_router_load_balancing_type: none`)."""

from __future__ import annotations

import math

from trainperf.workloads.common.llm.moe_model import MoEModelConfig
from trainperf.workloads.common.llm.recipe import BUDGET_SAMPLES, EVAL_EVERY_SAMPLES, MoERecipe


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
