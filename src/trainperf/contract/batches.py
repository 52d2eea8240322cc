"""Batches: how they split into micro-batches and how many samples they hold; schedules in epochs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainperf.errors import TrainperfError


def per_epoch_schedule(workload: str, make: Callable[[int], Callable[[int], float]]
                       ) -> Callable[[int | None], Callable[[int], float]]:
    """A ModelParts.lr_schedule for a schedule stated in epochs: make(steps_per_epoch) -> f(step). Data
    of unknown length (steps_per_epoch None) cannot drive it: one line naming the workload."""

    def schedule(steps_per_epoch: int | None) -> Callable[[int], float]:
        if not steps_per_epoch:
            raise TrainperfError(f"{workload}: the LR schedule is in epochs and needs the steps per epoch")
        return make(steps_per_epoch)

    return schedule


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split a batch into `parts` micro-batches (fewer if it is smaller). Conventions: a tensor splits
    along dim 0; a tuple or dict is a set of columns, each split alike; a list is a list of samples
    (images of different sizes, say), split into consecutive runs."""
    if isinstance(batch, torch.Tensor):
        return list(torch.chunk(batch, parts))
    if isinstance(batch, list):
        size = -(-len(batch) // parts) if batch else 1
        return [batch[i:i + size] for i in range(0, len(batch), size)] or [batch]
    if isinstance(batch, tuple):
        columns = [split_batch(item, parts) for item in batch]
        count = min(len(col) for col in columns)
        return [type(batch)(col[i] for col in columns) for i in range(count)]
    if isinstance(batch, dict):
        columns = {key: split_batch(value, parts) for key, value in batch.items()}
        count = min(len(col) for col in columns.values())
        return [{key: col[i] for key, col in columns.items()} for i in range(count)]
    raise TrainperfError(f"cannot split a batch of type {type(batch).__name__} into micro-batches "
                         "(the workload must define split_batch)")


def count_samples(batch: Any) -> int:
    """Samples in a batch, by the same conventions: a tensor's first dimension, a list's length, the
    first column of a tuple or dict."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, list):
        return len(batch)
    if isinstance(batch, tuple) and batch:
        return count_samples(batch[0])
    if isinstance(batch, dict) and batch:
        return count_samples(next(iter(batch.values())))
    raise TrainperfError(f"cannot count the samples of a batch of type {type(batch).__name__} "
                         "(the workload must define batch_samples)")
