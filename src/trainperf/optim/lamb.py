"""LAMB (You et al. 2019) as the MLPerf BERT and RNN-T references use it: Adam moments with bias
correction, decoupled weight decay, and a per-layer trust ratio |w| / |update|.

Parameters in a group with `lamb_exclude=True` (biases and LayerNorm/BatchNorm in the references)
get no weight decay and no trust-ratio scaling (the update is applied with ratio 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class LAMB(torch.optim.Optimizer):
    """update = m_hat / (sqrt(v_hat) + eps) + wd * w;  trust = |w| / |update| (1 if either is 0);
    w = w - lr * trust * update."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("invalid LAMB hyperparameters")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, lamb_exclude=False))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** state["step"])
                v_hat = v / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["lamb_exclude"]:
                    p.sub_(update, alpha=group["lr"])
                    continue
                update = update + group["weight_decay"] * p
                w_norm = torch.linalg.vector_norm(p)
                u_norm = torch.linalg.vector_norm(update)
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.sub_(update * trust * group["lr"])
        return loss
