"""Optimizers and LR schedules the MLPerf references use and torch lacks."""

from trainperf.optim.lamb import LAMB
from trainperf.optim.lars import LARS
from trainperf.optim.schedules import warmup_poly

__all__ = ["LAMB", "LARS", "warmup_poly"]
