"""What a workload's golden record runs: its mini's first steps (trainperf.bench.goldens)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GoldenSpec:
    """The first `steps` training steps of the mini recipe, with `sets` applied (a cheaper evaluation, say:
    never the training path), then the evaluation the end of that budget takes where `evaluate` (its value
    is recorded too; off where even a reduced evaluation would cost the gate more than its steps). A few
    seconds in all: the gate runs every workload's."""

    steps: int = 4
    sets: tuple[str, ...] = ()
    evaluate: bool = True
