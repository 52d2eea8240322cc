"""Speedups, applied in one place: the harness calls `apply` on what a workload built.

A workload declares which switches make sense for it; asking for one it does not support is a
clear error, never a silent no-op.
"""

from __future__ import annotations

import torch

from trainperf.errors import TrainperfError
from trainperf.spec import ModelParts, Recipe, Workload


def check_supported(workload: Workload, recipe: Recipe) -> None:
    if recipe.channels_last and not workload.supports_channels_last:
        raise TrainperfError(f"channels_last=true: not supported by {workload.name} (no 4-D convolutions)")


def apply(workload: Workload, recipe: Recipe, parts: ModelParts) -> ModelParts:
    """Return the parts with the recipe's speedups applied."""
    check_supported(workload, recipe)
    if recipe.channels_last:
        # Converting the weights is enough: convolutions then run NHWC, and their outputs stay NHWC.
        parts.model = parts.model.to(memory_format=torch.channels_last)
    return parts
