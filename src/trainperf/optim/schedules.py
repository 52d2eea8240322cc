"""Learning-rate schedules as pure functions of the step (wrapped by torch's LambdaLR)."""

from __future__ import annotations

from collections.abc import Callable


def warmup_poly(
    base_lr: float, end_lr: float, warmup_steps: int, total_steps: int, power: float = 2.0
) -> Callable[[int], float]:
    """MLPerf ResNet schedule: linear warmup from 0 to `base_lr`, then polynomial decay to `end_lr`.

    Returns the multiplier of `base_lr` at a step (step 0 is the first update). After `total_steps`
    the rate stays at `end_lr`, so a run that trains past the horizon keeps a valid LR.
    """
    if base_lr <= 0:
        raise ValueError("base_lr must be > 0")
    decay_steps = max(1, total_steps - warmup_steps)

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        lr = end_lr + (base_lr - end_lr) * (1.0 - progress) ** power
        return lr / base_lr

    return multiplier
