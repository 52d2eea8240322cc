"""Optimizers and LR schedules the MLPerf references use and torch lacks."""

from trainperf.optim.ema import ema
from trainperf.optim.lamb import LAMB
from trainperf.optim.lars import LARS
from trainperf.optim.schedules import warmup_poly

__all__ = ["LAMB", "LARS", "ema", "kernels", "multi_tensor", "warmup_poly"]


def kernels(fused: bool) -> dict[str, bool]:
    """The keyword that picks a torch optimizer's implementation: its fused kernels (the fused_optimizer
    switch), else its multi-tensor (foreach) form, torch's own default on GPUs, asked for explicitly so
    that every device runs, and counts, the same operators."""
    return {"fused": True} if fused else {"foreach": True}


def multi_tensor(fused: bool) -> bool | None:
    """LARS's and LAMB's `foreach` (torch has neither): the multi-tensor form with the fused_optimizer
    switch, else the optimizer's default (multi-tensor when the parameters live on a GPU)."""
    return True if fused else None
