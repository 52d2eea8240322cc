"""DLRM's data pipeline: the preprocessed Criteo splits as training batches (whole global batches in a new
order every epoch, each rank its contiguous share) and the evaluation (each rank its share of the test
split, padded where sharded tables need every rank to take the same steps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.common.ranking import prefetched, scored
from trainperf.workloads.dlrm import data as dlrm_data

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def to_batch(rows: np.ndarray, device: torch.device,
             sparse_device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, 40] int32 rows -> (dense log(x+1) float [B, 13], sparse int64 [B, 26], label float [B]); the
    sparse ids go where the embedding tables are (`sparse_device`, default `device`)."""
    host = torch.from_numpy(np.array(rows, dtype=np.int32))  # a private copy: the memory map is read-only
    t = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
    first = 1 + dlrm_data.N_DENSE
    sparse = t[:, first:] if sparse_device in (None, device) else host[:, first:].to(sparse_device)
    return torch.log1p(t[:, 1:1 + dlrm_data.N_DENSE].float()), sparse.long(), t[:, 0].float()


class CriteoPipeline:
    """Opened after run_start: the memory-mapped splits, this rank's shares of them."""

    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        if dlrm_data.preprocessed(data_dir) is None:
            raise TrainperfError(f"{data_dir}: no preprocessed Criteo data (trainperf prepare dlrm)")
        self.recipe, self.ctx, self.device = recipe, ctx, ctx.device
        self.train, self.test = dlrm_data.open_split(data_dir, "train"), dlrm_data.open_split(data_dir, "test")
        self.batch = recipe.global_batch_size
        self.steps = self.train.shape[0] // self.batch  # whole global batches only: static shapes
        if self.steps == 0:
            raise TrainperfError(f"{dlrm_data.output_file(data_dir, 'train')}: {self.train.shape[0]} samples, "
                                 f"fewer than one global batch of {self.batch}")
        self.mine = ctx.shard(self.batch)
        self.tables = torch.device("cpu") if recipe.embedding_device == "cpu" else ctx.device
        self.seed = ctx.stream_seed("batch order")
        n = self.test.shape[0]
        # Sharded tables look rows up with collectives: every rank must evaluate the same number of batches
        # of the same sizes. Its share is then padded to ceil(N / ranks) with the set's last row; the
        # padding's scores are dropped before they are gathered. (Replicated tables need no padding.)
        if recipe.embeddings == "torchrec":
            per = -(-n // ctx.world_size)
            first = min(ctx.rank * per, n)
            self.shard, self.padded = range(first, min(first + per, n)), per
        else:
            self.shard = ctx.shard(n)
            self.padded = len(self.shard)

    def train_batches(self, view: EpochView) -> Iterator[Batch]:
        """Whole global batches in a new order every epoch (the reference's --mlperf-bin-shuffle), the same
        order on every rank; each rank reads its contiguous share of each batch."""
        order = np.random.default_rng([self.seed, view.epoch]).permutation(self.steps)

        def read() -> Iterator[Batch]:
            for b in order:
                start = int(b) * self.batch
                yield to_batch(self.train[start + self.mine.start:start + self.mine.stop], self.device, self.tables)

        return prefetched(read()) if self.device.type == "cuda" else read()

    def eval_rows(self) -> Iterator[tuple[np.ndarray, int]]:
        """This rank's evaluation batches as (rows, how many of them are real: the rest is padding)."""
        size_max, test, shard = self.recipe.eval_batch_size, self.test, self.shard
        for offset in range(0, self.padded, size_max):
            size = min(size_max, self.padded - offset)
            real = max(0, min(size, len(shard) - offset))
            rows = test[shard.start + offset:shard.start + offset + real]
            if real < size:  # padding rows (sharded tables): the last real row of the set, repeated
                rows = np.concatenate([rows, np.repeat(test[test.shape[0] - 1:], size - real, axis=0)])
            yield rows, real

    def evaluate(self, forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
        batches = ((to_batch(rows, self.device, self.tables), real) for rows, real in self.eval_rows())
        return scored(batches, forward, self.device)

    def parts(self) -> DataParts:
        return DataParts(train_batches=self.train_batches, steps_per_epoch=self.steps,
                         train_samples=self.steps * self.batch, eval_samples=int(self.test.shape[0]),
                         evaluate=self.evaluate)
