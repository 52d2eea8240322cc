"""How a workload's model is spread over the launched processes: one capability of the contract.

A workload's `build` says it in the ModelParts it returns (`parallel`), as one of these records; the
runtime's engine for the record (trainperf/runtime/parallel.py) applies it once, after the speedups
that change the module (channels-last, float8). The workload never touches the process group.

- `DataParallel` (the default): the whole model on every process, gradients averaged by DDP;
- `ShardedTables`: embedding tables sharded by TorchRec's DistributedModelParallel (DLRM), the dense
  layers data-parallel inside it;
- `FullyShard`: FSDP2 (`fully_shard`) over a device mesh of the processes: parameters, gradients and
  optimizer state sharded over its data-parallel dimension, the blocks tensor- and sequence-parallel
  over its `tp` dimension, activation checkpointing and per-block compilation as asked (the LLMs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from trainperf.errors import TrainperfError


@dataclass(frozen=True)
class Parallelism:
    """A way of distributing a model; `engine` names the runtime's implementation of it."""

    engine: ClassVar[str] = ""

    def describe(self) -> dict[str, Any]:
        """What a result records of how the model was distributed."""
        return {"engine": self.engine, **asdict(self)}


@dataclass(frozen=True)
class DataParallel(Parallelism):
    engine: ClassVar[str] = "ddp"


@dataclass(frozen=True)
class ShardedTables(Parallelism):
    engine: ClassVar[str] = "torchrec"


CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True)
class FullyShard(Parallelism):
    """FSDP2 over the data-parallel processes, `tp` processes of each block's tensor parallelism.

    The model must name its repeated blocks (`blocks`: a ModuleList) and, for tp > 1, give its
    tensor-parallel plan (`tensor_parallel_plan()`: what torch.distributed.tensor.parallel's
    parallelize_module takes for the whole model, the blocks' modules by their full names). For ep > 1
    its mixture-of-experts layers offer `shard_experts(group, rank, size)` (keep this process's experts,
    exchange tokens over `group`) and hold their experts as `experts`."""

    engine: ClassVar[str] = "fsdp"
    tp: int = 1
    # Activation checkpointing of the blocks: none, selective (every other block, as torchtitan's
    # layer-selective option), full (every block).
    checkpointing: str = "none"
    # Free each block's gathered parameters after its forward (gathered again for its backward); the last
    # block keeps them either way (its backward comes at once).
    reshard_after_forward: bool = True
    # Expert parallelism: each MoE layer's experts split over `ep` adjacent processes, which exchange their
    # tokens; the experts then fully sharded over the processes holding the same ones.
    ep: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise TrainperfError(f"tensor parallelism tp={self.tp}: expected 1 or more")
        if self.ep < 1:
            raise TrainperfError(f"expert parallelism ep={self.ep}: expected 1 or more")
        if self.ep > 1 and self.tp > 1:
            raise TrainperfError(f"expert parallelism ep={self.ep} with tensor parallelism tp={self.tp}: not built; "
                                 "use one of them")
        if self.checkpointing not in CHECKPOINTING:
            raise TrainperfError(f"activation checkpointing {self.checkpointing!r}: expected one of "
                                 + ", ".join(CHECKPOINTING))
