"""What a training step at batch B will need in memory, estimated before it runs: the parameters with
their gradients and optimizer state, plus the activations autograd keeps per sample, measured on a
probe of two samples. A bench that would not fit is refused (or, for `predict`, made at a batch that
fits) instead of being killed by the kernel with no output."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from trainperf import devices
from trainperf.contract import ModelParts, Recipe, RuntimeContext, Workload, bare_model
from trainperf.errors import TrainperfError

PROBE = 2  # samples in the probe batch
MARGIN = 1.3  # allocator slack, temporaries of the backward, the batch itself
TOKENS_PER_SAMPLE = 32  # a token-budget batch's probe: two sentences of a typical WMT length


@dataclass(frozen=True)
class Estimate:
    fixed_bytes: int  # parameters, gradients, optimizer state
    per_sample_bytes: int  # activations saved for the backward, per sample
    available_bytes: int | None  # what the device has free, the model's own weights counted (None: unknown)

    def need(self, batch: int) -> int:
        return int((self.fixed_bytes + self.per_sample_bytes * batch) * MARGIN)

    def largest_batch(self) -> int | None:
        """The largest batch that fits with room to spare (a multiple of 8 from 8 up: free memory moves)."""
        if self.available_bytes is None or self.per_sample_bytes <= 0:
            return None
        raw = max(0, int((0.85 * self.available_bytes / MARGIN - self.fixed_bytes) // self.per_sample_bytes))
        return raw // 8 * 8 if raw >= 16 else raw


class BatchTooLarge(TrainperfError):
    """A bench batch that does not fit; `fits` is the largest that does (0: none)."""

    def __init__(self, message: str, fits: int) -> None:
        super().__init__(message)
        self.fits = fits


def available(device: torch.device) -> int | None:
    if device.type == "cuda":
        return devices.free_memory(device)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sparse_grad(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "sparse", False))


def _moments(optimizer: torch.optim.Optimizer) -> int:
    """Tensors of optimizer state per parameter: Adam's and LAMB's two moments, SGD's momentum or none."""
    defaults = optimizer.defaults
    if "betas" in defaults:
        return 2
    return 1 if defaults.get("momentum", 0) else 0


def _state_bytes(parts: ModelParts, device: torch.device) -> tuple[int, int]:
    """(bytes the weights, gradients and optimizer state will take, bytes of them already on `device`).
    A table with sparse gradients (DLRM's) holds only the rows a batch touches as gradient, and SGD
    without momentum no state: counting four copies of Criteo's 25 GiB of tables refused a step that fits."""
    sparse = {id(p) for m in parts.model.modules() if _sparse_grad(m) for p in m.parameters(recurse=False)}
    moments = _moments(parts.optimizer)
    total = resident = 0
    for p in parts.model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # a sharded DTensor: this process's shard
        size = local.numel() * local.element_size()
        total += size * (1 + (0 if id(p) in sparse else 1 + moments))
        if p.device == device:
            resident += size  # already allocated: the device's free memory no longer counts them
    return total, resident


def estimate(workload: Workload, recipe: Recipe, ctx: RuntimeContext, parts: ModelParts) -> Estimate:
    """Per unit of the recipe's global batch: a sample, or a token where the batch is a token budget
    (the Transformer's 8,192 per GPU), probed at two samples' worth."""
    tokens = recipe.BATCH_UNIT == "tokens"
    probe_units = PROBE * (TOKENS_PER_SAMPLE if tokens else 1)
    probe_recipe = dataclasses.replace(recipe, global_batch_size=probe_units * ctx.data_world)
    batch = workload.synthetic_batch(probe_recipe, ctx, parts.model)
    units = probe_units if tokens else max(1, workload.batch_samples(batch))
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    # Per sample is what the forward makes and autograd keeps, and the batch itself: not what existed before
    # it (weights, buffers, optimizer state: FBGEMM's fused Adagrad keeps its accumulator among the lookup's
    # saved tensors, which counted DLRM-DCNv2's tables' state as activations).
    made = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(batch)
            if isinstance(t, torch.Tensor) and t.device.type != "meta"}

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            made.update(t.untyped_storage().data_ptr() for t in pytree.tree_leaves(out)
                        if isinstance(t, torch.Tensor) and t.device.type != "meta")
            return out

    # The eager module: a compiled or wrapped one would compile (or sync) for a probe-sized batch.
    model = bare_model(parts.model)
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Made():
        loss = parts.loss_fn(model, batch)
    del loss, batch
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(size for ptr, size in seen.items() if ptr in made and ptr not in params)
    state, resident = _state_bytes(parts, ctx.device)
    free = available(ctx.device)
    return Estimate(state, saved // units, None if free is None else free + resident)


def check_fits(workload: Workload, recipe: Recipe, ctx: RuntimeContext, parts: ModelParts) -> Estimate:
    """Raise BatchTooLarge (one line, with the largest batch that fits) when a step at the recipe's
    batch would need more memory than the device has free."""
    found = estimate(workload, recipe, ctx, parts)
    per_device = recipe.global_batch_size // max(1, ctx.data_world)
    need = found.need(per_device)
    if found.available_bytes is not None and need > found.available_bytes:
        fits = found.largest_batch() or 0
        per_sample = found.per_sample_bytes
        activations = f"{per_sample / 2**20:.1f} MiB" if per_sample >= 2**20 else f"{per_sample / 2**10:.1f} KiB"
        unit = recipe.BATCH_UNIT.removesuffix("s")
        # The option every command that benches takes (bench, ablate, tune-batch, run): the global batch.
        raise BatchTooLarge(
            f"{workload.name}: a step at batch {per_device:,} needs about {need / 2**30:.1f} GiB "
            f"({found.fixed_bytes / 2**30:.2f} GiB of weights, gradients and optimizer state, "
            f"{activations} of activations per {unit}), {ctx.device} has "
            f"{found.available_bytes / 2**30:.1f} GiB free: "
            + (f"a batch of at most {fits:,} per device fits (--set global_batch_size="
               f"{fits * max(1, ctx.data_world)})" if fits else "no batch fits"), fits)
    return found
