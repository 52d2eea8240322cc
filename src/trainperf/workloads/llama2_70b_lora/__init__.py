"""Llama 2 70B LoRA fine-tuning on SCROLLS GovReport (MLPerf key `llama2_70b_lora`, rounds 4.0-6.1): the shared
Llama (workloads/common/llm) loaded frozen from the user's Hugging Face checkpoint, rank-16 adapters on its
attention, FSDP2 over the frozen base. Its mini fine-tunes a shipped 2-block base on a generated
document -> title task in the same parquet layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DataSource,
    DeviceProbe,
    FullyShard,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
)
from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.workloads.common.llm import hf
from trainperf.workloads.common.llm.model import Llama
from trainperf.workloads.common.llm.workload import lr_factor
from trainperf.workloads.llama2_70b_lora import data as gov
from trainperf.workloads.llama2_70b_lora import synthetic
from trainperf.workloads.llama2_70b_lora.lora import adapter_parameters, add_adapters
from trainperf.workloads.llama2_70b_lora.recipes import EVAL_SAMPLES, FULL_RECIPES, MINI, LoraRecipe

__all__ = ["LoraWorkload"]


class GovReportFiles(DataSource):
    """The reference's prepared GovReport: checked, never downloaded."""

    def problems(self, data_dir: Path) -> list[str]:
        missing = [f"{data_dir / name}: missing (the Hugging Face dataset regisss/scrolls_gov_report_preprocessed_"
                   "mlperf_2, as the reference's download script leaves it)"
                   for name in (gov.TRAIN, gov.VALID) if not (data_dir / name).is_file()]
        if not (data_dir / "base" / "config.json").is_file():
            # The base is part of what a run needs from --data: `prepare` says ready only with it.
            missing.append(f"{data_dir / 'base' / 'config.json'}: missing (the Llama 2 70B base as a Hugging Face "
                           "checkpoint folder base/: config.json and safetensors shards, as the reference's "
                           "conversion leaves it)")
        return missing

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError("; ".join(problems))
        for name in (gov.TRAIN, gov.VALID):
            ids, _ = gov.read_rows(data_dir / name, 32_000, 8_192)
            say(f"{data_dir / name}: {len(ids):,} rows, {sum(a.size for a in ids):,} tokens")

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / gov.VALID, EVAL_SAMPLES


