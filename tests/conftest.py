from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated datasets go to a fresh cache per test session, never the user's."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINPERF_CACHE", str(cache))
    yield cache
    mp.undo()


def read_log(path: Path) -> list[dict]:
    """The :::MLLOG records of a log file, in order."""
    records = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            records.append(json.loads(line[len(":::MLLOG "):]))
    return records


SHARED = Path(__file__).resolve().parents[2] / "shared"
