"""The click-through evaluation's forward: each sample's click probability (the AUC: common/ranking.py)."""

from __future__ import annotations

import torch
from torch import nn

Batch = tuple[torch.Tensor, ...]


def click_probability(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The evaluation forward: the predicted click probability of every sample."""
    dense, sparse = batch[0], batch[1]
    return torch.sigmoid(model(dense, sparse).float())
