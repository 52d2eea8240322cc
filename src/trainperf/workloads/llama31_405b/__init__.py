"""Llama 3.1 405B pretraining on C4 (MLPerf key `llama31_405b`, "LLM pretraining", rounds 5.0-6.0): the same
model, data and parallelism code as `llama31_8b` (workloads/common/llm) with the 405B shape, its recipes and
rules. Full scale only: its rules (5,760 evaluation sequences of 8,192 tokens, in the open division too) leave
no room for a mini that a CPU trains, so `llama31_8b`'s mini is the proof of this code path."""

from __future__ import annotations

from trainperf.contract import MLPerf, Scale, StepBudget
from trainperf.workloads.common.llm import data as llama_data
from trainperf.workloads.common.llm.recipe import LlamaRecipe
from trainperf.workloads.common.llm.synthetic import Corpus
from trainperf.workloads.common.llm.workload import DecoderWorkload
from trainperf.workloads.llama31_405b.recipes import FULL_405B, MLPERF_405B

# The reference trains on two merged files (C4 train shards 768-895 and 896-1023) in equal shares.
CORPUS = Corpus(more_train=("c4-train.en_7_text_document",))

__all__ = ["Llama31_405bWorkload"]


class Llama31_405bWorkload(DecoderWorkload[LlamaRecipe]):
    name = "llama31_405b"
    benchmark = "llama31_405b"
    mlperf = MLPerf(ruleset="6.0.0", runs=3, full_eval_samples=5_760)
    summary = "Llama 3.1 405B pretraining on C4, log perplexity (full scale only: see llama31_8b's mini)"
    # The full step's operators at a CPU's size (2 narrow blocks, recomputed in the backward as the recipe
    # asks; one process, so no tensor parallelism).
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=1024", "model.heads=16",
                  "model.ffn_dim=3328", "model.vocab_size=4096", "tp=1")
    # 967: llama31_8b's step with each block recomputed in the backward
    step_budget = StepBudget(ops=1_050)
    corpus = CORPUS
    mini = None
    golden = None  # no mini: nothing of its own to record (its code path's mini is another workload's)
    full = Scale(FULL_405B, llama_data.C4(CORPUS, MLPERF_405B.vocab_size,
                                          "large_language_model_pretraining/nemo preprocessing: C4 en tokenized "
                                          "with the Mixtral 8x22B tokenizer"))


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = Llama31_405bWorkload
