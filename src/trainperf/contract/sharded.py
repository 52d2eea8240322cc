"""What the FSDP2 engine (`FullyShard`) and the memory plan (`trainperf plan`) read of a model: the model a
fully sharded workload builds subclasses `ShardedModel`, and a mixture-of-experts layer `ExpertLayer`. Every
method the engine calls is declared here with what it must do; the defaults say in one line what a model
without it cannot do."""

from __future__ import annotations

from typing import Any

from torch import nn

from trainperf.errors import TrainperfError


class ShardedModel(nn.Module):
    """A model FSDP2 shards block by block. `blocks` (an nn.ModuleList, set by the subclass) are its repeated
    blocks: each checkpointed, compiled and sharded as one unit, the rest with the root."""

    blocks: nn.ModuleList

    def shard_units(self) -> list[nn.Module]:
        """Modules outside `blocks` sharded as units of their own, so that the root does not gather them with
        its embeddings (DeepSeek-V3's multi-token prediction block, FLUX.1's input layers). None by default."""
        return []

    def init_weights(self) -> None:
        """Initialise every parameter and buffer in place, on whatever shards this process holds (a model built
        on the meta device is given storage by the engine, then this)."""
        raise TrainperfError(f"{type(self).__name__}: built on the meta device, but it has no init_weights() to "
                             "initialise its shards")

    def tensor_parallel_plan(self) -> dict[str, Any]:
        """torch's `parallelize_module` plan (module path -> ParallelStyle) splitting the blocks' projections over
        the tensor-parallel processes, with sequence parallelism around them (tp > 1)."""
        raise TrainperfError(f"{type(self).__name__}: has no tensor-parallel plan; use tp=1")

    def activation_bytes(self, seq_len: int, tp: int, checkpointing: str) -> int:
        """Bytes one sequence's activations keep for the backward, per process, at tensor parallelism `tp` and
        activation checkpointing `checkpointing` (the memory plan)."""
        raise TrainperfError(f"{type(self).__name__}: has no activation_bytes(seq_len, tp, checkpointing) for a "
                             "memory plan")


class ExpertLayer(nn.Module):
    """A mixture-of-experts layer that expert parallelism splits (ep > 1)."""

    experts: nn.Module  # the routed experts' weights: sharded over the processes that hold the same experts

    def shard_experts(self, group: Any, rank: int, size: int) -> None:
        """Keep only the experts of place `rank` of `size` in the process group `group` (its expert-parallel
        group) and exchange tokens over it from now on."""
        raise NotImplementedError
