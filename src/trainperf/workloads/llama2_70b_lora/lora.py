"""LoRA adapters on the shared Llama (workloads/common/llm/model.py), as MLPerf's reference places them:
rank 16, alpha 32, dropout 0.1 on the fused q|k|v projection and on the output projection of every block
(mlcommons/training `llama2_70b_lora`: `run_and_time.sh` passes `--lora_target_modules qkv_proj,o_proj`
to PEFT 0.8.2 over a checkpoint whose q, k and v projections are fused).

Written here rather than taken from PEFT: PEFT finds its targets by module name and wraps nn.Linear
layers; this Llama keeps q, k and v as three projections (tensor parallelism splits each by heads), so a
LoRA over the fused projection is one adapter whose output is split between them, which PEFT cannot
express. The adapter is PEFT's LoRA layer: A initialised as PEFT does (Kaiming-uniform, a = sqrt(5)), B
zero (the model starts as the base), the update B A dropout(x) scaled by alpha / rank. B is kept as one
matrix per output it feeds (q, k and v: stacked, they are PEFT's fused B), so that tensor parallelism can
split each by heads as it splits the projection beside it.

Under tensor parallelism (`LowRank.tensor_parallel_plan`, Megatron's layout for LoRA as NeMo lays it out):
beside a column-parallel projection (q|k|v) A is replicated and reads the replicated input, each B is split
by output columns like its projection; beside a row-parallel one (the output projection) A is split by input
columns like it, its rank-16 output reduce-scattered along the sequence, and B replicated on the sequence
shard. The only collective an adapter adds is that reduce-scatter of rank-wide rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle


class LowRank(nn.Module):
    adapter = True  # Llama.init_weights initialises it after a meta-device build

    def __init__(self, in_features: int, outputs: Sequence[int], rank: int, alpha: float, dropout: float,
                 beside: str = "column") -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.lora_a = nn.Linear(in_features, rank, bias=False)
        self.lora_b = nn.ModuleList(nn.Linear(rank, n, bias=False) for n in outputs)
        self.scale = alpha / rank
        self.beside = beside  # the kind of projection it adapts: "column"- or "row"-parallel under TP
        for linear in (self.lora_a, *self.lora_b):
            linear.float8 = False  # trained, rank-wide: float8 would cost accuracy and save nothing
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A drawn whole and each process keeping its shard: the same adapters however they are sharded
        (every process draws the same numbers from the run's seed)."""
        weight = self.lora_a.weight
        if hasattr(weight, "to_local"):
            from torch.distributed.tensor import distribute_tensor

            full = torch.empty(weight.shape, dtype=weight.dtype, device=weight.to_local().device)
            nn.init.kaiming_uniform_(full, a=math.sqrt(5))
            weight.to_local().copy_(distribute_tensor(full, weight.device_mesh, weight.placements,
                                                      src_data_rank=None).to_local())
        else:
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        for linear in self.lora_b:
            nn.init.zeros_(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The frozen base may compute in bf16 while the adapters stay fp32 (as PEFT does, in their dtype).
        low = self.lora_a(self.dropout(x.to(self.lora_a.weight.dtype)))
        updates = [b(low) for b in self.lora_b]
        update = updates[0] if len(updates) == 1 else torch.cat(updates, dim=-1)
        return (update * self.scale).to(x.dtype)

    def tensor_parallel_plan(self, prefix: str) -> dict[str, Any]:
        """parallelize_module's plan for this adapter at `prefix` (its path in the model)."""
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
        )

        if self.beside == "column":
            # The input arrives replicated (the attention's prepared input): A on all of it in each process
            # (1 % of the projection's work at 70B and TP 8, no collective), each B split like its q, k or v.
            plan: dict[str, Any] = {prefix + ".lora_a": Replicated()}
            plan.update({f"{prefix}.lora_b.{i}": ColwiseParallel() for i in range(len(self.lora_b))})
            return plan
        # The input is this process's heads of the attention's output, seen as such (dropout then draws its
        # part of one mask, where DTensor's random generator is supported); A split by input columns; B on
        # this process's sequence shard, where the output projection's result is.
        return {prefix: PrepareModuleInput(input_layouts=(Shard(-1),), desired_input_layouts=(Shard(-1),)),
                prefix + ".lora_a": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1),
                                                    use_local_output=False),
                prefix + ".lora_b.0": SequenceParallel(use_local_output=True)}


class Replicated(ParallelStyle):
    """The module's parameters replicated over the tensor-parallel processes, its input taken in the layout
    it comes in (torch has no such style; torchtitan's NoParallel is the same idea)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate(_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for name, param in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(name, nn.Parameter(
                    DTensor.from_local(param, mesh, [Replicate()], run_check=False),
                    requires_grad=param.requires_grad))

        return distribute_module(module, device_mesh, replicate)


def add_adapters(model: nn.Module, rank: int, alpha: float, dropout: float) -> list[nn.Parameter]:
    """Freeze every parameter of `model`, give each block's attention its two adapters (created where the
    model's parameters live, in fp32) and return the adapters' parameters: the only ones trained."""
    for p in model.parameters():
        p.requires_grad_(False)
    trained = []
    for block in model.blocks:
        attention = block.attention
        device = attention.wq.weight.device
        dim = attention.wq.in_features
        outputs = (attention.wq.out_features, attention.wk.out_features, attention.wv.out_features)
        with torch.device(device):
            attention.qkv_adapter = LowRank(dim, outputs, rank, alpha, dropout, beside="column")
            attention.o_adapter = LowRank(attention.wo.in_features, (attention.wo.out_features,), rank, alpha,
                                          dropout, beside="row")
        trained += [*attention.qkv_adapter.parameters(), *attention.o_adapter.parameters()]
    return trained


def adapter_parameters(layers: int, dim: int, fused_qkv: int, rank: int) -> int:
    """Trainable parameters: per block, A and B of the q|k|v adapter and of the output one."""
    return layers * rank * ((dim + fused_qkv) + (dim + dim))
