"""dlrmv4's data pipeline, as the reference's streaming loop reads Yambda (`dlrm_v4/train/utils.py`
`streaming_train_eval_loop`, `datasets/yambda.py` `window_indices`): the training days one after another in time
order, each day's anchors in the store's (user-major) order, never shuffled; a global batch is GBS consecutive
anchors of a day, process r taking every world-th of them (the reference's round-robin `indices[r::world]` per
day), the day's last partial batch dropped. The evaluation is every anchor of the evaluation day, dealt out the
same way, padded so that every process takes as many steps (the sharded tables look rows up with collectives),
the AUC over all of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.common.ranking import prefetched, scored
from trainperf.workloads.dlrmv4 import data


class StreamingYambda:
    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        self.recipe, self.ctx, self.device = recipe, ctx, ctx.device
        self.store = data.Store(data_dir, recipe.history_length, recipe.scan_window, recipe.window_seconds,
                                recipe.max_seq_len, recipe.cross_specs, recipe.id_tables)
        counts = self.store.window_counts()
        if len(counts) <= recipe.eval_window or counts[recipe.eval_window] == 0:
            raise TrainperfError(f"{self.store.dir}: no anchors in the evaluation day {recipe.eval_window} (the store "
                                 f"spans {len(counts)} days)")
        self.windows = [w for w in range(min(recipe.train_windows, len(counts))) if w != recipe.eval_window]
        self.batch = recipe.global_batch_size
        self.steps_per_window = [int(counts[w]) // self.batch for w in self.windows]
        self.steps = sum(self.steps_per_window)
        if self.steps == 0:
            raise TrainperfError(f"{self.store.dir}: no training day holds one global batch of {self.batch:,} anchors")
        self.train_anchors = int(sum(counts[w] for w in self.windows))
        self.mine = ctx.batch_share(self.batch)
        # Each process every world-th anchor of the day, in batches of eval_batch_size (the reference's
        # `indices[r::world]`: the same batches, hence the same longest sequence dividing each one's attention),
        # padded so that every process takes as many steps; the reference drops the last partial batch instead.
        self.evaluated = self.store.window(recipe.eval_window)
        self.shard = self.evaluated[ctx.rank::ctx.world_size]
        self.padded = -(-len(self.evaluated) // ctx.world_size)

    def _batch(self, indices: np.ndarray) -> data.Batch:
        return self.store.batch(indices).to(self.device)

    def train_batches(self, view: EpochView) -> Iterator[data.Batch]:
        def read() -> Iterator[data.Batch]:
            rank, world = self.ctx.data_rank, self.ctx.data_world
            for window, steps in zip(self.windows, self.steps_per_window, strict=True):
                if steps == 0:
                    continue
                anchors = self.store.window(window)
                for step in range(steps):
                    chunk = anchors[step * self.batch:(step + 1) * self.batch]
                    yield self._batch(chunk[rank::world])

        return prefetched(read())

    def eval_batches(self) -> Iterator[tuple[data.Batch, int]]:
        size_max = self.recipe.eval_batch_size
        for offset in range(0, self.padded, size_max):
            size = min(size_max, self.padded - offset)
            real = max(0, min(size, len(self.shard) - offset))
            indices = self.shard[offset:offset + real]
            if real < size:  # the set's last anchor again: the same number of steps on every process
                indices = np.concatenate([indices, np.repeat(self.evaluated[-1:], size - real)])
            yield self._batch(indices), real

    def evaluate(self, forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
        return scored(self.eval_batches(), forward, self.device, labels_of=lambda batch: batch.labels)

    def parts(self) -> DataParts:
        # train_samples: every anchor of the training days (the reference's total_train_anchors, which the
        # closed rules check), though each day's last partial batch is not trained on.
        return DataParts(train_batches=self.train_batches, steps_per_epoch=self.steps,
                         train_samples=self.train_anchors, eval_samples=len(self.evaluated), evaluate=self.evaluate)
