"""GPT-OSS-20B mixture-of-experts pretraining on C4 (MLPerf key `gpt_oss_20b`, "small LLM MoE pretraining",
rounds 6.0-6.1): the Llama family's data, evaluation, schedule and FSDP2 plumbing (workloads/llama31_8b) with
the MoE decoder of workloads/gpt_oss_20b/model.py, its experts split over processes by expert parallelism.
Its mini is a 2-block MoE on llama31_8b's generated Markov corpus."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainperf.optim import kernels
from trainperf.spec import Assets, FullyShard, MLPerf, ModelParts, RuntimeContext, Scale
from trainperf.workloads.common.moe import load_imbalance, update_corrections
from trainperf.workloads.gpt_oss_20b.model import MoETransformer, moe_loss, moe_token_losses
from trainperf.workloads.gpt_oss_20b.recipes import FULL_RECIPES, MINI, MoERecipe
from trainperf.workloads.llama31_8b import Llama31Workload, lr_factor, synthetic
from trainperf.workloads.llama31_8b import data as llama_data

__all__ = ["GptOssWorkload", "MoERecipe"]


class GptOssWorkload(Llama31Workload):
    name = "gpt_oss_20b"
    benchmark = "gpt_oss_20b"
    mlperf = MLPerf(ruleset="6.0.0", runs=10, full_eval_samples=1_024)
    summary = ("GPT-OSS-20B mixture-of-experts pretraining on C4, log perplexity (mini: a 2-block MoE of 8 "
               "experts on a Markov corpus)")
    speedups = frozenset({"precision", "compile", "cuda_graphs", "fused_optimizer"})
    # The full step's operators at a CPU's size: 2 blocks (one windowed), 8 narrow experts, 256 tokens.
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=256", "model.heads=8",
                  "model.kv_heads=2", "model.head_dim=32", "model.experts=8", "model.expert_dim=256",
                  "model.vocab_size=4096", "ep=1")
    # llama31_8b's corpus with validation text for 16 sequences of 8,192 + 1 tokens.
    corpus = synthetic.Corpus(valid_tokens=160_000)
    mini = Scale(MINI, synthetic.MarkovCorpus(corpus))
    full = Scale(FULL_RECIPES, llama_data.C4(synthetic.MINI_CORPUS, llama_data.LLAMA31_VOCAB,
                                             "small_llm_moe_pretraining preprocessing (the llama31_8b download): "
                                             "C4 en tokenized with Llama 3.1's tokenizer"))

    def mlperf_hyperparameters(self, recipe: MoERecipe, ctx: RuntimeContext) -> dict[str, Any]:  # type: ignore[override]
        logged = super().mlperf_hyperparameters(recipe, ctx)
        logged["expert_parallelism"] = recipe.ep
        if recipe.model.aux_loss_coeff:
            logged["moe_aux_loss_coeff"] = recipe.model.aux_loss_coeff
        return logged

    def build(self, recipe: MoERecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:  # type: ignore[override]
        # As the Llama's: built on the device (every process the same weights from the same seed) or, with
        # meta_init, nowhere until the engine has sharded it.
        with torch.device("meta" if recipe.meta_init else ctx.device):
            model = MoETransformer(recipe.model, recipe.seq_len)
            if not recipe.meta_init:
                model.reset_parameters()
        decayed = [p for p in model.parameters() if p.dim() > 1]
        plain = [p for p in model.parameters() if p.dim() <= 1]
        optimizer = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": recipe.weight_decay}, {"params": plain, "weight_decay": 0.0}],
            lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
            **kernels(recipe.fused_optimizer))
        rate = recipe.model.bias_update_rate
        return ModelParts(model=model, optimizer=optimizer, loss_fn=moe_loss,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=moe_token_losses,
                          after_step=(lambda step: update_corrections(model, rate)) if rate else None,
                          parallel=self.parallelism(recipe))

    def parallelism(self, recipe: MoERecipe) -> FullyShard:
        return FullyShard(checkpointing=recipe.checkpointing, ep=recipe.ep)

    def formula_flops(self, recipe: MoERecipe) -> tuple[float, int, str] | None:  # type: ignore[override]
        return (recipe.model.flops_per_token(recipe.seq_len) * recipe.seq_len, recipe.seq_len,
                "6 x active parameters (output layer in, input embedding out) + 6 x layers x heads x "
                "(query/key + value head sizes) x sequence per token, as torchtitan counts an MoE model")

    def step_statistics(self, model: nn.Module) -> dict[str, float]:
        return load_imbalance(model)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = GptOssWorkload
