"""Exponential moving average of a model's weights, for evaluation (the RNN-T reference evaluates
its EMA weights): torch's AveragedModel with its EMA averaging function, buffers averaged too."""

from __future__ import annotations

from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def ema(model: nn.Module, decay: float) -> AveragedModel:
    """A copy of `model` whose weights follow w_ema = decay * w_ema + (1 - decay) * w at every
    `update_parameters(model)` (the first update copies the weights)."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
