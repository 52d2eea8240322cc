"""The mini targets' calibrations: for each workload (and variant), how many of 10 seeds reached the
target and how long it took, on which machine and when. One file, `calibration.json`, written by
`benchmarks/mini_ttt.py --record`; `suite` estimates its time left from it and the docs' tables are
generated from it (`python benchmarks/make_docs.py`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError
from trainperf.files import write_text_atomic

PATH = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True)
class Calibration:
    """One calibration: seeds 0..seeds-1 of `workload`'s mini recipe with `sets`, on `nproc` processes."""

    workload: str
    target: str
    seeds: int
    reached: int
    median_s: float  # run_start -> run_stop, over every seed
    min_s: float | None
    max_s: float | None
    progress: str  # epochs (or samples, generations) to the target, as a range
    date: str
    machine: str
    command: str
    sets: list[str] = field(default_factory=list)
    nproc: int = 1
    note: str = ""
    # What the target sits between, measured on the same data: a trivial predictor's quality and the
    # best quality seen (a target near either would measure nothing).
    baseline: str = ""
    best: str = ""
    # The golden record of the mini's first steps measured on the same code (bench/goldens.py: its hash in
    # goldens.json): a test holds them equal, so numbers that moved cannot keep a stale calibration.
    goldens_sha256: str = ""
    goldens_note: str = ""

    @property
    def variant(self) -> tuple[str, tuple[str, ...], int]:
        return self.workload, tuple(self.sets), self.nproc


def target_text(metric: Any, target: float | tuple[float, ...]) -> str:
    """How a calibration names the target it was measured against ("top1 >= 0.97"); a calibration
    whose target text is not the mini recipe's own is stale."""
    text = metric.describe_target(target)
    return text if metric.parts else f"{metric.name} {text}"


def load(path: Path = PATH) -> list[Calibration]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [Calibration(**entry) for entry in data["calibrations"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainperfError(f"{path}: not a calibration file ({type(exc).__name__}: {exc})") from None


def main(workload: str, path: Path = PATH) -> Calibration | None:
    """The calibration of `workload`'s mini recipe itself, in one process (None: not calibrated)."""
    return next((c for c in load(path) if c.variant == (workload, (), 1)), None)


def record(entry: Calibration, path: Path = PATH) -> None:
    """Add `entry`, or replace the one of the same workload, settings and process count (keeping its
    baseline and best where `entry` has none: they are measured once, not by every calibration)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    old = next((Calibration(**e) for e in data["calibrations"] if Calibration(**e).variant == entry.variant), None)
    if old is not None:
        entry = replace(entry, baseline=entry.baseline or old.baseline, best=entry.best or old.best)
    variants = [Calibration(**e).variant for e in data["calibrations"]]
    if entry.variant in variants:  # in its place: a re-calibration is a one-entry diff
        data["calibrations"][variants.index(entry.variant)] = asdict(entry)
    else:
        data["calibrations"].append(asdict(entry))
    # Kept as people read and diff it: one-space indent, "–" as itself.
    write_text_atomic(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def link_goldens(workload: str, digest: str, note: str, path: Path = PATH) -> None:
    """Record in `workload`'s main calibration the hash of the golden record its code produces."""
    entry = main(workload, path)
    if entry is None:
        raise TrainperfError(f"{path}: no calibration of {workload} to link a golden record to")
    record(replace(entry, goldens_sha256=digest, goldens_note=note), path)
