"""DeepSeek-V3's model as published and as MLPerf trains it, and its recipes (`rcps_deepseekv3_671b.json`: its
closed rules derive the learning rate from the batch)."""

from __future__ import annotations

import dataclasses
import math

from trainperf.workloads.common.llm.moe_model import MoEModelConfig
from trainperf.workloads.common.llm.recipe import MoERecipe

# DeepSeek-V3 as published (deepseek-ai/DeepSeek-V3 config_671B.json): 671,026,404,352 parameters without
# its multi-token prediction module (11.6 B more: Hugging Face's 685 B), 36.6 B active.
DEEPSEEK_V3 = MoEModelConfig(
    layers=61, dim=7_168, vocab_size=129_280, attention="latent", heads=128, kv_heads=128, head_dim=192,
    qk_norm=False, q_rank=1_536, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128, rope_theta=10_000.0,
    yarn_factor=40.0, yarn_original_context=4_096, yarn_beta_fast=32.0, yarn_beta_slow=1.0, yarn_mscale=1.0,
    yarn_mscale_all_dim=1.0, dense_layers=3, ffn_dim=18_432, experts=256, top_k=8, expert_dim=2_048,
    shared_experts=1, scoring="sigmoid", groups=8, topk_groups=4, routed_scale=2.5, balance="sequence",
    aux_loss_coeff=0.01, bias_update_rate=1e-3, norm_eps=1e-6, init_std=0.006, mtp_layers=1)
# MLPerf's (mlcommons/training llm_moe_pretraining/nemo on Megatron-Bridge 0.3.0): the same model, continued
# from a checkpoint re-warmed for 50 steps with the Llama 3.1 tokenizer, one multi-token prediction layer at loss
# weight 0.1, the sequence-wise balancing loss at 0.01, bias updates at 1e-3. Its embedding and output keep
# DeepSeek-V3's 129,280 rows, of which the tokenizer's 128,256 are used: the recipe takes the vocabulary from
# deepseek-ai/DeepSeek-V3's config (Megatron-Bridge v0.3.0 recipes/deepseek/deepseek_v3.py) and
# `_validate_and_set_vocab_size` (training/setup.py) keeps a model vocabulary larger than the tokenizer's.
MLPERF_DEEPSEEK_V3 = dataclasses.replace(DEEPSEEK_V3)


DEEPSEEK_SEQ_LEN = 4_096
DEEPSEEK_MAX_STEPS = 12_000
DEEPSEEK_END_LR = 1e-8
# The reference continues from MLCommons' DeepSeek-V3 re-warmed for the Llama 3.1 tokenizer: its Hugging Face
# folder beside the data (`--data DIR` holds DIR/checkpoint/), read by common/llm/hf_deepseek.py.
INITIAL_CHECKPOINT = "checkpoint"


def _deepseek(gbs: int) -> MoERecipe:
    """DeepSeek-V3's closed rules (6.0.0) and reference (mlcommons/training llm_moe_pretraining/nemo at
    aa344c7f): 4,096-token sequences, batch >= 15,360 in micro-batches of 64 per step of accumulation (the
    reference's GBS / 240 at 15,360), LR 2.4e-5 x sqrt(GBS / 16,384) to 1e-8, 4 warmup steps, the cosine over
    12,000 steps, eps 1e-8; 1,024 evaluation sequences after every step from step floor(42 + 24,576 / GBS) on
    (the reference's START_EVAL_AT_ITER, which ruleset 6.1.0 checks: it continues from a checkpoint and about
    47 steps reach the target); a budget of 100 steps (NVIDIA's v6.0
    max_steps). Expert parallelism over 64 processes with full recomputation; the reference adds pipeline
    parallelism of 4 (256 GPUs), which trainperf has not built."""
    base_lr = round(2.4e-5 * math.sqrt(gbs / 16_384), 9)
    return MoERecipe(
        name=f"gbs{gbs}", global_batch_size=gbs, grad_accum_steps=gbs // 64, max_epochs=0, target=3.6,
        eval_every=1, eval_first=1, eval_every_samples=gbs, log_epoch_num="samples", max_samples=100 * gbs,
        eval_first_samples=gbs * math.floor(42 + 24_576 / gbs),
        max_grad_norm=1.0, model=MLPERF_DEEPSEEK_V3, seq_len=DEEPSEEK_SEQ_LEN, base_lr=base_lr,
        end_lr_fraction=DEEPSEEK_END_LR / base_lr, warmup_steps=4, max_steps=DEEPSEEK_MAX_STEPS, eps=1e-8,
        precision="bf16", fused_optimizer=True, ep=64, checkpointing="full", meta_init=True,
        initial_checkpoint=INITIAL_CHECKPOINT,
        # Megatron-Bridge's loaders.py asks Megatron-Core for train_iters x GBS training samples (its 100-step
        # budget) and (train_iters // eval_interval + 1) x eval_iters x GBS validation ones (101 x GBS).
        train_dataset="budget", eval_dataset="bridge")


DEEPSEEK_RECIPES = {r.name: r for r in (_deepseek(15_360), _deepseek(16_384), _deepseek(18_432))}
