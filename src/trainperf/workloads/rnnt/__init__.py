"""RNN-T on LibriSpeech (MLPerf key `rnnt`, ruleset 1.0.0), and its mini scale on synthetic speech
written as a LibriSpeech tree. Word error rate of batched greedy decoding with the EMA weights over
dev-clean, scored off the training path; the transducer loss is trainperf's own (loss.py)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainperf.errors import TrainperfError
from trainperf.optim import LAMB, ema, multi_tensor
from trainperf.optim.ema import EMA
from trainperf.spec import (
    Assets,
    DataParts,
    EpochView,
    EvalPartial,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    Workload,
    bare_model,
    per_epoch_schedule,
)
from trainperf.workloads.rnnt import data as rnnt_data
from trainperf.workloads.rnnt import model as rnnt_model
from trainperf.workloads.rnnt import synthetic
from trainperf.workloads.rnnt.features import FeatureConfig, Featurizer, max_frames, speed_perturb
from trainperf.workloads.rnnt.loss import torchaudio_rnnt_loss, transducer_loss
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


class RNNTWorkload(Workload[RNNTRecipe]):
    name = "rnnt"
    mlperf = MLPerf(ruleset="1.0.0", runs=10, full_epoch_samples=278_528, full_eval_forwards=2_703,
                    full_eval_samples=2_703)
    benchmark = "rnnt"
    metric = Metric("wer", higher_is_better=False)
    summary = "RNN-T on LibriSpeech, word error rate on dev-clean (mini: synthetic speech in a LibriSpeech tree)"
    speedups = frozenset({"precision", "fused_optimizer", "async_eval"})
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

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            feats, frames, tokens, labels = batch
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

    def _per_rank(self, recipe: RNNTRecipe, ctx: RuntimeContext) -> int:
        if recipe.global_batch_size % ctx.world_size:
            raise TrainperfError(f"global_batch_size {recipe.global_batch_size} is not a multiple of "
                                 f"{ctx.world_size} processes")
        return recipe.global_batch_size // ctx.world_size

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
        tokenizer = load_tokenizer(rnnt_data.spm_path(data_dir, recipe.model.pieces))
        cfg = FeatureConfig()
        train, _dropped = rnnt_data.load_split(data_dir, recipe.subsets, tokenizer, recipe.max_duration, cfg.trim_db,
                                       recipe.in_memory)
        dev, _ = rnnt_data.load_split(data_dir, [rnnt_data.EVAL_SUBSET], tokenizer, 0.0, cfg.trim_db, True)
        featurize = Featurizer(cfg, ctx.device)
        device, rank, world = ctx.device, ctx.rank, ctx.world_size
        self._per_rank(recipe, ctx)  # the global batch splits evenly
        seed = ctx.stream_seed("batches")
        pool = ThreadPoolExecutor(max_workers=recipe.loader_threads) if recipe.loader_threads > 1 else None
        steps = len(train) // recipe.global_batch_size
        if steps == 0:
            raise TrainperfError(f"{len(train)} training utterances: fewer than one global batch of "
                                 f"{recipe.global_batch_size}")

        def host_batches(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
            # Decoding and speed perturbation (per utterance, as the reference's data pipeline does
            # them) run on the host in the prefetch thread, overlapped with the training step.
            rng = np.random.default_rng([seed, epoch])
            speeds = np.random.default_rng([seed, epoch, rank, 1])
            for rows in rnnt_data.bucketed_batches(train.durations, recipe.global_batch_size, recipe.buckets, rng):
                mine = rnnt_data.shard(rows, rank, world)
                waves = rnnt_data.read_many(train, mine, pool)
                rates = speeds.uniform(cfg.speed_min, cfg.speed_max, len(mine))
                moved = [speed_perturb(torch.from_numpy(w), float(r)) for w, r in zip(waves, rates, strict=True)]
                padded, lengths = _pad_waves(moved, torch.device("cpu"))
                yield padded, lengths, mine

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, ...]]:
            gen = torch.Generator(device=device)
            gen.manual_seed(int(np.random.default_rng([seed, view.epoch, rank, 2]).integers(2**62)))
            for padded, lengths, rows in rnnt_data.prefetch(host_batches(view.epoch)):
                feats, frames = featurize(padded.to(device, non_blocking=True), lengths.to(device), True, gen)
                tokens, labels = _pad_tokens([train.tokens[i] for i in rows], device)
                yield feats, frames, tokens, labels

        share = list(ctx.shard(len(dev)))
        share.sort(key=lambda i: dev.durations[i])  # similar lengths batched together: less padding
        references = list(dev.transcripts)
        eval_gen = torch.Generator(device=device)

        def evaluate(forward: Callable[[Any], list[list[int]]]) -> EvalPartial:
            eval_gen.manual_seed(ctx.stream_seed("eval dither", per_rank=True))
            found: list[tuple[int, str]] = []
            for start in range(0, len(share), recipe.eval_batch_size):
                rows = share[start: start + recipe.eval_batch_size]
                padded, lengths = _pad_waves([torch.from_numpy(dev.audio(i)) for i in rows], device)
                feats, frames = featurize(padded, lengths, False, eval_gen)
                for i, ids in zip(rows, forward((feats, frames)), strict=True):
                    found.append((i, tokenizer.decode(ids)))
            return EvalPartial(metric=functools.partial(word_error_rate, references=references),
                               objects={"transcripts": found})

        return DataParts(train_batches=train_batches, steps_per_epoch=steps, train_samples=steps *
                         recipe.global_batch_size, eval_samples=len(dev), evaluate=evaluate)


def load_tokenizer(path: Path) -> Any:
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as exc:
        raise TrainperfError(f"{path}: not a sentencepiece model ({str(exc).splitlines()[0][:80]})") from None


def word_error_rate(combined: dict[str, Any], references: list[str]) -> float:
    """Total word edits / total reference words over the whole evaluation set (torchmetrics' WER)."""
    from torchmetrics.functional.text import word_error_rate as wer

    found = dict(combined["transcripts"])
    if len(found) != len(references):
        raise ValueError(f"{len(found)} transcripts for {len(references)} evaluation utterances")
    return float(wer([found[i] for i in range(len(references))], references))


def _pad_waves(waves: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([w.shape[-1] for w in waves], device=device)
    padded = torch.nn.utils.rnn.pad_sequence([w.to(device).float() for w in waves], batch_first=True)
    return padded, lengths


def _pad_tokens(rows: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(r) for r in rows)
    out = np.zeros((len(rows), longest), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return torch.from_numpy(out).to(device), torch.from_numpy(lengths).to(device)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = RNNTWorkload
