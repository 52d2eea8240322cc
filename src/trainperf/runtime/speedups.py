"""Speedups, applied in one place. The harness (and `bench`) call these on what a workload built.

Switches live in the recipe (so `--set`, the CLI flags, `bench`, `scale` and `ablate` all reach them
and every result records them): precision, channels_last, compile, cuda_graphs, fused_optimizer.
A workload declares which apply to it; asking for one it does not support, or one the device
cannot run, is a clear error, never a silent no-op.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from trainperf.errors import TrainperfError
from trainperf.spec import ModelParts, Recipe, Workload

SWITCHES = ("precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer", "async_eval")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def enabled(recipe: Recipe) -> dict[str, Any]:
    """The switches as recorded in results and logs."""
    return {name: getattr(recipe, name) for name in SWITCHES}


def check_supported(workload: Workload, recipe: Recipe, device: torch.device, world_size: int = 1) -> None:
    for name in SWITCHES:
        value = getattr(recipe, name)
        on = value != "fp32" if name == "precision" else bool(value)
        if on and name not in workload.speedups:
            raise TrainperfError(f"{name}={value}: not supported by {workload.name}")
    if recipe.cuda_graphs and device.type != "cuda":
        raise TrainperfError("cuda_graphs=true (--cuda-graphs): CUDA Graphs need a CUDA GPU; this run is on "
                             f"{device.type}")
    if recipe.async_eval and world_size > 1:
        # Its reductions would run on a second thread beside DDP's: not supported (yet).
        raise TrainperfError("async_eval=true (--async-eval): supported on a single process only")


def apply(workload: Workload, recipe: Recipe, parts: ModelParts, device: torch.device,
          world_size: int = 1) -> ModelParts:
    """Memory layout now; compilation is applied by `compile_model` after data parallelism wraps."""
    check_supported(workload, recipe, device, world_size)
    if recipe.channels_last:
        # Converting the weights is enough: convolutions then run NHWC, and their outputs stay NHWC.
        parts.model = parts.model.to(memory_format=torch.channels_last)
    return parts


def compile_model(recipe: Recipe, parts: ModelParts) -> ModelParts:
    """torch.compile; with cuda_graphs, in the mode that captures CUDA Graphs and replays them
    ("reduce-overhead": PyTorch's supported capture, static shapes handled by re-capture)."""
    if recipe.cuda_graphs:
        parts.model = torch.compile(parts.model, mode="reduce-overhead")
    elif recipe.compile:
        parts.model = torch.compile(parts.model)
    return parts


def autocast(recipe: Recipe, device: torch.device) -> contextlib.AbstractContextManager:
    if recipe.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[recipe.precision])


def grad_scaler(recipe: Recipe, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling against gradient underflow; bf16 has fp32's range and does not."""
    if recipe.precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


def warm_up(parts: ModelParts, make_step: Callable[[], Callable[[Any], torch.Tensor]], batch: Any,
            steps: int) -> None:
    """Run `steps` training steps on a synthetic batch (compilation, autotuning, graph capture) and
    restore the model and optimizer state afterwards, so no synthetic data influences training."""
    model_state = copy.deepcopy(parts.model.state_dict())
    optim_state = copy.deepcopy(parts.optimizer.state_dict())
    step = make_step()
    for _ in range(steps):
        step(batch)
    inner = getattr(parts.model, "_orig_mod", parts.model)
    if not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        # The harness evaluates this model in eval mode, without gradients or autocast, at other
        # batch sizes: that graph is compiled here too (at two sizes, so that its batch dimension is
        # dynamic) and no compilation lands in the timed region. (Under DDP the harness evaluates
        # the bare module, uncompiled.)
        from trainperf.runtime.step import split_batch

        parts.model.eval()
        with torch.no_grad():
            for sub in (batch, split_batch(batch, 2)[0]):
                parts.loss_fn(parts.model, sub)
        parts.model.train()
    parts.model.load_state_dict(model_state)
    parts.optimizer.load_state_dict(optim_state)
    parts.optimizer.zero_grad(set_to_none=True)
