"""NeuMF, HR@10 and the popularity baseline."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

TOP_K = 10


class NeuMF(nn.Module):
    """GMF (elementwise product of embeddings) + MLP over concatenated embeddings, joined by a linear
    layer to one logit; initialised as the reference (embeddings N(0, 0.01), MLP Glorot-uniform,
    output LeCun-uniform)."""

    def __init__(self, n_users: int, n_items: int, factors: int, mlp_layers: tuple[int, ...]) -> None:
        super().__init__()
        half = mlp_layers[0] // 2
        self.gmf_user, self.gmf_item = nn.Embedding(n_users, factors), nn.Embedding(n_items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(n_users, half), nn.Embedding(n_items, half)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(mlp_layers[:-1], mlp_layers[1:], strict=True))
        self.out = nn.Linear(factors + mlp_layers[-1], 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, std=0.01)
        for layer in self.mlp:
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        bound = (3.0 / self.out.in_features) ** 0.5
        nn.init.uniform_(self.out.weight, -bound, bound)
        nn.init.zeros_(self.out.bias)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.gmf_user(users) * self.gmf_item(items)
        x = torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1)
        for layer in self.mlp:
            x = F.relu(layer(x))
        return self.out(torch.cat([gmf, x], dim=-1)).squeeze(-1)


def hit_rate_hits(scores_pos: torch.Tensor, scores_neg: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """Hits@k per user, vectorised: the positive's rank is the number of negatives scoring >= it
    (ties are ranked ahead of the positive, as the MLPerf rules require)."""
    rank = (scores_neg >= scores_pos.unsqueeze(1)).sum(dim=1)
    return (rank < k).long()


def pair_scores(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The evaluation forward: the score of every (user, candidate item) pair."""
    users, items = batch
    return model(users, items).float()


def popularity_hr(train_pairs: np.ndarray, test_pos: np.ndarray, test_neg: np.ndarray, n_items: int) -> float:
    """HR@10 of ranking by training popularity: the baseline a learned model must clearly beat."""
    counts = torch.from_numpy(np.bincount(train_pairs[:, 1], minlength=n_items)).float()
    hits = hit_rate_hits(counts[torch.tensor(test_pos)], counts[torch.tensor(test_neg)])
    return hits.float().mean().item()
