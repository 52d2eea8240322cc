"""The runtime context passed down to the harness and workloads (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainperf.errors import TrainperfError


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

    def barrier(self) -> None:
        if self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()

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
