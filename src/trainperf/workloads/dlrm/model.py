"""DLRM: the reference's model (bottom MLP, embedding tables, dot interaction, top MLP), and ROC AUC."""

from __future__ import annotations

import torch
from torch import nn

# Imported with the workload, not at the first evaluation: the import (~1.4 s here) is not training time.
from trainperf.workloads.dlrm import data as dlrm_data


def _mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        linear = nn.Linear(fan_in, fan_out)
        # The reference initialisation: W ~ N(0, sqrt(2 / (fan_in + fan_out))), b ~ N(0, sqrt(1 / fan_out)).
        nn.init.normal_(linear.weight, 0.0, (2.0 / (fan_in + fan_out)) ** 0.5)
        nn.init.normal_(linear.bias, 0.0, (1.0 / fan_out) ** 0.5)
        layers.append(linear)
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Embedding tables (sum EmbeddingBags, sparse gradients), a bottom MLP over the dense features,
    the dot interaction of all 27 vectors (strictly-lower-triangle pairs, concatenated with the
    bottom output) and a top MLP to one click logit."""

    def __init__(self, table_sizes: list[int], dim: int, bottom: tuple[int, ...], top: tuple[int, ...],
                 sparse: bool = True, max_ind_range: int = 0, engine: str = "torch") -> None:
        super().__init__()
        self.max_ind_range = max_ind_range
        if max_ind_range:
            table_sizes = [min(n, max_ind_range) for n in table_sizes]
        self.table_sizes, self.dim, self.engine = list(table_sizes), dim, engine
        if engine == "torchrec":
            # One collection of every table, on the meta device: the runtime shards and materialises it
            # (U(-sqrt(1/n), sqrt(1/n)) as the reference, by FBGEMM's initialiser).
            from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

            self.features = [f"f{j}" for j in range(len(table_sizes))]
            self.embeddings = EmbeddingBagCollection(tables=[
                EmbeddingBagConfig(name=f"t{j}", embedding_dim=dim, num_embeddings=n, feature_names=[f"f{j}"],
                                   weight_init_min=-(1.0 / n) ** 0.5, weight_init_max=(1.0 / n) ** 0.5)
                for j, n in enumerate(table_sizes)], device=torch.device("meta"))
        else:
            self.embeddings = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse) for n in table_sizes)
            for table, n in zip(self.embeddings, table_sizes, strict=True):
                nn.init.uniform_(table.weight, -(1.0 / n) ** 0.5, (1.0 / n) ** 0.5)
        self.bottom = _mlp([dlrm_data.N_DENSE, *bottom], last_relu=True)
        vectors = len(table_sizes) + 1
        self.top = _mlp([dim + vectors * (vectors - 1) // 2, *top], last_relu=False)
        rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        if self.max_ind_range:
            sparse = torch.remainder(sparse, self.max_ind_range)
        if self.engine == "torchrec":
            from torchrec import KeyedJaggedTensor

            # Feature-major ids, one per sample and table (bags of one), as TorchRec's jagged input.
            # Each feature's share of the values given, known here: TorchRec would otherwise read it back.
            rows = sparse.shape[0]
            ids = KeyedJaggedTensor(keys=self.features, values=sparse.t().reshape(-1),
                                    lengths=torch.ones(sparse.numel(), dtype=torch.int32, device=sparse.device),
                                    length_per_key=[rows] * len(self.features), stride=rows,
                                    offset_per_key=list(range(0, rows * (len(self.features) + 1), rows)))
            pooled = self.embeddings(ids).values().view(sparse.shape[0], len(self.features), self.dim)
            t = torch.cat([x[:, None, :], pooled.to(x.dtype)], dim=1)
        else:
            # Each sample has one id per table: a bag of one (input [B, 1]).
            vectors = [x] + [table(sparse[:, j:j + 1]) for j, table in enumerate(self.embeddings)]
            # (With the tables in host memory, the looked-up rows travel to the MLPs' device here.)
            t = torch.stack([v.to(device=x.device, dtype=x.dtype) for v in vectors], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.pair_rows, self.pair_cols]], dim=1)).squeeze(-1)
