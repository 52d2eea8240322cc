"""The decoder family's workload: what Llama 3.1 8B and 405B, GPT-OSS-20B and DeepSeek-V3 share (the model's
build and optimizer, NeMo's schedule, the logged hyperparameters, the FSDP2 parallelism, the synthetic batches,
C4 or the Markov corpus as data). Each workload's package declares only what is its own: its name and rules,
its recipes, its corpus and data source, its step probe."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    FullyShard,
    Metric,
    ModelParts,
    RuntimeContext,
    StepProbe,
    Workload,
)
from trainperf.errors import TrainperfError, shown
from trainperf.optim import kernels
from trainperf.workloads.common.llm import data as llama_data
from trainperf.workloads.common.llm import hf, synthetic
from trainperf.workloads.common.llm.hf_deepseek import DeepSeekCheckpoint
from trainperf.workloads.common.llm.model import Llama, LlamaConfig, next_token_loss, token_losses
from trainperf.workloads.common.llm.moe import load_imbalance, update_corrections
from trainperf.workloads.common.llm.moe_model import MoETransformer, moe_loss, moe_token_losses
from trainperf.workloads.common.llm.recipe import LlamaRecipe, MoERecipe

R = TypeVar("R", bound=LlamaRecipe)

__all__ = ["DecoderWorkload", "MoEWorkload", "lr_factor"]


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


def _model_and_adamw(model_class: Any, recipe: LlamaRecipe, ctx: RuntimeContext
                     ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The decoder and its AdamW, as every member of the family builds them."""
    with torch.device("meta" if recipe.meta_init else ctx.device):
        model = model_class(recipe.model, recipe.seq_len)
        if not recipe.meta_init:
            model.reset_parameters()
    # Megatron's default: no weight decay on the norms' scales (every 1-D parameter).
    decayed = [p for p in model.parameters() if p.dim() > 1]
    plain = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": recipe.weight_decay}, {"params": plain, "weight_decay": 0.0}],
        lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps, **kernels(recipe.fused_optimizer))
    return model, optimizer


