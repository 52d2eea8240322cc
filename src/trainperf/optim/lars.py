"""LARS (You et al. 2017) as in the MLPerf ResNet reference: trust ratio, momentum, exclusions.

Parameters in a group with `lars_exclude=True` (BatchNorm and biases in the references) get plain
momentum SGD without weight decay or trust-ratio scaling.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling with momentum, the form of the MLPerf reference.

    update:  trust = eta * |w| / (|g| + wd * |w| + eps)   (1 if either norm is 0)
             v = momentum * v + lr * trust * (g + wd * w);   w = w - v
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 0.0,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("lr, momentum and weight_decay must be >= 0")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            lars_exclude=False,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            wd, eta, eps = group["weight_decay"], group["trust_coefficient"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if not group["lars_exclude"]:
                    w_norm = torch.linalg.vector_norm(p)
                    g_norm = torch.linalg.vector_norm(grad)
                    # Computed on the device with torch.where: no host sync per parameter.
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0),
                        eta * w_norm / (g_norm + wd * w_norm + eps),
                        torch.ones_like(w_norm),
                    )
                    grad = (grad + wd * p) * trust
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buf.mul_(momentum).add_(grad, alpha=lr)
                p.sub_(buf)
        return loss
