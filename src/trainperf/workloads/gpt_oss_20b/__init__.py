"""GPT-OSS-20B mixture-of-experts pretraining on C4 (MLPerf key `gpt_oss_20b`, "small LLM MoE pretraining",
rounds 6.0-6.1): the Llama family's data, evaluation, schedule and FSDP2 plumbing (workloads/common/llm) with
the MoE decoder of workloads/common/llm/moe_model.py, its experts split over processes by expert parallelism.
Its mini is a 2-block MoE on llama31_8b's generated Markov corpus."""

from __future__ import annotations

from trainperf.contract import DeviceProbe, MLPerf, Scale, StepBudget
from trainperf.workloads.common.llm import data as llama_data
from trainperf.workloads.common.llm import synthetic
from trainperf.workloads.common.llm.recipe import MoERecipe
from trainperf.workloads.common.llm.workload import MoEWorkload, expert_parallel_probes
from trainperf.workloads.gpt_oss_20b.recipes import FULL_RECIPES, MINI

__all__ = ["GptOssWorkload", "MoERecipe"]


class GptOssWorkload(MoEWorkload):
    name = "gpt_oss_20b"
    benchmark = "gpt_oss_20b"
    mlperf = MLPerf(ruleset="6.1.0", runs=10, full_eval_samples=1_024)
    summary = ("GPT-OSS-20B mixture-of-experts pretraining on C4, log perplexity (mini: a 2-block MoE of 8 "
               "experts on a Markov corpus)")
    # The full step's operators at a CPU's size: 2 blocks (one windowed), 8 narrow experts, 256 tokens.
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=256", "model.heads=8",
                  "model.kv_heads=2", "model.head_dim=32", "model.experts=8", "model.expert_dim=256",
                  "model.vocab_size=4096", "ep=1")
    # 921: 2 blocks (one windowed) of 8 experts, dropless routing sorted and counted on the device, one process
    step_budget = StepBudget(ops=1_010,
                             also=expert_parallel_probes(2))
    # GPT-OSS-20B's 24 blocks need 328 GB of fp32 state: 2 of them at full width, one process (ep=1), one
    # sequence of 8,192 (`plan`: about 56 GiB before the margin).
    device_probe = DeviceProbe(batch=1, sets=("model.layers=2", "ep=1"))
    real_layout = ("c4-train.en_6_text_document.bin", "c4-validation-91205-samples.en_text_document.idx")
    # llama31_8b's corpus with validation text for 16 sequences of 8,192 + 1 tokens.
    corpus = synthetic.Corpus(valid_tokens=160_000)
    mini = Scale(MINI, synthetic.MarkovCorpus(corpus))
    full = Scale(FULL_RECIPES, llama_data.C4(synthetic.MINI_CORPUS, llama_data.LLAMA31_VOCAB,
                                             "small_llm_moe_pretraining preprocessing (the llama31_8b download): "
                                             "C4 en tokenized with Llama 3.1's tokenizer"))


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = GptOssWorkload
