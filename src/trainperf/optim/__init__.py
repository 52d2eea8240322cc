"""Optimizers and LR schedules the MLPerf references use and torch lacks."""

from trainperf.optim.ema import ema
from trainperf.optim.lamb import LAMB
from trainperf.optim.lars import LARS
from trainperf.optim.schedules import warmup_poly

__all__ = ["LAMB", "LARS", "ema", "warmup_poly"]
