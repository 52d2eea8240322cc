"""LAMB (You et al. 2019) as the MLPerf BERT and RNN-T references use it: Adam moments with bias
correction, decoupled weight decay, and a per-layer trust ratio |w| / |update|.

Parameters in a group with `lamb_exclude=True` (biases and LayerNorm/BatchNorm in the references)
get no weight decay and no trust-ratio scaling (the update is applied with ratio 1).

Two forms of one update: a loop over parameters (the reference's form), and a multi-tensor form
(`foreach=True`: torch._foreach_* kernels over all parameters of a group at once, as NVIDIA's fused
LAMB does in one launch per operation; BERT-Large has ~400 tensors). Neither reads a value back to the
host: trust ratios stay on the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class LAMB(torch.optim.Optimizer):
    """update = m_hat / (sqrt(v_hat) + eps) + wd * w;  trust = |w| / |update| (1 if either is 0);
    w = w - lr * trust * update."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, foreach: bool | None = None) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("invalid LAMB hyperparameters")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, lamb_exclude=False))
        # None: the multi-tensor form when the parameters live on a GPU, where the loop's ~10 small
        # kernels per tensor (BERT-Large: ~400 tensors) make the step launch-bound.
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
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
            foreach = self.foreach if self.foreach is not None else all(p.is_cuda for p in params)
            (self._step_foreach if foreach else self._step_loop)(group, params)
        return loss

    def _step_loop(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
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

    def _step_foreach(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]
        ms = [self.state[p]["exp_avg"] for p in params]
        vs = [self.state[p]["exp_avg_sq"] for p in params]
        steps = [self.state[p]["step"] for p in params]
        torch._foreach_mul_(ms, beta1)
        torch._foreach_add_(ms, grads, alpha=1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
        # Bias corrections differ only if parameters joined at different steps: one scalar each.
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, [(1 - beta2 ** s) ** 0.5 for s in steps])
        torch._foreach_add_(denom, group["eps"])
        updates = torch._foreach_div(ms, denom)
        torch._foreach_div_(updates, [1 - beta1 ** s for s in steps])
        if group["lamb_exclude"]:
            torch._foreach_add_(params, updates, alpha=-group["lr"])
            return
        if group["weight_decay"]:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])
        w_norm = torch.stack(torch._foreach_norm(params))
        u_norm = torch.stack(torch._foreach_norm(updates))
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        torch._foreach_mul_(updates, list((trust * -group["lr"]).unbind()))
        torch._foreach_add_(params, updates)
