"""RNN-T on LibriSpeech (MLPerf key `rnnt`, ruleset 1.0.0), and its mini scale on synthetic speech
written as a LibriSpeech tree. Word error rate of batched greedy decoding with the EMA weights over
dev-clean, scored off the training path; the transducer loss is trainperf's own (loss.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    LengthBuckets,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
    bare_model,
    per_epoch_schedule,
)
from trainperf.errors import TrainperfError
from trainperf.optim import LAMB, ema, multi_tensor
from trainperf.optim.ema import EMA
from trainperf.workloads.rnnt import data as rnnt_data
from trainperf.workloads.rnnt import model as rnnt_model
from trainperf.workloads.rnnt import synthetic
from trainperf.workloads.rnnt.features import FeatureConfig, max_frames
from trainperf.workloads.rnnt.loss import torchaudio_rnnt_loss, transducer_loss
from trainperf.workloads.rnnt.pipeline import LibriSpeechPipeline, load_tokenizer
from trainperf.workloads.rnnt.recipes import FULL, FULL_RECIPES, MINI, RNNTRecipe


def transducer_losses(impl: str, blank: int) -> Callable[..., torch.Tensor]:
    """loss(logits, tokens, frames, labels) -> each utterance's loss, by the recipe's loss_impl."""
    if impl == "wavefront":
        return lambda logits, tokens, frames, labels: transducer_loss(logits, tokens, frames, labels, blank, "none")
    rnnt_loss = torchaudio_rnnt_loss()

    def torchaudio_loss(logits: torch.Tensor, tokens: torch.Tensor, frames: torch.Tensor,
                        labels: torch.Tensor) -> torch.Tensor:
        # int32 lengths and labels, fp32 logits, as its CUDA kernel takes them; padding tokens are -1 here.
        return rnnt_loss(logits.float(), tokens.clamp_min(0).int(), frames.int(), labels.int(), blank=blank,
                         reduction="none")

    return torchaudio_loss


def padded(feats: torch.Tensor, tokens: torch.Tensor, frames: LengthBuckets, labels: LengthBuckets
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (B, T, F) and tokens (B, U) padded with zeros to their buckets (--static-shapes): the encoder
    and the prediction network run forward in time, and the loss's lattice stops at each utterance's own
    frames and labels, so the padding changes no loss (tested)."""
    try:
        t, u = frames.length(feats.shape[1]), labels.length(tokens.shape[1])
    except ValueError as exc:
        raise TrainperfError(f"recipe fields bucket_frames/bucket_labels: {exc}; give a longer bucket "
                             "with --set") from None
    return (torch.nn.functional.pad(feats, (0, 0, 0, t - feats.shape[1])),
            torch.nn.functional.pad(tokens, (0, u - tokens.shape[1])))


