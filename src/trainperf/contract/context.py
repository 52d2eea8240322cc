"""The runtime context a workload is given: device, placement, seed, and the collectives it may use."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainperf import devices
from trainperf.errors import TrainperfError

if TYPE_CHECKING:
    from trainperf.contract.parts import EvalPartial


@dataclass
class RuntimeContext:
    """Device, process placement and seed of one training process (no module-level state).

    Randomness is explicit: `generator(stream)` gives a torch.Generator seeded from the run's seed
    and a stream name (the same on every process unless `per_rank`), so workloads never read the
    seed back from torch's global generator.
    """

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    seed: int = 0
    # Whether this process joined a process group (a launcher started it), even a group of one.
    grouped: bool = False
    # Consecutive processes that hold one data shard between them (a tensor-parallel group splits each
    # batch's computation, not its rows): the data is sharded over `data_world` = world_size / replicas.
    replicas: int = 1

    @property
    def data_rank(self) -> int:
        """This process's share of the data: the same for the processes of one replica group."""
        return self.rank // self.replicas

    @property
    def data_world(self) -> int:
        return max(1, self.world_size // self.replicas)

    @property
    def data_leader(self) -> bool:
        """The process of its replica group that speaks for it (its evaluation totals count once)."""
        return self.rank % self.replicas == 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Collectives and DDP are in use: several processes, or a launched group of one."""
        return ((self.world_size > 1 or self.grouped) and torch.distributed.is_available()
                and torch.distributed.is_initialized())

    def synchronize(self) -> None:
        """Wait for queued device work, so that a clock read after it measures finished work."""
        devices.synchronize(self.device)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def stream_seed(self, stream: str, per_rank: bool = False) -> int:
        """A 63-bit seed for one named random stream of this run (stable across Python processes)."""
        # Per data shard: the processes of a replica group must draw the same (their rows are the same).
        key = f"{self.seed}/{stream}" + (f"/rank{self.data_rank}" if per_rank else "")
        return (self.seed * 0x9E3779B1 + zlib.crc32(key.encode())) % (2**63)

    def generator(self, stream: str, per_rank: bool = False, device: torch.device | str | None = None
                  ) -> torch.Generator:
        gen = torch.Generator(device=device if device is not None else self.device)
        gen.manual_seed(self.stream_seed(stream, per_rank))
        return gen

    def batch_share(self, global_batch: int, accum: int = 1) -> int:
        """This process's rows of a global batch per accumulation step: the batch dealt out evenly over the
        data-parallel processes (a tensor-parallel group shares its rows), refused when it does not divide."""
        return batch_share(global_batch, self.data_world * accum, "data-parallel processes"
                           + (f" x {accum} accumulation steps" if accum > 1 else ""))

    def shard(self, n: int) -> range:
        """This rank's contiguous share of n items: every item exactly once across the data shards (a
        replica group shares one), no padding."""
        return range(self.data_rank * n // self.data_world, (self.data_rank + 1) * n // self.data_world)

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

    def gather_objects(self, items: list[Any]) -> list[Any] | None:
        """Python objects of every rank, concatenated in rank order on rank 0 (None elsewhere)."""
        if not self.distributed:
            return list(items)
        received: list[Any] | None = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(list(items), received, dst=0)
        if not self.is_main:
            return None
        return [item for part in received for item in part]

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value, on every rank."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def combine(self, partial: EvalPartial) -> dict[str, Any] | None:
        """Merge every rank's share of an evaluation: sums added and tensors concatenated (on every
        rank), objects concatenated on rank 0. Returns the merged dict on rank 0, None elsewhere."""
        # The processes of a replica group evaluated the same share: one of them speaks for it.
        own = self.data_leader
        out: dict[str, Any] = {key: self.all_reduce_sum(value if own else torch.zeros_like(value))
                               for key, value in partial.sums.items()}
        out.update({key: self.all_gather_cat(value if own else value[:0]) for key, value in partial.gathers.items()})
        for key in sorted(partial.objects):
            out[key] = self.gather_objects(partial.objects[key] if own else [])
        return out if self.is_main else None

    @classmethod
    def create(cls, device: str | None = None, seed: int = 0) -> RuntimeContext:
        """A single-process context on `device` ('cpu', 'cuda', 'cuda:1'; a bare 'cuda' is the launcher's
        LOCAL_RANK or the current device), or the best available."""
        dev = devices.resolve(device)
        devices.activate(dev)
        return cls(device=dev, seed=seed)


def batch_share(global_batch: int, processes: int, what: str = "processes", where: str = "") -> int:
    """The rows of a global batch each of `processes` takes: the one check that a batch divides (a run's
    processes, a launch's `--nproc`, a study's or a script's process counts). `where` names the option."""
    if processes < 1 or global_batch % processes:
        raise TrainperfError(f"{where + ': ' if where else ''}global_batch_size {global_batch} is not divisible by "
                             f"{processes} {what}")
    return global_batch // processes


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's wrapper (the DDP wrapper, with several processes)."""
    return getattr(model, "_orig_mod", model)


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module a workload built, under the runtime's wrappers (torch.compile's, then DDP's)."""
    model = uncompiled(model)
    return getattr(model, "module", model)
