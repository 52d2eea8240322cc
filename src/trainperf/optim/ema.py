"""Exponential moving average of a model's weights, for evaluation (the RNN-T reference evaluates
its EMA weights), buffers averaged too.

torch's AveragedModel does the same, but asks `if self.n_averaged == 0` of a device tensor at every
update: a host-device synchronisation per training step on a GPU. Here the count of updates is a
Python integer (kept in the state dict, so that restoring a state restores it), and the update is
two multi-tensor operations.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class EMA(nn.Module):
    """A copy of a model whose floating-point weights and buffers follow
    w_ema = decay * w_ema + (1 - decay) * w at every `update_parameters(model)`; the first update
    copies them, as do updates of integer buffers. Calling it runs the averaged copy (`.module`)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.module = copy.deepcopy(model)
        for param in self.module.parameters():
            param.requires_grad_(False)
        self.decay = decay
        self.updates = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        mine = [*self.module.parameters(), *self.module.buffers()]
        theirs = [t.detach() for t in (*model.parameters(), *model.buffers())]
        if len(mine) != len(theirs):
            raise ValueError("EMA.update_parameters: the model has another structure than the averaged copy")
        floats = [(a, b) for a, b in zip(mine, theirs, strict=True) if a.is_floating_point()]
        others = [(a, b) for a, b in zip(mine, theirs, strict=True) if not a.is_floating_point()]
        if self.updates == 0:
            if mine:
                torch._foreach_copy_(mine, theirs)
        else:
            if floats:
                torch._foreach_lerp_([a for a, _ in floats], [b for _, b in floats], 1.0 - self.decay)
            if others:
                torch._foreach_copy_([a for a, _ in others], [b for _, b in others])
        self.updates += 1

    def get_extra_state(self) -> dict[str, int]:
        return {"updates": self.updates}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.updates = int(state["updates"])


def ema(model: nn.Module, decay: float) -> EMA:
    """The averaged copy of `model` (see EMA)."""
    return EMA(model, decay)
