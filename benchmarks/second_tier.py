"""The second test tier: what trains for minutes (the minis to their targets, multi-process runs to target,
the graph checks), outside the gate. One command; its last run is recorded.

    python benchmarks/second_tier.py            # pytest -m second_tier, then docs/second-tier.json
    python benchmarks/second_tier.py -k maskrcnn   # a part of it (recorded as a partial run: no calibration)

The record (docs/second-tier.json: date, commit, the package code's hash, duration, each test's outcome)
is what `benchmarks/mini_ttt.py --record` checks before it writes a calibration: the whole tier must have
passed on the very code being calibrated. `benchmarks/test_budget.py --write-docs` shows it in
docs/testing.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def outcomes(junit: Path) -> tuple[dict[str, str], dict[str, float]]:
    """test id -> passed / failed / skipped, and its seconds, from pytest's junit report."""
    found, seconds = {}, {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        name = f"{path}::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
        seconds[name] = round(float(case.get("time", 0.0)), 1)
    return found, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", metavar="EXPR", help="only the second-tier tests matching EXPR (a partial run)")
    args = parser.parse_args()

    from trainperf.bench import tiers

    code = tiers.code_hash()
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run([*git, "status", "--porcelain", "src"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-m", "second_tier", f"--junitxml={junit}", "-p",
                "no:cacheprovider"] + (["-k", args.k] if args.k else [])
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT)
        seconds = time.perf_counter() - start
        tests, durations = outcomes(junit) if junit.is_file() else ({}, {})
    if tiers.code_hash() != code:
        print("the package's code changed while the second tier ran: nothing recorded", file=sys.stderr)
        return 1
    record = {"date": datetime.date.today().isoformat(), "commit": commit + ("+changes" if dirty else ""),
              "code": code if not args.k else f"partial ({args.k})", "duration_s": round(seconds),
              **{kind: sum(v == kind for v in tests.values()) for kind in ("passed", "failed", "skipped")},
              "exit": done.returncode, "tests": tests, "seconds": durations}
    tiers.RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"second tier: {record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped in "
          f"{seconds / 60:.1f} min; recorded in {tiers.RECORD}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
