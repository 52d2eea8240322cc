"""DeepSeek-V3 671B mixture-of-experts pretraining on C4 (MLPerf key `deepseekv3_671b`, "LLM MoE
pretraining", rounds 6.0-6.1): GPT-OSS-20B's code (workloads/gpt_oss_20b) with DeepSeek-V3's shape (latent
attention, 256 routed and 1 shared experts, top-8 of the best 4 of 8 groups, sigmoid routing balanced by
correction biases and a sequence-wise loss, one multi-token prediction layer) and its recipes.

Full scale only. The reference continues training from a checkpoint that MLCommons gives its members only (a
DeepSeek-V3 re-warmed for 50 steps with the Llama 3.1 tokenizer, in Hugging Face format, converted to
Megatron's): trainperf has no reader for it, so a full run starts from random weights and cannot reach the
target in the reference's ~47 steps; `bench`, `plan` and the closed-rules log are what it is for today."""

from __future__ import annotations

from trainperf.spec import MLPerf, Scale
from trainperf.workloads.gpt_oss_20b import GptOssWorkload
from trainperf.workloads.gpt_oss_20b.recipes import DEEPSEEK_RECIPES
from trainperf.workloads.llama31_8b import data as llama_data
from trainperf.workloads.llama31_8b import synthetic

__all__ = ["DeepSeekV3Workload"]


class DeepSeekV3Workload(GptOssWorkload):
    name = "deepseekv3_671b"
    benchmark = "deepseekv3_671b"
    mlperf = MLPerf(ruleset="6.0.0", runs=3, full_eval_samples=1_024)
    summary = ("DeepSeek-V3 671B mixture-of-experts pretraining on C4, log perplexity (full scale only: see "
               "gpt_oss_20b's mini)")
    # The full step's operators at a CPU's size: 2 blocks (one dense, one MoE of 16 experts in 4 groups, a
    # shared expert), latent attention of narrow ranks, multi-token prediction, 256 tokens, one process.
    step_probe = ("global_batch_size=1", "grad_accum_steps=1", "seq_len=256", "model.layers=2", "model.dim=256",
                  "model.heads=4", "model.q_rank=64", "model.kv_rank=32", "model.nope_dim=32", "model.rope_dim=16",
                  "model.v_dim=32", "model.dense_layers=1", "model.ffn_dim=512", "model.experts=16",
                  "model.groups=4", "model.topk_groups=2", "model.top_k=4", "model.expert_dim=128",
                  "model.vocab_size=4096", "ep=1", "checkpointing=none", "meta_init=false")
    mini = None
    golden = None  # no mini: nothing of its own to record (its code path's mini is another workload's)
    full = Scale(DEEPSEEK_RECIPES, llama_data.C4(synthetic.MINI_CORPUS, llama_data.LLAMA31_VOCAB,
                                                 "llm_moe_pretraining/nemo preprocessing (the llama31_8b download): "
                                                 "C4 en tokenized with Llama 3.1's tokenizer"))


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = DeepSeekV3Workload
