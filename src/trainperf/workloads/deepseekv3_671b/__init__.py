"""DeepSeek-V3 671B mixture-of-experts pretraining on C4 (MLPerf key `deepseekv3_671b`, "LLM MoE
pretraining", rounds 6.0-6.1): GPT-OSS-20B's code (workloads/common/llm) with DeepSeek-V3's shape (latent
attention, 256 routed and 1 shared experts, top-8 of the best 4 of 8 groups, sigmoid routing balanced by
correction biases and a sequence-wise loss, one multi-token prediction layer) and its recipes.

Full scale only. The reference continues training from a checkpoint that MLCommons gives its members only (a
DeepSeek-V3 re-warmed for 50 steps with the Llama 3.1 tokenizer, in Hugging Face format); the full recipes read
it from `--data DIR`'s `checkpoint/` folder (common/llm/hf_deepseek.py), each process its shards and experts."""

from __future__ import annotations

from trainperf.contract import MLPerf, Scale, StepBudget
from trainperf.workloads.common.llm import data as llama_data
from trainperf.workloads.common.llm import synthetic
from trainperf.workloads.common.llm.workload import MoEWorkload, expert_parallel_probes
from trainperf.workloads.deepseekv3_671b.recipes import DEEPSEEK_RECIPES

__all__ = ["DeepSeekV3Workload"]


class DeepSeekV3Workload(MoEWorkload):
    name = "deepseekv3_671b"
    benchmark = "deepseekv3_671b"
    mlperf = MLPerf(ruleset="6.1.0", runs=3, full_eval_samples=1_024)
    summary = ("DeepSeek-V3 671B mixture-of-experts pretraining on C4, log perplexity (full scale only: see "
               "gpt_oss_20b's mini)")
    # The full step's operators at a CPU's size: 2 blocks (one dense, one MoE of 16 experts in 4 groups, a
    # shared expert), latent attention of narrow ranks, multi-token prediction, 256 tokens, one process.
    step_probe = ("global_batch_size=1", "grad_accum_steps=1", "seq_len=256", "model.layers=2", "model.dim=256",
                  "model.heads=4", "model.q_rank=64", "model.kv_rank=32", "model.nope_dim=32", "model.rope_dim=16",
                  "model.v_dim=32", "model.dense_layers=1", "model.ffn_dim=512", "model.experts=16",
                  "model.groups=4", "model.topk_groups=2", "model.top_k=4", "model.expert_dim=128",
                  "model.vocab_size=4096", "ep=1", "checkpointing=none", "meta_init=false")
    # 1,738: a dense and an MoE block of latent attention, grouped sigmoid routing, a shared expert, the
    # sequence-wise balancing loss, multi-token prediction, the correction biases' update after the step
    step_budget = StepBudget(ops=1_900,
                             also=expert_parallel_probes(2))
    mini = None
    golden = None  # no mini: nothing of its own to record (its code path's mini is another workload's)
    full = Scale(DEEPSEEK_RECIPES, llama_data.C4(synthetic.MINI_CORPUS, llama_data.LLAMA31_VOCAB,
                                                 "llm_moe_pretraining/nemo preprocessing (the llama31_8b download): "
                                                 "C4 en tokenized with Llama 3.1's tokenizer"))


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = DeepSeekV3Workload
