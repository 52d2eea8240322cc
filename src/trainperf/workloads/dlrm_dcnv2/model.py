"""DLRM-DCNv2 as the reference builds it: TorchRec's `DLRM_DCN` (mlcommons/training
`recommendation_v2/torchrec_dlrm/dlrm_main.py` with `--interaction_type=dcn`) over one EmbeddingBagCollection of
the 26 sum-pooled multi-hot tables: a bottom MLP on the 13 dense features (ReLU after every layer, its last
the embedding width), a low-rank cross network (x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l) over the 27
vectors side by side, and the top MLP to one click logit. The model is TorchRec's own; what is here is its
configuration and the multi-hot batch turned into TorchRec's jagged input."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from trainperf.workloads.dlrm_dcnv2.data import N_DENSE


def parameter_count(table_sizes: Sequence[int], dim: int, bottom: Sequence[int], top: Sequence[int], dcn_layers: int,
                    dcn_rank: int) -> dict[str, int]:
    """Parameters by part, from the layer definitions (tables, bottom MLP, cross network, top MLP)."""
    def mlp(sizes: Sequence[int]) -> int:
        return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))

    width = (len(table_sizes) + 1) * dim
    return {"embeddings": sum(table_sizes) * dim, "bottom_mlp": mlp([N_DENSE, *bottom]),
            "cross_network": dcn_layers * (2 * width * dcn_rank + width), "top_mlp": mlp([width, *top])}


class DCNv2(nn.Module):
    """TorchRec's DLRM_DCN, its tables on the meta device (the runtime shards and materialises them), taking a
    batch as (dense [B, 13], ids [B, sum(hotness)]: each feature's bag side by side)."""

    def __init__(self, table_sizes: Sequence[int], hotness: Sequence[int], dim: int, bottom: Sequence[int],
                 top: Sequence[int], dcn_layers: int, dcn_rank: int, device: torch.device, max_rows: int = 0) -> None:
        super().__init__()
        # max_rows > 0: every table capped at that many rows and ids taken modulo it (a full-shape model on a
        # machine that cannot hold the 26 billion table parameters: not the reference model).
        self.max_rows = max_rows
        if max_rows:
            table_sizes = [min(n, max_rows) for n in table_sizes]
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.models.dlrm import DLRM_DCN

        self.table_sizes, self.hotness, self.dim = list(table_sizes), list(hotness), dim
        self.features = [f"cat_{j}" for j in range(len(table_sizes))]
        # U(-sqrt(1/n), sqrt(1/n)) for a table of n rows, TorchRec's default, written out.
        tables = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f"t_cat_{j}", embedding_dim=dim, num_embeddings=n, feature_names=[name],
                               weight_init_min=-math.sqrt(1.0 / n), weight_init_max=math.sqrt(1.0 / n))
            for j, (n, name) in enumerate(zip(table_sizes, self.features, strict=True))], device=torch.device("meta"))
        self.net = DLRM_DCN(tables, N_DENSE, list(bottom), list(top), dcn_layers, dcn_rank, dense_device=device)
        self.net.inter_arch.to(device)  # TorchRec builds the cross network on the default device
        self.tables_prefix = "net.sparse_arch."
        self.register_buffer("bag_sizes", torch.tensor(hotness, dtype=torch.int32, device=device), persistent=False)
        self.offsets = [0, *itertools.accumulate(hotness)]

    @property
    def tables(self) -> nn.Module:
        """The embedding tables (TorchRec's sparse arch); not a second path to them, which TorchRec's optimizer
        collection would meet twice."""
        return self.net.sparse_arch

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        from torchrec import KeyedJaggedTensor

        rows = dense.shape[0]
        # Feature-major, each row's bag of fixed size: TorchRec's KeyedJaggedTensor layout.
        bounds = zip(self.offsets[:-1], self.offsets[1:], strict=True)
        values = torch.cat([ids[:, a:b].reshape(-1) for a, b in bounds]).long()
        if self.max_rows:
            values = torch.remainder(values, self.max_rows)
        lengths = self.bag_sizes.repeat_interleave(rows)
        # Each feature's share of the values, known here: TorchRec would otherwise read it back from the device.
        per_key = [h * rows for h in self.hotness]
        kjt = KeyedJaggedTensor(keys=self.features, values=values, lengths=lengths, length_per_key=per_key,
                                offset_per_key=[0, *itertools.accumulate(per_key)], stride=rows)
        return self.net(dense, kjt).squeeze(-1)

