"""Quality: a metric's name, direction and named parts, and when a value meets its target."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainperf.errors import TrainperfError

SCALES = ("mini", "full")

# A quality value: one number, or named numbers (Mask R-CNN logs {"BBOX": 0.38, "SEGM": 0.34}).
Quality = float | dict[str, float]
# A recipe's target: one number, or one per named value of a composite metric, in the metric's order.
Target = float | tuple[float, ...]

# How the log's epoch_num reads: epochs trained (most rules), 1 + epochs (DLRM: 1.05, 1.10, …), or
# training samples (BERT, which has no epochs).
EPOCH_NUM_STYLES = ("epochs", "1+epochs", "samples")


# ---------------------------------------------------------------------------------------------
# quality
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A quality metric: its name, which direction is better and, for a composite metric, the names
    of its values (`parts`), each with its own target; a composite target is met when all are."""

    name: str
    higher_is_better: bool = True
    parts: tuple[str, ...] = ()
    # Keys the log repeats each evaluation's value under, beside eval_accuracy, where a division's rules read
    # another name (the open rules of flux1, 5.1.0-6.1.0: averaged_validation_loss).
    also_logged_as: tuple[str, ...] = ()
    # Whether the rules compare strictly: a quality equal to the target does not reach it (the GRPO benchmark's
    # "pass@4 > 0.69"). False: at or beyond it, as most rules say.
    strict: bool = False

    @property
    def composite(self) -> bool:
        return bool(self.parts)

    def targets(self, target: Target) -> dict[str, float]:
        """The target of each named value ({name: target} for a scalar metric)."""
        if not self.parts:
            if isinstance(target, tuple):
                if len(target) != 1:
                    raise TrainperfError(f"target {target}: {self.name} takes one value")
                target = target[0]
            return {self.name: float(target)}
        values = target if isinstance(target, tuple) else (target,)
        if len(values) != len(self.parts):
            raise TrainperfError(f"target {target}: {self.name} needs one value for each of "
                                 + ", ".join(self.parts))
        return {part: float(v) for part, v in zip(self.parts, values, strict=True)}

    def values(self, value: Quality) -> dict[str, float]:
        """The named values of a quality ({name: value} for a scalar metric)."""
        if not self.parts:
            if isinstance(value, dict):
                raise TrainperfError(f"{self.name}: expected one value, got {value}")
            return {self.name: float(value)}
        if not isinstance(value, dict) or set(value) != set(self.parts):
            raise TrainperfError(f"{self.name}: expected values for {', '.join(self.parts)}, got {value!r}")
        return {part: float(value[part]) for part in self.parts}

    def reached(self, value: Quality, target: Target) -> bool:
        goals = self.targets(target)
        got = self.values(value)
        if self.higher_is_better:
            return all(got[k] > goals[k] if self.strict else got[k] >= goals[k] for k in goals)
        return all(got[k] < goals[k] if self.strict else got[k] <= goals[k] for k in goals)

    def finite(self, value: Quality) -> bool:
        return all(math.isfinite(v) for v in self.values(value).values())

    def logged(self, value: Quality) -> float | dict[str, float]:
        """The eval_accuracy value of the MLPerf log: a number, or the dict of named values."""
        got = self.values(value)
        return got if self.parts else got[self.name]

    def describe(self, value: Quality | None, digits: int = 4) -> str:
        if value is None:
            return "-"
        got = self.values(value)
        if not self.parts:
            return f"{got[self.name]:.{digits}f}"
        return ", ".join(f"{k} {v:.{digits}f}" for k, v in got.items())

    def describe_target(self, target: Target) -> str:
        goals = self.targets(target)
        sign = (">" if self.higher_is_better else "<") + ("" if self.strict else "=")
        if not self.parts:
            return f"{sign} {goals[self.name]:g}"
        return " and ".join(f"{k} {sign} {v:g}" for k, v in goals.items())
