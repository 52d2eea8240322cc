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
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError

PACKAGE = Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parents[1]  # the repository, when trainperf runs from a checkout
RECORD = ROOT / "docs" / "second-tier.json"
# What a calibration writes: not part of the code it was measured on.
NOT_CODE = {"calibration.json", "goldens.json"}


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
    if failed or not record.get("tests"):
        raise TrainperfError(f"{path}: the second tier did not pass on this code ({len(failed)} failed: "
                             f"{', '.join(failed[:3])}); fix it before recording a calibration")
