"""The runtime context passed down to the harness and workloads (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainperf.errors import TrainperfError
from trainperf.spec import EvalPartial


@dataclass
class RuntimeContext:
    """Device and process placement of one training process."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def synchronize(self) -> None:
        """Wait for queued device work, so that a clock read after it measures finished work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def shard(self, n: int) -> range:
        """This rank's contiguous share of n items: every item exactly once across ranks, no padding."""
        return range(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            tensor = tensor.clone()
            torch.distributed.all_reduce(tensor)
        return tensor

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a tensor across ranks in rank order (shards may differ in length)."""
        if not self.distributed:
            return tensor
        size = torch.tensor([tensor.shape[0]], device=tensor.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        torch.distributed.all_gather(sizes, size)
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, padded)
        return torch.cat([part[: int(s.item())] for part, s in zip(parts, sizes, strict=True)])

    def combine(self, partial: EvalPartial) -> dict[str, torch.Tensor]:
        """Merge every rank's share of an evaluation: sums added, gathered tensors concatenated."""
        out = {key: self.all_reduce_sum(value) for key, value in partial.sums.items()}
        out.update({key: self.all_gather_cat(value) for key, value in partial.gathers.items()})
        return out

    @classmethod
    def create(cls, device: str | None = None) -> RuntimeContext:
        """A single-process context on `device` ('cpu', 'cuda', 'cuda:1'), or the best available."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise TrainperfError(f"--device {device!r}: expected cpu, cuda or cuda:N") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise TrainperfError(f"--device {device!r}: no CUDA GPU is visible on this machine")
        if dev.type not in ("cpu", "cuda"):
            raise TrainperfError(f"--device {device!r}: only cpu and cuda devices are supported")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return cls(device=dev)
