"""Where trainperf keeps generated datasets and runs, unless told otherwise."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path


def cache_root() -> Path:
    """$TRAINPERF_CACHE, else $XDG_CACHE_HOME/trainperf, else ~/.cache/trainperf."""
    if os.environ.get("TRAINPERF_CACHE"):
        return Path(os.environ["TRAINPERF_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainperf"


def default_run_dir(workload: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{workload}-{stamp}"
