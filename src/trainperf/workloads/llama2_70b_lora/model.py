"""Llama 2 70B on the shared Llama (workloads/common/llm/model.py): its shape, as the reference's
config.json gives it (mlcommons/training `llama2_70b_lora`): no rotary scaling, θ 10,000."""

from __future__ import annotations

from trainperf.workloads.common.llm.model import LlamaConfig

LLAMA2_70B = LlamaConfig(layers=80, dim=8192, heads=64, kv_heads=8, ffn_dim=28_672, vocab_size=32_000,
                         rope_theta=10_000.0, rope_factor=0.0, rope_original_context=4096)
