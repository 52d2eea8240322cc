"""A recipe field's valid interval, declared with the field: `base_lr: Positive = 0.1`.

The markers are annotated-types' (`Gt`, `Ge`, `Lt`, `Le`, `Interval`) inside `typing.Annotated`, so the
declaration is the documentation and `Recipe.validate` reads it (one check, for every recipe and its nested
configs). A number declared without one must be finite and >= 0.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Annotated, Any

import annotated_types as at

from trainperf.errors import TrainperfError

Positive = Annotated[float, at.Gt(0)]  # learning rates, epsilons, powers, durations
Fraction = Annotated[float, at.Interval(ge=0, lt=1)]  # dropout, momentum, label smoothing, Adam betas
Share = Annotated[float, at.Interval(gt=0, le=1)]  # a part of a whole that cannot be empty: crop area, IoU, decay
Count = Annotated[int, at.Ge(1)]  # sizes, widths, layers, batch sizes, epochs between evaluations
Counts = Annotated[tuple[int, ...], at.Ge(1)]  # per-layer widths and block counts, each >= 1

NON_NEGATIVE = (0.0, False, math.inf, True)  # [0, inf): a number declared without an interval


def interval(annotation: Any) -> tuple[float, bool, float, bool]:
    """(low, low_open, high, high_open) that an `Annotated` annotation declares, else [0, inf)."""
    bounds = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, at.BaseMetadata | at.GroupedMetadata)]
    if not bounds:
        return NON_NEGATIVE
    low, low_open, high, high_open = -math.inf, True, math.inf, True
    for marker in bounds:
        for bound in (marker if isinstance(marker, at.GroupedMetadata) else [marker]):
            if isinstance(bound, at.Gt):
                low, low_open = float(bound.gt), True
            elif isinstance(bound, at.Ge):
                low, low_open = float(bound.ge), False
            elif isinstance(bound, at.Lt):
                high, high_open = float(bound.lt), True
            elif isinstance(bound, at.Le):
                high, high_open = float(bound.le), False
    return low, low_open, high, high_open


def within(value: float, bounds: tuple[float, bool, float, bool]) -> bool:
    low, low_open, high, high_open = bounds
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    # A Python int of any size compares with the bounds; math.isfinite would overflow converting it.
    return (isinstance(value, int) or math.isfinite(value)) and above and below


def shown(bounds: tuple[float, bool, float, bool]) -> str:
    """The interval as a reader writes it: (0, inf), [0, 1), [1, inf)."""
    low, low_open, high, high_open = bounds

    def number(x: float) -> str:
        return "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:g}"

    return f"{'(' if low_open else '['}{number(low)}, {number(high)}{')' if high_open else ']'}"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _is_number(value: Any) -> bool:
    numbers = value if isinstance(value, tuple) else (value,)
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)


def intervals(obj: Any, prefix: str = "") -> dict[str, str]:
    """"name" or "config.name" -> the interval of each numeric field of dataclass `obj`, as written."""
    hints, found = _hints(type(obj)), {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            found.update(intervals(value, f"{prefix}{f.name}."))
        elif _is_number(value):
            found[prefix + f.name] = shown(interval(hints[f.name]))
    return found


def check(obj: Any, prefix: str) -> None:
    """Raise TrainperfError naming the first numeric field of dataclass `obj` (nested ones too) outside the
    interval declared with it; `prefix` starts the message ("recipe field ")."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check(value, f"{prefix}{f.name}.")
            continue
        if not _is_number(value):
            continue
        numbers = value if isinstance(value, tuple) else (value,)
        bounds = interval(hints[f.name])
        bad = next((v for v in numbers if not within(v, bounds)), None)
        if bad is not None:
            said = _short(value) if isinstance(value, tuple) else _short(bad)
            raise TrainperfError(f"{prefix}{f.name}={said}: expected a finite value in {shown(bounds)}")


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
