"""Llama 3.1 8B's recipes: the RCP points of MLPerf's `rcps_llama31_8b.json` (rulesets 5.1.0-6.1.0) and the
mini's."""

from __future__ import annotations

import math

from trainperf.workloads.common.llm.model import LlamaConfig
from trainperf.workloads.common.llm.recipe import BUDGET_SAMPLES, EVAL_EVERY_SAMPLES, LlamaRecipe


def _rcp(gbs: int, lr: float, warmup_samples: int, accum: int) -> LlamaRecipe:
    """One RCP point: its batch, learning rate, warmup (in samples in the RCP file) and accumulation."""
    return LlamaRecipe(name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=accum, max_epochs=0, target=3.3,
                       eval_every=1, eval_first=1, eval_every_samples=EVAL_EVERY_SAMPLES, log_epoch_num="samples",
                       max_samples=BUDGET_SAMPLES,
                       max_grad_norm=1.0, base_lr=lr, warmup_steps=math.ceil(warmup_samples / gbs),
                       precision="bf16", fused_optimizer=True, eval_whole_batches=True,
                       eval_dataset="nemo_8b")


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
    eval_dataset="nemo_8b", num_workers=0)
