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
        foreach: bool | None = None,
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
        # foreach: one multi-tensor kernel per operation over all parameters instead of ~6 small
        # kernels per parameter (ResNet-50 has 161 tensors). None: foreach when they live on a GPU,
        # where kernel launches, not arithmetic, dominate an optimizer step.
        self.foreach = foreach

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            foreach = self.foreach if self.foreach is not None else all(p.is_cuda for p in params)
            (self._step_foreach if foreach else self._step_loop)(group, params)
        return loss

    def _buffers(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return [self.state[p]["momentum_buffer"] for p in params]

    def _step_loop(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """The reference form, one parameter at a time."""
        lr, momentum = group["lr"], group["momentum"]
        wd, eta, eps = group["weight_decay"], group["trust_coefficient"], group["eps"]
        for p, buf in zip(params, self._buffers(params), strict=True):
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
            buf.mul_(momentum).add_(grad, alpha=lr)
            p.sub_(buf)

    def _step_foreach(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """The same update with multi-tensor (torch._foreach_*) kernels."""
        lr, momentum = group["lr"], group["momentum"]
        wd, eta, eps = group["weight_decay"], group["trust_coefficient"], group["eps"]
        grads = [p.grad for p in params]
        if group["lars_exclude"]:
            updates = grads
        else:
            w_norm = torch.stack(torch._foreach_norm(params))
            g_norm = torch.stack(torch._foreach_norm(grads))
            trust = torch.where((w_norm > 0) & (g_norm > 0), eta * w_norm / (g_norm + wd * w_norm + eps),
                                torch.ones_like(w_norm))
            updates = torch._foreach_add(grads, params, alpha=wd) if wd else [g.clone() for g in grads]
            torch._foreach_mul_(updates, list(trust.unbind()))
        buffers = self._buffers(params)
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, updates, alpha=lr)
        torch._foreach_sub_(params, buffers)
