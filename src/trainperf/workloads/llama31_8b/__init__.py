"""Llama 3.1 8B pretraining on C4 (MLPerf key `llama31_8b`, "small LLM pretraining", rounds 5.1-6.1), on FSDP2
with tensor parallelism where asked; its mini scale is a 2-layer Llama on a generated Markov corpus in the
same `.bin`/`.idx` format."""

from __future__ import annotations

from trainperf.contract import DeviceProbe, MLPerf, Scale, StepBudget
from trainperf.workloads.common.llm import data as llama_data
from trainperf.workloads.common.llm import synthetic
from trainperf.workloads.common.llm.recipe import EVAL_SAMPLES, LlamaRecipe
from trainperf.workloads.common.llm.workload import DecoderWorkload, lr_factor
from trainperf.workloads.llama31_8b.recipes import FULL_RECIPES, MINI

__all__ = ["Llama31Workload", "LlamaRecipe", "lr_factor"]


class Llama31Workload(DecoderWorkload[LlamaRecipe]):
    name = "llama31_8b"
    benchmark = "llama31_8b"
    mlperf = MLPerf(ruleset="6.1.0", runs=10, full_eval_samples=EVAL_SAMPLES)
    summary = "Llama 3.1 8B pretraining on C4, log perplexity (mini: a 2-layer Llama on a Markov corpus)"
    # The full shape at a CPU's size: 2 blocks, narrower, a smaller vocabulary, 256 tokens (the same operators).
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=512", "model.ffn_dim=1792",
                  "model.vocab_size=4096")
    # 638: no sync (the causal mask is SDPA's, the loss a plain mean)
    step_budget = StepBudget(ops=700)
    # 8 B parameters with Adam's state outgrow one GPU: four of its 32 blocks at the full width and sequence.
    device_probe = DeviceProbe(batch=1, sets=("model.layers=4",))
    real_layout = ("c4-train.en_6_text_document.bin", "c4-train.en_6_text_document.idx")
    mini = Scale(MINI, synthetic.MarkovCorpus())
    full = Scale(FULL_RECIPES, llama_data.C4())


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = Llama31Workload
