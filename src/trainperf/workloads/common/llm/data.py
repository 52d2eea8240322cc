"""Llama 3.1's data: C4 (en) tokenized with the Llama 3.1 tokenizer in Megatron's indexed format, as the
MLPerf reference's preparation leaves it (mlcommons/training `small_llm_pretraining/nemo`: its README and
utils/consolidate_data.sh), and the batches and evaluation cut from it.

- training: `c4-train.en_6_text_document.{bin,idx}` (C4 files 00768-00895 merged; the reference's default
  trains on this one shard), documents back to back, no separator token;
- validation: `c4-validation-91205-samples.en_text_document.{bin,idx}` (the first 91,205 documents of
  the validation files: 47,186,855 tokens, enough for 5,760 sequences of 8,192 + 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, DataSource, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm import indexed
from trainperf.workloads.common.llm.recipe import LlamaRecipe
from trainperf.workloads.common.llm.synthetic import MINI_CORPUS, Corpus

LLAMA31_VOCAB = 128_256


class C4(DataSource):
    """The reference's prepared C4: checked, never downloaded (its preparation needs the Llama 3.1 tokenizer,
    gated by Meta's license)."""

    def __init__(self, corpus: Corpus = MINI_CORPUS, vocab_size: int = LLAMA31_VOCAB,
                 prepared_by: str = "small_llm_pretraining/nemo preprocessing: C4 en tokenized with Llama 3.1's "
                                    "tokenizer") -> None:
        self.corpus, self.vocab_size, self.prepared_by = corpus, vocab_size, prepared_by

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.corpus.trains, self.corpus.valid)

    def problems(self, data_dir: Path) -> list[str]:
        found = []
        for name in self.files:
            missing = [ext for ext in ("bin", "idx") if not (data_dir / f"{name}.{ext}").is_file()]
            if missing:
                found.append(f"{data_dir / name}.{'/'.join(missing)}: missing (prepared by the reference's "
                             f"{self.prepared_by})")
        return found

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError("; ".join(problems))
        for name in self.files:
            data = indexed.IndexedDataset(data_dir / name)
            say(f"{data.bin_path}: {len(data):,} documents, {data.total_tokens:,} tokens of {data.dtype}")

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        prefix = data_dir / self.corpus.valid
        return prefix.with_name(prefix.name + ".idx"), len(indexed.IndexedDataset(prefix))

    def verify(self, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]) -> list[str] | None:
        problems = self.problems(data_dir)
        if problems:
            return problems
        try:
            for done, name in enumerate(self.files, 1):
                indexed.IndexedDataset(data_dir / name).check_vocabulary(self.vocab_size)
                progress(done, len(self.files), 0)
        except TrainperfError as exc:
            return [str(exc)]
        return []


class _Rows(torch.utils.data.Dataset):
    """One epoch's samples as a map-style dataset (DataLoader workers cut them in parallel)."""

    def __init__(self, samples: indexed.Samples | indexed.Blend, first: int) -> None:
        self.samples, self.first = samples, first

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.samples.sample((self.first + i) % len(self.samples)))


class _StepRows:
    """This process's rows of each step's global batch, made as the steps come (the stream the references ask
    for holds max_steps x GBS samples: 1.2 M steps' worth, never listed whole)."""

    def __init__(self, steps: int, gbs: int, offset: int, rows: int) -> None:
        self.steps, self.gbs, self.offset, self.rows = steps, gbs, offset, rows

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            start = step * self.gbs + self.offset
            yield list(range(start, start + self.rows))


