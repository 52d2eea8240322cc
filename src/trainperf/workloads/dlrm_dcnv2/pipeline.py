"""DLRM-DCNv2's data pipeline: the memory-mapped days as training batches (whole global batches in the files'
order, as the reference reads its pre-shuffled days; later epochs of a mini in a new order of batches; each
process its contiguous share of each) and the evaluation (each process its share of the evaluation half,
padded so that every process takes the same number of steps: the sharded tables look rows up with collectives)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.common.ranking import prefetched, scored
from trainperf.workloads.dlrm_dcnv2 import data

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def to_batch(rows: tuple[np.ndarray, np.ndarray, np.ndarray], device: torch.device) -> Batch:
    """(dense, ids, labels) from the reader, on `device` (through pinned memory to a GPU)."""
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in rows]
    if device.type == "cuda":
        return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)  # type: ignore[return-value]
    return tuple(t.to(device) for t in tensors)  # type: ignore[return-value]


class MultiHotPipeline:
    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        days = data.days_present(data_dir)
        if days < 2:
            raise TrainperfError(f"{data.labels_file(data_dir, days)}: missing (the training days and one "
                                 "evaluation day are needed)")
        self.recipe, self.ctx, self.device = recipe, ctx, ctx.device
        hotness, tables = recipe.multi_hot_sizes, recipe.table_sizes
        self.train = data.open_split(data_dir, "train", hotness, tables, days - 1)
        self.eval = data.open_split(data_dir, "eval", hotness, tables, days - 1)
        self.batch = recipe.global_batch_size
        self.steps = self.train.total // self.batch  # whole global batches only: static shapes
        if self.steps == 0:
            raise TrainperfError(f"{data_dir}: {self.train.total:,} training rows, fewer than one global batch of "
                                 f"{self.batch:,}")
        self.mine = ctx.shard(self.batch)
        self.seed = ctx.stream_seed("batch order")
        per = -(-self.eval.total // ctx.world_size)
        first = min(ctx.rank * per, self.eval.total)
        self.shard, self.padded = range(first, min(first + per, self.eval.total)), per

    def train_batches(self, view: EpochView) -> Iterator[Batch]:
        order = np.arange(self.steps) if view.epoch == 0 else \
            np.random.default_rng([self.seed, view.epoch]).permutation(self.steps)

        def read() -> Iterator[Batch]:
            for b in order:
                start = int(b) * self.batch
                yield to_batch(self.train.read(start + self.mine.start, start + self.mine.stop), self.device)

        return prefetched(read()) if self.device.type == "cuda" else read()

    def eval_batches(self) -> Iterator[tuple[Batch, int]]:
        """This process's evaluation batches and how many of their rows are real (the rest: the set's last row
        again, so that every process takes as many steps)."""
        size_max, shard = self.recipe.eval_batch_size, self.shard
        for offset in range(0, self.padded, size_max):
            size = min(size_max, self.padded - offset)
            real = max(0, min(size, len(shard) - offset))
            pieces = [self.eval.read(shard.start + offset, shard.start + offset + real)] if real else []
            if real < size:
                last = self.eval.read(self.eval.total - 1, self.eval.total)
                pieces.append(tuple(np.repeat(a, size - real, axis=0) for a in last))
            rows = tuple(np.concatenate(columns) for columns in zip(*pieces, strict=True))
            yield to_batch(rows, self.device), real  # type: ignore[arg-type]

    def evaluate(self, forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
        return scored(self.eval_batches(), forward, self.device)

    def parts(self) -> DataParts:
        return DataParts(train_batches=self.train_batches, steps_per_epoch=self.steps,
                         train_samples=self.steps * self.batch, eval_samples=self.eval.total, evaluate=self.evaluate)
