"""The training step: forward, backward, optimizer and LR schedule, with gradient accumulation.

Kept out of the workloads so that speedups (precision, compile, graphs) and DDP wrap one place.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainperf.runtime import speedups
from trainperf.spec import ModelParts, Recipe


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
    """One optimizer update over a batch; returns the mean loss as a device tensor (no host sync).

    Mixed precision (autocast, and loss scaling for fp16) is applied here, for every workload alike.
    """

    def __init__(self, parts: ModelParts, steps_per_epoch: int, grad_accum_steps: int = 1,
                 recipe: Recipe | None = None, device: torch.device | None = None) -> None:
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.loss_fn = parts.loss_fn
        self.accum = grad_accum_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, parts.lr_schedule(steps_per_epoch)
        )
        device = device or torch.device("cpu")
        self.autocast = (lambda: speedups.autocast(recipe, device)) if recipe else contextlib.nullcontext
        self.scaler = speedups.grad_scaler(recipe, device) if recipe else None

    def __call__(self, batch: Any) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = split_batch(batch, self.accum) if self.accum > 1 else [batch]
        total = None
        for micro in micro_batches:
            with self.autocast():
                loss = self.loss_fn(self.model, micro)
            scaled = loss.float() / len(micro_batches)
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total = loss.detach().float() if total is None else total + loss.detach().float()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        return total / len(micro_batches)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