class C4Pipeline:
    """Training batches (this process's rows of each global batch) and the evaluation (the validation set's
    first `evaluated_samples` sequences, summed token losses), both in the order the reference's Megatron-Core
    `GPTDataset` gives for the run's seed (indexed.Samples): the training set asked for the schedule's samples
    (max_steps x GBS; several files blended in equal shares as its BlendedDataset does), the validation set for
    the recipe's `eval_dataset_size`, shuffled or in file order as the reference builds it. The training
    stream is read in order from its first sample, as Megatron's pretraining sampler reads it."""

    def __init__(self, recipe: LlamaRecipe, data_dir: Path, ctx: RuntimeContext, corpus: Corpus) -> None:
        self.recipe, self.ctx = recipe, ctx
        trains = [indexed.IndexedDataset(data_dir / name) for name in corpus.trains]
        valid = indexed.IndexedDataset(data_dir / corpus.valid)
        for data in (*trains, valid):
            data.check_integers()
        one_pass = (valid.total_tokens - 1) // recipe.seq_len
        if one_pass < recipe.evaluated_samples:  # one pass must hold an evaluation's sequences
            raise TrainperfError(f"{valid.bin_path}: {max(0, one_pass):,} sequences of {recipe.seq_len + 1:,} tokens, "
                                 f"the evaluation needs {recipe.evaluated_samples:,}")
        # Megatron-Core's `random_seed` is the run's seed (NeMo's and Megatron-Bridge's `seed`), one for every file.
        seed, vocab = ctx.seed, recipe.model.vocab_size
        size = recipe.train_dataset_size
        share = indexed.blended_share(size, len(trains))
        self.train = indexed.Blend([indexed.Samples(data, recipe.seq_len, seed, share, vocab_size=vocab)
                                    for data in trains], size)
        self.valid = indexed.Samples(valid, recipe.seq_len, seed, recipe.eval_dataset_size,
                                     shuffle=recipe.eval_shuffle, vocab_size=vocab)
        self.steps_per_epoch = self.train.per_epoch // recipe.global_batch_size
        if self.steps_per_epoch < 1:
            raise TrainperfError(f"{trains[-1].bin_path}: {self.train.per_epoch:,} sequences, fewer than one global "
                                 f"batch of {recipe.global_batch_size:,}")

    def train_batches(self, view: EpochView) -> Iterator[torch.Tensor]:
        recipe, ctx = self.recipe, self.ctx
        # By data shard: the processes of a tensor-parallel group read the same rows.
        per_rank = ctx.batch_share(recipe.global_batch_size)
        batches = _StepRows(self.steps_per_epoch, recipe.global_batch_size, ctx.data_rank * per_rank, per_rank)
        cuda = ctx.device.type == "cuda"
        first = view.epoch * self.steps_per_epoch * recipe.global_batch_size
        loader = torch.utils.data.DataLoader(_Rows(self.train, first), batch_sampler=batches,
                                             num_workers=recipe.num_workers, pin_memory=cuda,
                                             persistent_workers=False)
        for batch in loader:
            yield batch.to(ctx.device, non_blocking=cuda)

    def evaluate(self, forward: Callable[[Any], Any]) -> EvalPartial:
        recipe, ctx = self.recipe, self.ctx
        loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        tokens = torch.zeros((), dtype=torch.float64, device=ctx.device)
        for rows, counted in lockstep_rows(ctx, recipe.evaluated_samples, recipe.eval_batch_size):
            batch = torch.from_numpy(np.stack([self.valid.sample(i) for i in rows])).to(ctx.device)
            if counted:
                losses = forward(batch)
                loss += losses.double().sum()
                tokens += losses.numel()
            else:
                forward(batch)
        return EvalPartial(metric=log_perplexity, sums={"loss": loss, "tokens": tokens})


def lockstep_rows(ctx: RuntimeContext, total: int, size: int) -> Iterator[tuple[range, bool]]:
    """This process's evaluation rows in batches of `size`, and whether each counts. Every process runs the
    same number of forwards (sharded weights are gathered collectively): one with fewer rows repeats its
    last batch and does not count it."""
    shard = ctx.shard(total)
    rounds = math.ceil(math.ceil(total / ctx.data_world) / size)
    starts = list(range(shard.start, shard.stop, size))
    for r in range(rounds):
        counted = r < len(starts)
        start = starts[r] if counted else (starts[-1] if starts else 0)
        yield range(start, min(start + size, shard.stop if starts else start + 1)), counted


def log_perplexity(totals: dict[str, Any]) -> float:
    """The mean next-token cross-entropy over the evaluated tokens (nats): MLPerf's `log perplexity`."""
    return float(totals["loss"]) / max(1.0, float(totals["tokens"]))


def data_parts(recipe: LlamaRecipe, data_dir: Path, ctx: RuntimeContext, corpus: Corpus) -> DataParts:
    pipeline = C4Pipeline(recipe, data_dir, ctx, corpus)
    return DataParts(train_batches=pipeline.train_batches, steps_per_epoch=pipeline.steps_per_epoch,
                     train_samples=pipeline.steps_per_epoch * recipe.global_batch_size,
                     eval_samples=recipe.eval_samples, evaluate=pipeline.evaluate)
