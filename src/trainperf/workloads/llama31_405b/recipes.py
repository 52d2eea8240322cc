"""Llama 3.1 405B's model as MLPerf trains it and its recipes (its closed rules derive the learning rate, warmup
and decay from the batch)."""

from __future__ import annotations

import math

from trainperf.workloads.common.llm.model import LlamaConfig
from trainperf.workloads.common.llm.recipe import LlamaRecipe

LLAMA31_405B = LlamaConfig(layers=126, dim=16_384, heads=128, kv_heads=8, ffn_dim=53_248)
# MLPerf's 405B: Meta's shape with the Mixtral 8x22B tokenizer's vocabulary, which NeMo pads to a multiple of
# 128 x TP (1,024 at TP 8): 32,768 (the reference's README rounds it to 32,000).
MLPERF_405B = LlamaConfig(layers=126, dim=16_384, heads=128, kv_heads=8, ffn_dim=53_248, vocab_size=32_768)

END_LR_405B = 8e-7
# The benchmark continues from Meta's Llama 3.1 405B (the reference's README, `--use_ckpt --resume_from_hf`): its
# Hugging Face folder beside the data (`--data DIR` holds DIR/checkpoint/), its first 32,768 embedding and output
# rows read for the Mixtral tokenizer, as the reference's Megatron loads them.
INITIAL_CHECKPOINT = "checkpoint"


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
        eval_samples=5_760, precision="bf16", fused_optimizer=True, tp=8, checkpointing="full", meta_init=True,
        initial_checkpoint=INITIAL_CHECKPOINT, eval_whole_batches=True,
        # The reference's validation set in file order: its mcore.patch turns Megatron-Core's validation shuffles off.
        eval_dataset="nemo_405b", eval_shuffle=False)


FULL_405B = {r.name: r for r in (_405b(1152), _405b(2304), _405b(4608))}
