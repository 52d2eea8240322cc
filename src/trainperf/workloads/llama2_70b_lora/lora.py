"""LoRA adapters on the shared Llama (workloads/llama31_8b/model.py), as MLPerf's reference places them:
rank 16, alpha 32, dropout 0.1 on the fused q|k|v projection and on the output projection of every block
(mlcommons/training `llama2_70b_lora`: `run_and_time.sh` passes `--lora_target_modules qkv_proj,o_proj`
to PEFT 0.8.2 over a checkpoint whose q, k and v projections are fused).

Written here rather than taken from PEFT: PEFT finds its targets by module name and wraps nn.Linear
layers; this Llama keeps q, k and v as three projections (tensor parallelism splits each by heads), so a
LoRA over the fused projection is one adapter whose output is split between them, which PEFT cannot
express. The adapter is PEFT's LoRA layer: A initialised as PEFT does (Kaiming-uniform, a = sqrt(5)), B
zero (the model starts as the base), the update B A dropout(x) scaled by alpha / rank."""

from __future__ import annotations

import math

import torch
from torch import nn


class LowRank(nn.Module):
    adapter = True  # Llama.init_weights initialises it after a meta-device build

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.lora_a = nn.Linear(in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_features, bias=False)
        self.scale = alpha / rank
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
        nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The frozen base may compute in bf16 while the adapters stay fp32 (as PEFT does, in their dtype).
        update = self.lora_b(self.lora_a(self.dropout(x.to(self.lora_a.weight.dtype)))) * self.scale
        return update.to(x.dtype)


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
        fused = attention.wq.out_features + attention.wk.out_features + attention.wv.out_features
        with torch.device(device):
            attention.qkv_adapter = LowRank(dim, fused, rank, alpha, dropout)
            attention.o_adapter = LowRank(attention.wo.in_features, attention.wo.out_features, rank, alpha, dropout)
        trained += [*attention.qkv_adapter.parameters(), *attention.o_adapter.parameters()]
    return trained


def adapter_parameters(layers: int, dim: int, fused_qkv: int, rank: int) -> int:
    """Trainable parameters: per block, A and B of the q|k|v adapter and of the output one."""
    return layers * rank * ((dim + fused_qkv) + (dim + dim))