class DecoderWorkload(Workload[R]):
    """A decoder-only language model pretrained to a log perplexity (a dense Llama unless a subclass builds
    another model)."""

    metric = Metric("log_perplexity", higher_is_better=False)
    speedups = frozenset({"precision", "compile", "cuda_graphs", "fused_optimizer", "fp8"})
    sample_name = "sequences"
    corpus = synthetic.MINI_CORPUS

    def mlperf_hyperparameters(self, recipe: R, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_name": "adamw", "opt_base_learning_rate": recipe.base_lr, "opt_end_learning_rate": recipe.end_lr,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps,
            "opt_learning_rate_decay_steps": recipe.max_steps - recipe.warmup_steps,
            "opt_learning_rate_decay_schedule": "cosine with linear warmup",
            "opt_adamw_beta_1": recipe.beta1, "opt_adamw_beta_2": recipe.beta2, "opt_adamw_epsilon": recipe.eps,
            "opt_adamw_weight_decay": recipe.weight_decay, "opt_gradient_clip_norm": recipe.max_grad_norm,
            "max_sequence_length": recipe.seq_len, "max_steps": recipe.max_steps, "init_checkpoint_step": 0,
        }

    def assets(self, recipe: R, data_dir: Path | None) -> dict[str, Path]:
        # A relative folder is the data's (`--data DIR` holding DIR/checkpoint/, as 405B's recipes name it); with no
        # data (a synthetic bench) there is none to read, and the weights are drawn as without a checkpoint.
        if not recipe.initial_checkpoint:
            return {}
        folder = Path(recipe.initial_checkpoint).expanduser()
        if not folder.is_absolute():
            if data_dir is None:
                return {}
            folder = data_dir / folder
        return {"initial checkpoint": folder / "config.json"}

    def check_assets(self, recipe: R, assets: Assets) -> None:
        checkpoint = self._checkpoint(recipe, assets)
        if checkpoint is not None:
            checkpoint.check_headers()

    def _checkpoint(self, recipe: R, assets: Assets) -> Any:
        """The initial checkpoint the recipe names (its reader: `load_into(model)`, `check_headers()`), its
        config held equal to the recipe's model."""
        if "initial checkpoint" not in assets:
            return None
        return self.read_checkpoint(recipe, assets["initial checkpoint"].parent)

    def read_checkpoint(self, recipe: R, folder: Path) -> Any:
        """A Llama's Hugging Face folder, held equal to the recipe's model but for the context it was trained at
        and the initialisation's scale; another vocabulary reads the overlapping rows, as the MLPerf 405B
        reference's Megatron loads Meta's 128,256 rows for the Mixtral tokenizer's 32,768."""
        if not isinstance(recipe.model, LlamaConfig):
            raise TrainperfError(f"recipe field initial_checkpoint={shown(recipe.initial_checkpoint, 80)!r}: "
                                 f"{self.name}'s model is not a Llama")
        checkpoint = hf.Checkpoint(folder)
        checkpoint.require(recipe.model, ignored=("vocab_size",))
        return checkpoint

    def build(self, recipe: R, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        # Built and initialised on the device: every process holds the whole model until the engine shards
        # it (the same seed everywhere: the same weights), never a host copy per process. With meta_init,
        # on no device: the engine initialises each shard where it lands (Llama.init_weights), from the initial
        # checkpoint when there is one (each process reading only its shards' parts).
        checkpoint = self._checkpoint(recipe, assets)
        model, optimizer = _model_and_adamw(Llama, recipe, ctx)
        if checkpoint is not None:
            model.weights_source = checkpoint
            if not recipe.meta_init:
                checkpoint.load_into(model)
        return ModelParts(model=model, optimizer=optimizer, loss_fn=next_token_loss,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=token_losses,
                          parallel=self.parallelism(recipe))

    def parallelism(self, recipe: R) -> FullyShard:
        return FullyShard(tp=recipe.tp, checkpointing=recipe.checkpointing)

    def formula_flops(self, recipe: R) -> tuple[float, int, str] | None:
        return (recipe.model.flops_per_token(recipe.seq_len) * recipe.seq_len, recipe.seq_len,
                "6 x parameters outside the input embedding + 12 x layers x width x sequence per token, "
                "as torchtitan and Megatron count")

    def synthetic_batch(self, recipe: R, ctx: RuntimeContext, model: nn.Module) -> Any:
        rows = ctx.batch_share(recipe.global_batch_size)
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        return torch.randint(0, recipe.model.vocab_size, (rows, recipe.seq_len + 1), device=ctx.device, generator=gen)

    def synthetic_eval_batch(self, recipe: R, ctx: RuntimeContext, model: nn.Module) -> Any:
        return self.synthetic_batch(recipe, ctx, model)[:recipe.eval_batch_size]

    def load_data(self, recipe: R, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return llama_data.data_parts(recipe, data_dir, ctx, self.corpus)



def expert_parallel_probes(moe_layers: int) -> tuple[StepProbe, ...]:
    """The MoE step's configurations beside the default one (ep=1) whose host demands are counted: expert
    parallelism over two processes, dropless as the references train (each of the probe's `moe_layers` MoE
    layers reads its split sizes back once a forward), and with a capacity factor (static splits: nothing read
    back, so the step can be captured)."""
    return (StepProbe("ep=2", ("ep=2", "global_batch_size=2"), processes=2, syncs={"host copy": moe_layers},
                      why="dropless expert parallelism: each MoE layer's all-to-all split sizes, read back once a "
                          "forward (torch.distributed takes them as host integers; Megatron and torchtitan too)"),
            StepProbe("ep=2, capacity factor 1.25", ("ep=2", "global_batch_size=2", "model.capacity_factor=1.25"),
                      processes=2))


class MoEWorkload(DecoderWorkload[MoERecipe]):
    """A mixture-of-experts decoder (common/llm/moe_model.py), its experts split over processes by expert
    parallelism."""

    speedups = frozenset({"precision", "compile", "cuda_graphs", "fused_optimizer"})

    def mlperf_hyperparameters(self, recipe: MoERecipe, ctx: RuntimeContext) -> dict[str, Any]:
        logged = super().mlperf_hyperparameters(recipe, ctx)
        logged["expert_parallelism"] = recipe.ep
        if recipe.model.aux_loss_coeff:
            logged["moe_aux_loss_coeff"] = recipe.model.aux_loss_coeff
        if recipe.model.capacity_factor:  # not an MLPerf key (the checker ignores it): the run drops tokens
            logged["trainperf_moe_capacity_factor"] = recipe.model.capacity_factor
        return logged

    def notes(self, recipe: MoERecipe, scale: str) -> list[str]:
        notes = super().notes(recipe, scale)
        if recipe.model.capacity_factor:
            notes.append(f"model.capacity_factor={recipe.model.capacity_factor:g}: assignments over an expert's "
                         "capacity are dropped; the reference MoE is dropless, so this run is not comparable to "
                         "MLPerf (it measures the graphable dispatch)")
        return notes

    def read_checkpoint(self, recipe: MoERecipe, folder: Path) -> Any:
        """A DeepSeek-V3 Hugging Face folder (latent attention), its architecture the recipe's model's, its
        vocabulary too: the MLPerf reference's checkpoint was re-warmed for the Llama 3.1 tokenizer, so no rows
        are mapped between vocabularies."""
        if recipe.model.attention != "latent":
            raise TrainperfError(f"recipe field initial_checkpoint={shown(recipe.initial_checkpoint, 80)!r}: "
                                 f"{self.name}'s model is not DeepSeek-V3's; only Llama and DeepSeek-V3 "
                                 "checkpoints are read so far")
        checkpoint = DeepSeekCheckpoint(folder)
        checkpoint.require(recipe.model)
        return checkpoint

    def build(self, recipe: MoERecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        checkpoint = self._checkpoint(recipe, assets)
        model, optimizer = _model_and_adamw(MoETransformer, recipe, ctx)
        if checkpoint is not None:
            model.weights_source = checkpoint
            if not recipe.meta_init:
                checkpoint.load_into(model)
        rate = recipe.model.bias_update_rate
        return ModelParts(model=model, optimizer=optimizer, loss_fn=moe_loss,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=moe_token_losses,
                          after_step=(lambda step: update_corrections(model, rate)) if rate else None,
                          parallel=self.parallelism(recipe))

    def parallelism(self, recipe: MoERecipe) -> FullyShard:
        return FullyShard(checkpointing=recipe.checkpointing, ep=recipe.ep)

    def formula_flops(self, recipe: MoERecipe) -> tuple[float, int, str] | None:
        return (recipe.model.flops_per_token(recipe.seq_len) * recipe.seq_len, recipe.seq_len,
                "6 x active parameters (output layer in, input embedding out) + 6 x layers x heads x "
                "(query/key + value head sizes) x sequence per token, as torchtitan counts an MoE model")

    def step_statistics(self, model: nn.Module) -> dict[str, float]:
        return load_imbalance(model)

