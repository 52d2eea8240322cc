"""The training step: forward, backward, optimizer and LR schedule, with gradient accumulation.

Kept out of the workloads so that speedups (precision, compile, graphs) and DDP wrap one place.
"""

from __future__ import annotations

from typing import Any

import torch

from trainperf.spec import ModelParts


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split a batch (tensor, or tuple/list/dict of tensors) into `parts` micro-batches."""
    if isinstance(batch, torch.Tensor):
        return list(torch.chunk(batch, parts))
    if isinstance(batch, (tuple, list)):
        columns = [split_batch(item, parts) for item in batch]
        return [type(batch)(col[i] for col in columns) for i in range(len(columns[0]))]
    if isinstance(batch, dict):
        columns = {key: split_batch(value, parts) for key, value in batch.items()}
        count = len(next(iter(columns.values())))
        return [{key: col[i] for key, col in columns.items()} for i in range(count)]
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")


class TrainStep:
    """One optimizer update over a batch; returns the mean loss as a device tensor (no host sync)."""

    def __init__(self, parts: ModelParts, steps_per_epoch: int, grad_accum_steps: int = 1) -> None:
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.loss_fn = parts.loss_fn
        self.accum = grad_accum_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, parts.lr_schedule(steps_per_epoch)
        )

    def __call__(self, batch: Any) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = split_batch(batch, self.accum) if self.accum > 1 else [batch]
        total = None
        for micro in micro_batches:
            loss = self.loss_fn(self.model, micro)
            (loss / len(micro_batches)).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.optimizer.step()
        self.scheduler.step()
        return total / len(micro_batches)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
