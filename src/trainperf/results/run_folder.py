"""A run folder: the MLPerf log and result.json, side by side."""

from __future__ import annotations

import json
from pathlib import Path

from trainperf.contract import RunResult
from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic

LOG_NAME = "mlperf_log.txt"
RESULT_NAME = "result.json"


def check_free(out_dir: Path) -> None:
    """Refuse a folder that already holds a run, before any work starts."""
    if (out_dir / LOG_NAME).exists() or (out_dir / RESULT_NAME).exists():
        raise TrainperfError(f"--out {out_dir}: already holds a run ({LOG_NAME}); choose another folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainperfError(f"--out {out_dir}: exists and is not a folder")


def claim(out_dir: Path) -> Path:
    """Create the run folder and return the log path."""
    check_free(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainperfError(f"--out {out_dir}: cannot create folder ({exc.strerror})") from None
    return out_dir / LOG_NAME


def load(out_dir: Path) -> dict:
    path = out_dir / RESULT_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: cannot read result ({exc})") from None


def save(out_dir: Path, result: RunResult) -> Path:
    path = out_dir / RESULT_NAME
    write_json_atomic(path, result.to_dict())
    return path


def load_launched(out_dir: Path, launcher_code: int) -> dict:
    """Rank 0's result of a run started through the launcher, checked against the launcher's exit code."""
    if not (out_dir / RESULT_NAME).exists():
        raise TrainperfError(f"{out_dir}: the run left no {RESULT_NAME} (launcher exit code {launcher_code}; "
                             "see the messages above)")
    result = load(out_dir)
    if launcher_code != 0 and result.get("status") == "success":
        raise TrainperfError(f"{out_dir}: rank 0 reached the target but a process failed "
                             f"(launcher exit code {launcher_code}); the run does not count")
    return result
