"""The training step: forward, backward, clipping, optimizer, LR schedule and the after-step hook,
with gradient accumulation over micro-batches.

Kept out of the workloads so that speedups (precision, compile, graphs) and DDP wrap one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from trainperf.contract import ModelParts, Recipe, RuntimeContext, count_samples, split_batch, uncompiled
from trainperf.runtime import speedups


class TrainStep:
    """One optimizer update over a batch; returns the batch's mean loss as a device tensor (no host
    sync).

    The batch is split into `recipe.grad_accum_steps` micro-batches by the workload's `split`; each
    micro-batch's loss is weighted by its share of the batch's samples (`count`), so uneven splits
    weigh correctly. With `parts.loss_units` the loss is a sum over units (tokens, say) and is divided
    by the units of the whole global batch: every micro-batch and every process (one all-reduce of a
    scalar, no host sync). Gradients are clipped to `recipe.max_grad_norm` after fp16 unscaling.
    Mixed precision is applied here, for every workload alike.
    """

    def __init__(self, parts: ModelParts, steps_per_epoch: int | None, recipe: Recipe | None = None,
                 device: torch.device | None = None, *, ctx: RuntimeContext | None = None,
                 split: Callable[[Any, int], list[Any]] = split_batch,
                 count: Callable[[Any], int] = count_samples) -> None:
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.loss_fn = parts.loss_fn
        self.loss_units = parts.loss_units
        self.after_step = parts.after_step
        self.accum = recipe.grad_accum_steps if recipe else 1
        self.max_grad_norm = recipe.max_grad_norm if recipe else 0.0
        self.split, self.count = split, count
        self.ctx = ctx
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, parts.lr_schedule(steps_per_epoch))
        device = device or (ctx.device if ctx else torch.device("cpu"))
        self.device = device
        self.autocast = (lambda: speedups.autocast(recipe, device)) if recipe else contextlib.nullcontext
        self.scaler = speedups.grad_scaler(recipe, device) if recipe else None
        inner = uncompiled(self.model)
        # Under DDP, gradients are all-reduced once per step, on the last micro-batch only.
        self._no_sync = inner.no_sync if isinstance(inner, torch.nn.parallel.DistributedDataParallel) else None
        self._params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.grad_norm = parts.grad_norm
        self.graphed = bool(recipe and recipe.cuda_graphs)
        self.steps = 0

    def _weights(self, micro_batches: list[Any]) -> list[torch.Tensor | float]:
        if self.loss_units is None:
            counts = [self.count(m) for m in micro_batches]
            total = max(sum(counts), 1)
            return [c / total for c in counts]
        units = torch.stack([torch.as_tensor(self.loss_units(m), dtype=torch.float32, device=self.device)
                             for m in micro_batches]).sum()
        world = 1
        if self.ctx is not None and self.ctx.distributed:
            # DDP averages gradients over processes: scaling by world / global units makes the result
            # the gradient of (sum of losses) / (units of the global batch).
            units = self.ctx.all_reduce_sum(units) / self.ctx.replicas  # a replica group's units count once
            world = self.ctx.data_world
        scale = world / units.clamp(min=1.0)
        return [scale] * len(micro_batches)

    def __call__(self, batch: Any) -> torch.Tensor:
        if self.graphed:
            # CUDA graph trees reuse a graph's output memory at its next replay: a new step says so, which a
            # model graphed in pieces (FSDP's blocks, TorchRec's dense modules) cannot leave them to infer.
            torch.compiler.cudagraph_mark_step_begin()
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = self.split(batch, self.accum) if self.accum > 1 else [batch]
        weights = self._weights(micro_batches)
        total: torch.Tensor | None = None
        last = len(micro_batches) - 1
        for i, (micro, weight) in enumerate(zip(micro_batches, weights, strict=True)):
            sync = self._no_sync() if (self._no_sync is not None and i < last) else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    loss = self.loss_fn(self.model, micro)
                scaled = loss.float() * weight
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            part = scaled.detach()
            total = part if total is None else total + part
        if self.max_grad_norm > 0:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if self.grad_norm is None:
                torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
            else:
                self._clip(self.grad_norm(self._params))
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.graphed:
            # A graphed backward hands its output buffers to .grad as they are: dropped now, an evaluation
            # before the next step does not find the training graphs' memory still in use.
            self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        if self.after_step is not None:
            self.after_step(self.steps)
        assert total is not None
        return total

    def _clip(self, norm: torch.Tensor) -> None:
        """Scale every gradient (each process's shard of it) by min(1, max_norm / norm), as
        clip_grad_norm_ does, from a norm the engine computed: no host read."""
        coef = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for p in self._params if p.grad is not None]
        if local:
            torch._foreach_mul_(local, coef.to(local[0].device))

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