class RNNTWorkload(Workload[RNNTRecipe]):
    name = "rnnt"
    mlperf = MLPerf(ruleset="1.0.0", runs=10, full_epoch_samples=278_528, full_eval_forwards=2_703,
                    full_eval_samples=2_703)
    benchmark = "rnnt"
    metric = Metric("wer", higher_is_better=False)
    summary = "RNN-T on LibriSpeech, word error rate on dev-clean (mini: synthetic speech in a LibriSpeech tree)"
    # 10,469 before the lattice's loops were trimmed; the EMA synced twice
    step_budget = StepBudget(ops=5_260)
    device_probe = DeviceProbe(batch=32)
    real_layout = ("LibriSpeech/dev-clean/84/121123/84-121123-0000.flac",)
    speedups = frozenset({"precision", "fused_optimizer", "async_eval", "static_shapes", "compile", "cuda_graphs"})
    host_scoring = "process"  # word edit distance is pure Python
    sample_name = "utterances"

    mini = Scale(MINI, synthetic.SyntheticSpeech(MINI.subsets, MINI.model.pieces))
    full = Scale(FULL_RECIPES, rnnt_data.LibriSpeech(FULL.subsets, FULL.model.pieces))

    def mlperf_hyperparameters(self, recipe: RNNTRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        feats = FeatureConfig()
        return {
            "opt_name": "lamb", "model_weights_initialization_scale": recipe.model.init_scale,
            "opt_base_learning_rate": recipe.base_lr,
            "opt_lamb_epsilon": recipe.eps, "opt_lamb_learning_rate_decay_poly_power": recipe.decay,
            "opt_lamb_learning_rate_hold_epochs": recipe.hold_epochs,
            "opt_learning_rate_warmup_epochs": recipe.warmup_epochs, "opt_weight_decay": recipe.weight_decay,
            "opt_lamb_beta_1": recipe.beta1, "opt_lamb_beta_2": recipe.beta2,
            "opt_gradient_clip_norm": recipe.max_grad_norm or float("inf"),
            "opt_learning_rate_alt_decay_func": True, "opt_learning_rate_alt_warmup_func": True,
            "opt_lamb_learning_rate_min": recipe.min_lr, "data_train_max_duration": recipe.max_duration,
            "data_train_num_buckets": recipe.buckets,
            "data_speed_perturbaton_min": feats.speed_min, "data_speed_perturbaton_max": feats.speed_max,
            "data_spec_augment_freq_n": feats.freq_masks, "data_spec_augment_freq_min": 0,
            "data_spec_augment_freq_max": feats.freq_max, "data_spec_augment_time_n": feats.time_masks,
            "data_spec_augment_time_min": 0, "data_spec_augment_time_max": feats.time_max,
            "model_eval_ema_factor": recipe.ema, "eval_max_prediction_symbols": recipe.max_symbols,
        }

    def initialized_tensors(self, recipe: RNNTRecipe, model: nn.Module) -> list[str]:
        return list(rnnt_model.INITIALIZED)

    def assets(self, recipe: RNNTRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The model's output size is the sentencepiece model's; a synthetic benchmark without data uses
        # recipe.model.pieces.
        return {} if data_dir is None else {"sentencepiece model": rnnt_data.spm_path(data_dir, recipe.model.pieces)}

    def _config(self, recipe: RNNTRecipe, pieces: int) -> rnnt_model.RNNTConfig:
        # The output layer follows the sentencepiece model actually found (its size may differ from asked).
        return dataclasses.replace(recipe.model, pieces=pieces)

    def build(self, recipe: RNNTRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        pieces = recipe.model.pieces
        if "sentencepiece model" in assets:
            pieces = load_tokenizer(assets["sentencepiece model"]).get_piece_size()
        torch.manual_seed(ctx.stream_seed("init"))
        model = rnnt_model.RNNT(self._config(recipe, pieces)).to(ctx.device)
        optimizer = LAMB(model.parameters(), lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
                         weight_decay=recipe.weight_decay, foreach=multi_tensor(recipe.fused_optimizer))
        averaged = ema(model, recipe.ema)
        per_utterance = transducer_losses(recipe.loss_impl, model.cfg.blank)
        chunks = recipe.joint_chunks

        buckets = self._buckets(recipe) if recipe.bucketed else None

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            feats, frames, tokens, labels = batch
            if buckets is not None:  # padding past each utterance's frames and labels: the loss is the same
                feats, tokens = padded(feats, tokens, *buckets)
            return model(feats, frames, tokens, labels=labels, loss=per_utterance, chunks=chunks).mean()

        def forward(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[list[int]]:
            net = model.module if isinstance(model, EMA) else bare_model(model)
            return rnnt_model.greedy_decode(net, batch[0], batch[1], recipe.max_symbols)

        def schedule(steps_per_epoch: int) -> Callable[[int], float]:
            return rnnt_model.lr_factor(recipe.base_lr, steps_per_epoch, recipe.warmup_epochs, recipe.hold_epochs,
                               recipe.decay, recipe.min_lr)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward,
                          lr_schedule=per_epoch_schedule(self.name, schedule), eval_model=averaged,
                          after_step=lambda step: averaged.update_parameters(model))

    @staticmethod
    def _buckets(recipe: RNNTRecipe) -> tuple[LengthBuckets, LengthBuckets]:
        return (LengthBuckets.from_recipe("bucket_frames", recipe.bucket_frames),
                LengthBuckets.from_recipe("bucket_labels", recipe.bucket_labels))

    def shape_buckets(self, recipe: RNNTRecipe) -> dict[str, Any] | None:
        if not recipe.bucketed:
            return None
        frames, labels = self._buckets(recipe)
        return frames.describe(shapes=len(frames.lengths) * len(labels.lengths), what="feature frames x labels",
                               labels=list(labels.lengths),
                               padding="frames and labels past each utterance's own: outside its lattice")

    def synthetic_batches(self, recipe: RNNTRecipe, ctx: RuntimeContext, model: nn.Module) -> list[Any]:
        if not recipe.bucketed:
            return [self.synthetic_batch(recipe, ctx, model)]
        net, gen, b = bare_model(model), ctx.generator("synthetic"), self._per_rank(recipe, ctx)
        found = []
        for t in recipe.bucket_frames:
            for u in recipe.bucket_labels:
                feats = torch.randn(b, t, net.cfg.features, generator=gen, device=ctx.device)
                tokens = torch.randint(0, net.cfg.pieces, (b, u), generator=gen, device=ctx.device)
                found.append((feats, torch.full((b,), t, device=ctx.device), tokens,
                              torch.full((b,), u, device=ctx.device)))
        return found

    def _per_rank(self, recipe: RNNTRecipe, ctx: RuntimeContext) -> int:
        return ctx.batch_share(recipe.global_batch_size)

    def synthetic_batch(self, recipe: RNNTRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        net = bare_model(model)
        gen = ctx.generator("synthetic")
        b = self._per_rank(recipe, ctx)
        frames = max_frames(recipe.synthetic_seconds, FeatureConfig())
        labels = recipe.synthetic_pieces
        feats = torch.randn(b, frames, net.cfg.features, generator=gen, device=ctx.device)
        tokens = torch.randint(0, net.cfg.pieces, (b, labels), generator=gen, device=ctx.device)
        full = torch.full((b,), frames, device=ctx.device)
        return feats, full, tokens, torch.full((b,), labels, device=ctx.device)

    def synthetic_eval_batch(self, recipe: RNNTRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        feats, frames, _tokens, _labels = self.synthetic_batch(recipe, ctx, model)
        return feats[:4, :40], frames[:4].clamp_max(40)

    def load_data(self, recipe: RNNTRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        self._per_rank(recipe, ctx)  # the global batch splits evenly
        return LibriSpeechPipeline(recipe, data_dir, ctx).parts()


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = RNNTWorkload
