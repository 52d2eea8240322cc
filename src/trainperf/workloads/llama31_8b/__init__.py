"""Llama 3.1 8B pretraining on C4 (MLPerf key `llama31_8b`, "small LLM pretraining", rounds 5.1-6.1), on FSDP2
with tensor parallelism where asked; its mini scale is a 2-layer Llama on a generated Markov corpus in the
same `.bin`/`.idx` format."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.optim import kernels
from trainperf.spec import (
    Assets,
    DataParts,
    FullyShard,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    Workload,
)
from trainperf.workloads.llama31_8b import data as llama_data
from trainperf.workloads.llama31_8b import synthetic
from trainperf.workloads.llama31_8b.model import Llama, next_token_loss, token_losses
from trainperf.workloads.llama31_8b.recipes import EVAL_SAMPLES, FULL_RECIPES, MINI, LlamaRecipe

__all__ = ["Llama31Workload", "LlamaRecipe", "lr_factor"]


def lr_factor(recipe: LlamaRecipe) -> Callable[[int], float]:
    """NeMo's cosine with linear warmup, as a multiplier of base_lr at optimizer step `step` (from 0):
    (step + 1) / (warmup + 1) during the warmup, then a half cosine from 1 to end_lr_fraction over
    max_steps - warmup steps, flat after it."""
    warmup, decay, floor = recipe.warmup_steps, recipe.max_steps - recipe.warmup_steps, recipe.end_lr_fraction

    def factor(step: int) -> float:
        if step <= warmup and warmup > 0:
            return (step + 1) / (warmup + 1)
        done = min(1.0, (step - warmup) / decay)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return factor


class Llama31Workload(Workload[LlamaRecipe]):
    name = "llama31_8b"
    benchmark = "llama31_8b"
    mlperf = MLPerf(ruleset="6.0.0", runs=10, full_eval_samples=EVAL_SAMPLES)
    metric = Metric("log_perplexity", higher_is_better=False)
    summary = "Llama 3.1 8B pretraining on C4, log perplexity (mini: a 2-layer Llama on a Markov corpus)"
    speedups = frozenset({"precision", "compile", "cuda_graphs", "fused_optimizer", "fp8"})
    sample_name = "sequences"
    # The full shape at a CPU's size: 2 blocks, narrower, a smaller vocabulary, 256 tokens (the same operators).
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=512", "model.ffn_dim=1792",
                  "model.vocab_size=4096")
    corpus = synthetic.MINI_CORPUS
    mini = Scale(MINI, synthetic.MarkovCorpus())
    full = Scale(FULL_RECIPES, llama_data.C4())

    def mlperf_hyperparameters(self, recipe: LlamaRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_name": "adamw", "opt_base_learning_rate": recipe.base_lr, "opt_end_learning_rate": recipe.end_lr,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps,
            "opt_learning_rate_decay_steps": recipe.max_steps - recipe.warmup_steps,
            "opt_learning_rate_decay_schedule": "cosine with linear warmup",
            "opt_adamw_beta_1": recipe.beta1, "opt_adamw_beta_2": recipe.beta2, "opt_adamw_epsilon": recipe.eps,
            "opt_adamw_weight_decay": recipe.weight_decay, "opt_gradient_clip_norm": recipe.max_grad_norm,
            "max_sequence_length": recipe.seq_len, "max_steps": recipe.max_steps, "init_checkpoint_step": 0,
        }

    def build(self, recipe: LlamaRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        # Built and initialised on the device: every process holds the whole model until the engine shards
        # it (the same seed everywhere: the same weights), never a host copy per process. With meta_init,
        # on no device: the engine initialises each shard where it lands (Llama.init_weights).
        with torch.device("meta" if recipe.meta_init else ctx.device):
            model = Llama(recipe.model, recipe.seq_len)
            if not recipe.meta_init:
                model.reset_parameters()
        # Megatron's default: no weight decay on the norms' scales (every 1-D parameter).
        decayed = [p for p in model.parameters() if p.dim() > 1]
        plain = [p for p in model.parameters() if p.dim() <= 1]
        optimizer = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": recipe.weight_decay}, {"params": plain, "weight_decay": 0.0}],
            lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
            **kernels(recipe.fused_optimizer))
        return ModelParts(model=model, optimizer=optimizer, loss_fn=next_token_loss,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=token_losses,
                          parallel=self.parallelism(recipe))

    def parallelism(self, recipe: LlamaRecipe) -> FullyShard:
        return FullyShard(tp=recipe.tp, checkpointing=recipe.checkpointing)

    def formula_flops(self, recipe: LlamaRecipe) -> tuple[float, int, str] | None:
        return (recipe.model.flops_per_token(recipe.seq_len) * recipe.seq_len, recipe.seq_len,
                "6 x parameters outside the input embedding + 12 x layers x width x sequence per token, "
                "as torchtitan and Megatron count")

    def synthetic_batch(self, recipe: LlamaRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        rows = max(1, recipe.global_batch_size // ctx.data_world)
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        return torch.randint(0, recipe.model.vocab_size, (rows, recipe.seq_len + 1), device=ctx.device, generator=gen)

    def synthetic_eval_batch(self, recipe: LlamaRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return self.synthetic_batch(recipe, ctx, model)[:recipe.eval_batch_size]

    def load_data(self, recipe: LlamaRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return llama_data.data_parts(recipe, data_dir, ctx, self.corpus)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = Llama31Workload
