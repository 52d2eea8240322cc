"""Reading MLPerf logs: the one reader of `:::MLLOG` records that every part of trainperf uses."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
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


# The official parser strips each line with re.sub(".*:::MLLOG", …), which takes time quadratic in
# the line's length: 18 s for one 200 KB line here. No MLPerf record is near this long.
LONGEST_RECORD = 16 << 10


@contextlib.contextmanager
def for_official_checker(path: Path) -> Iterator[Path]:
    """A copy of a log for the official checker: its `:::MLLOG` lines only, each from its last marker
    (what the checker itself keeps) and cut at LONGEST_RECORD characters — so that an absurd line
    costs a parse error instead of minutes."""
    try:
        text = Path(path).read_text(encoding="latin-1")  # as the official parser reads it
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror})") from None
    kept = [line[line.rfind(MARKER):][:LONGEST_RECORD] for line in text.splitlines() if MARKER in line]
    with tempfile.TemporaryDirectory(prefix="trainperf-check-") as tmp:
        copy = Path(tmp) / Path(path).name
        copy.write_text("\n".join(kept) + "\n", encoding="latin-1")
        yield copy
