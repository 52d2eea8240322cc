"""Reading MLPerf logs: the one reader of `:::MLLOG` records that every part of trainperf uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError

MARKER = ":::MLLOG "


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every `:::MLLOG` record of a log, in order (`key`, `value`, `metadata`, `time_ms`, …). Lines
    without the marker (launcher noise) are skipped, a rank prefix before it ("0: ") is ignored, and
    so is a record whose JSON was cut (a killed writer's last line)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror})") from None
    records = []
    for line in text.splitlines():
        at = line.find(MARKER)
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(MARKER):])
        except ValueError:
            continue
        if isinstance(record, dict) and "key" in record:
            record.setdefault("metadata", {})
            records.append(record)
    return records


def first(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in records if r["key"] == key), None)