class LoraWorkload(Workload[LoraRecipe]):
    name = "llama2_70b_lora"
    benchmark = "llama2_70b_lora"
    mlperf = MLPerf(ruleset="6.1.0", runs=10, full_eval_samples=EVAL_SAMPLES)
    metric = Metric("eval_loss", higher_is_better=False)
    summary = ("Llama 2 70B LoRA fine-tuning on GovReport, evaluation loss (mini: a shipped 2-block base "
               "fine-tuned on a generated document -> title task)")
    speedups = frozenset({"precision", "fp8", "compile", "cuda_graphs", "fused_optimizer"})
    sample_name = "sequences"
    step_probe = ("global_batch_size=1", "seq_len=256", "model.layers=2", "model.dim=512", "model.heads=8",
                  "model.ffn_dim=1792", "model.vocab_size=4096")
    # 1,062: the frozen base's step recomputed, the adapters' products (B per q, k, v)
    step_budget = StepBudget(ops=1_170)
    # The 70B's frozen bf16 base, 8 of its 80 blocks at full width with their adapters (one sequence of 8,192).
    device_probe = DeviceProbe(batch=1, sets=("model.layers=8",))
    real_layout = ("data/train-00000-of-00001.parquet", "base/model.safetensors")
    mini = Scale(MINI, synthetic.GovReportLike())
    full = Scale(FULL_RECIPES, GovReportFiles())

    def assets(self, recipe: LoraRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The base: the mini's ships in the package; the full one is the user's copy, beside the data
        # (`--data DIR` holding the dataset and the checkpoint folder `base/`).
        if recipe.model == synthetic.BASE_CONFIG:
            return {"base checkpoint": synthetic.BASE / "config.json"}
        if data_dir is None:
            return {}  # synthetic data (bench): a base drawn at random times the same
        return {"base checkpoint": data_dir / "base" / "config.json"}

    def mlperf_hyperparameters(self, recipe: LoraRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {"opt_base_learning_rate": recipe.base_lr, "opt_learning_rate_training_steps": recipe.max_steps,
                "opt_gradient_clip_norm": recipe.max_grad_norm, "opt_adamw_weight_decay": recipe.weight_decay,
                "lora_rank": recipe.lora_rank, "lora_alpha": recipe.lora_alpha,
                "opt_learning_rate_warmup_factor": 0.0}

    def check_assets(self, recipe: LoraRecipe, assets: Assets) -> None:
        checkpoint = self._checkpoint(recipe, assets)
        if checkpoint is not None:
            checkpoint.check_headers()

    def _checkpoint(self, recipe: LoraRecipe, assets: Assets) -> hf.Checkpoint | None:
        """The base checkpoint the recipe names (the shipped one checked by its SHA-256), its config
        held equal to the recipe's model."""
        if "base checkpoint" not in assets:
            return None
        folder = assets["base checkpoint"].parent
        if folder == synthetic.BASE:
            synthetic.verify_shipped_base(folder)
        checkpoint = hf.Checkpoint(folder)
        # The context it was trained at is the checkpoint's to say (Llama 2: 4,096; the mini's: 128).
        checkpoint.require(recipe.model)
        return checkpoint

    def build(self, recipe: LoraRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        checkpoint = self._checkpoint(recipe, assets)
        # On the meta device: the engine gives each process storage for its shards and Llama.init_weights
        # reads them from the checkpoint (the adapters drawn), never the whole base on one device.
        with torch.device("meta"):
            model = Llama(recipe.model, recipe.seq_len)
        if recipe.precision in ("bf16", "fp8"):
            for param in model.parameters():  # the frozen base in bf16, as the reference loads it; the
                param.data = param.data.to(torch.bfloat16)  # rotary tables stay fp32
        model.weights_source = checkpoint
        trained = add_adapters(model, recipe.lora_rank, recipe.lora_alpha, recipe.lora_dropout)
        optimizer = torch.optim.AdamW(trained, lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
                                      weight_decay=recipe.weight_decay, **kernels(recipe.fused_optimizer))
        return ModelParts(model=model, optimizer=optimizer, loss_fn=gov.summary_loss,
                          lr_schedule=lambda steps: lr_factor(recipe), eval_forward=gov.sample_losses,
                          parallel=self.parallelism(recipe))

    def parallelism(self, recipe: LoraRecipe) -> FullyShard:
        return FullyShard(tp=recipe.tp, checkpointing=recipe.checkpointing)

    def formula_flops(self, recipe: LoraRecipe) -> tuple[float, int, str] | None:
        c = recipe.model
        fused = (c.heads + 2 * c.kv_heads) * c.head_dim
        adapters = adapter_parameters(c.layers, c.dim, fused, recipe.lora_rank)
        per_token = (4.0 * (c.parameters() - c.vocab_size * c.dim) + 6.0 * adapters
                     + 12.0 * c.layers * c.dim * recipe.seq_len)
        return (per_token * recipe.seq_len, recipe.seq_len,
                "4 x frozen parameters outside the input embedding (forward and input gradients, no weight "
                "gradients) + 6 x adapter parameters + 12 x layers x width x sequence per token")

    def synthetic_batch(self, recipe: LoraRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        rows = ctx.batch_share(recipe.global_batch_size)
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        ids = torch.randint(0, recipe.model.vocab_size, (rows, 1, recipe.seq_len), device=ctx.device, generator=gen)
        labels = ids.clone()
        labels[:, :, : recipe.seq_len // 2] = gov.IGNORE  # the loss on the second half, as on a summary
        return torch.cat([ids, labels], dim=1)

    def load_data(self, recipe: LoraRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        return gov.data_parts(recipe, data_dir, ctx)

    def make(self, command: str, out: Path, say: Callable[[str], None], options: dict[str, Any]) -> None:
        """`trainperf make-lora-base`: the mini's shipped base model (see synthetic.py)."""
        synthetic.make_base(out, options["steps"], say, options["seed"])


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = LoraWorkload
# The assets `trainperf make-*` builds for it (registry.py reads this literal; nothing is imported).
MAKES = {"make-lora-base": {"help": "train the LoRA mini's base model (shipped in the package)", "out": "lora-base",
                            "files": "config.json, model.safetensors, base.json", "steps": 800, "seed": 1,
                            "what": "language-model training"}}
