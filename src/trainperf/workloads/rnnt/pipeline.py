"""RNN-T's data pipeline: bucketed batches of utterances, decoded and speed-perturbed on the host in a
prefetch thread (as the reference's pipeline does per utterance) and featurized on the device; the greedy
transcripts of this rank's share of dev-clean, scored by word error rate."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.rnnt import data as rnnt_data
from trainperf.workloads.rnnt.features import FeatureConfig, Featurizer, speed_perturb


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


def pad_waves(waves: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([w.shape[-1] for w in waves], device=device)
    padded = torch.nn.utils.rnn.pad_sequence([w.to(device).float() for w in waves], batch_first=True)
    return padded, lengths


def pad_tokens(rows: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(r) for r in rows)
    out = np.zeros((len(rows), longest), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return torch.from_numpy(out).to(device), torch.from_numpy(lengths).to(device)


class LibriSpeechPipeline:
    """Opened after run_start: the training subsets (read as needed or held in memory), dev-clean in memory."""

    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        self.tokenizer = load_tokenizer(rnnt_data.spm_path(data_dir, recipe.model.pieces))
        self.cfg = cfg = FeatureConfig()
        self.train, _dropped = rnnt_data.load_split(data_dir, recipe.subsets, self.tokenizer, recipe.max_duration,
                                                    cfg.trim_db, recipe.in_memory)
        self.dev, _ = rnnt_data.load_split(data_dir, [rnnt_data.EVAL_SUBSET], self.tokenizer, 0.0, cfg.trim_db, True)
        self.featurize = Featurizer(cfg, ctx.device)
        self.recipe, self.ctx, self.device = recipe, ctx, ctx.device
        self.seed = ctx.stream_seed("batches")
        self.pool = ThreadPoolExecutor(max_workers=recipe.loader_threads) if recipe.loader_threads > 1 else None
        self.steps = len(self.train) // recipe.global_batch_size
        if self.steps == 0:
            raise TrainperfError(f"{len(self.train)} training utterances: fewer than one global batch of "
                                 f"{recipe.global_batch_size}")
        self.share = sorted(ctx.shard(len(self.dev)), key=lambda i: self.dev.durations[i])  # less padding
        self.eval_gen = torch.Generator(device=ctx.device)

    def host_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        """This rank's share of each bucketed global batch, decoded and speed-perturbed on the host."""
        recipe, cfg, rank = self.recipe, self.cfg, self.ctx.rank
        rng = np.random.default_rng([self.seed, epoch])
        speeds = np.random.default_rng([self.seed, epoch, rank, 1])
        for rows in rnnt_data.bucketed_batches(self.train.durations, recipe.global_batch_size, recipe.buckets, rng):
            mine = rnnt_data.shard(rows, rank, self.ctx.world_size)
            waves = rnnt_data.read_many(self.train, mine, self.pool)
            rates = speeds.uniform(cfg.speed_min, cfg.speed_max, len(mine))
            moved = [speed_perturb(torch.from_numpy(w), float(r)) for w, r in zip(waves, rates, strict=True)]
            padded, lengths = pad_waves(moved, torch.device("cpu"))
            yield padded, lengths, mine

    def train_batches(self, view: EpochView) -> Iterator[tuple[torch.Tensor, ...]]:
        device = self.device
        gen = torch.Generator(device=device)
        gen.manual_seed(int(np.random.default_rng([self.seed, view.epoch, self.ctx.rank, 2]).integers(2**62)))
        for padded, lengths, rows in rnnt_data.prefetch(self.host_batches(view.epoch)):
            feats, frames = self.featurize(padded.to(device, non_blocking=True), lengths.to(device), True, gen)
            tokens, labels = pad_tokens([self.train.tokens[i] for i in rows], device)
            yield feats, frames, tokens, labels

    def evaluate(self, forward: Callable[[Any], list[list[int]]]) -> EvalPartial:
        self.eval_gen.manual_seed(self.ctx.stream_seed("eval dither", per_rank=True))
        found: list[tuple[int, str]] = []
        for start in range(0, len(self.share), self.recipe.eval_batch_size):
            rows = self.share[start: start + self.recipe.eval_batch_size]
            padded, lengths = pad_waves([torch.from_numpy(self.dev.audio(i)) for i in rows], self.device)
            feats, frames = self.featurize(padded, lengths, False, self.eval_gen)
            for i, ids in zip(rows, forward((feats, frames)), strict=True):
                found.append((i, self.tokenizer.decode(ids)))
        return EvalPartial(metric=functools.partial(word_error_rate, references=list(self.dev.transcripts)),
                           objects={"transcripts": found})

    def parts(self) -> DataParts:
        return DataParts(train_batches=self.train_batches, steps_per_epoch=self.steps,
                         train_samples=self.steps * self.recipe.global_batch_size, eval_samples=len(self.dev),
                         evaluate=self.evaluate)
