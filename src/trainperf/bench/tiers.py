"""The test suite's two tiers, as the tools that record calibrations see them.

The gate (the README's test command, CI's) runs every unit, contract, conformance, fuzzing, docs and
safety test, each mini's first steps against its golden record, the fast minis to their targets and one
short multi-process test per engine. The second tier (`python benchmarks/second_tier.py`: the tests
marked `slow`) trains the other minis to their targets, runs the multi-process runs to target and the
graph checks. Its last run is recorded in docs/second-tier.json (date, commit, the code's hash, duration,
each test's outcome) and shown in docs/testing.md; a calibration (benchmarks/mini_ttt.py --record) is
written only on code whose second tier passed: the hash of the package's code must be the recorded one.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError

PACKAGE = Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parents[1]  # the repository, when trainperf runs from a checkout
RECORD = ROOT / "docs" / "second-tier.json"
# What a calibration writes: not part of the code it was measured on.
NOT_CODE = {"calibration.json", "goldens.json"}
GATE_RECORD = ROOT / "docs" / "gate-durations.json"  # the gate's last recorded run, test by test
WORKLOAD_BUDGET_S = 40.0  # what a new workload may add to the gate (docs/testing.md)


def code_hash(package: Path = PACKAGE) -> str:
    """A hash of the package's code and shipped files (calibration and golden records left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if path.name in NOT_CODE or path.suffix == ".pyc":
            continue
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def last_second_tier(path: Path = RECORD) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: unreadable record of the second tier ({exc})") from None


def require_second_tier_passed(path: Path = RECORD) -> None:
    """Refuse (one line) unless the second tier's last run passed on this very code."""
    record = last_second_tier(path)
    here = code_hash()
    if record is None:
        raise TrainperfError(f"{path}: no record of the second tier; run `python benchmarks/second_tier.py` on this "
                             "code first (a calibration is recorded only on code it passed)")
    if record.get("code") != here:
        raise TrainperfError(f"{path}: the second tier last ran on other code ({record.get('code')} at "
                             f"{record.get('commit', '?')[:12]}, this code is {here}); run "
                             "`python benchmarks/second_tier.py` again first")
    failed = [name for name, outcome in (record.get("tests") or {}).items() if outcome not in ("passed", "skipped")]
    if failed or not record.get("tests") or record.get("exit") != 0:
        raise TrainperfError(f"{path}: the second tier did not pass on this code ({len(failed)} failed: "
                             f"{', '.join(failed[:3])}); fix it before recording a calibration")


def workload_of(nodeid: str, names: list[str]) -> str | None:
    """The workload a test belongs to: its own test file's, or the one its parameters name."""
    path, _, rest = nodeid.partition("::")
    stem = Path(path).stem.removeprefix("test_")
    if stem in names:
        return stem
    params = rest.partition("[")[2].rstrip("]")
    found = [n for n in names if n == params or params.startswith(n + "-") or params.endswith("-" + n)
             or f"-{n}-" in params]
    return max(found, key=len) if found else None


def budget(durations: dict[str, float], names: list[str]) -> dict[str, Any]:
    """A run's total, per file and per workload of `names` (its own file and the tests parametrised by its
    name), and its 20 slowest tests."""
    files: dict[str, float] = defaultdict(float)
    workloads: dict[str, float] = defaultdict(float)
    for nodeid, seconds in durations.items():
        files[nodeid.partition("::")[0]] += seconds
        name = workload_of(nodeid, names)
        if name is not None:
            workloads[name] += seconds
    return {"total_s": sum(durations.values()), "files": dict(files), "workloads": dict(workloads),
            "slowest": sorted(durations.items(), key=lambda kv: kv[1], reverse=True)[:20]}
