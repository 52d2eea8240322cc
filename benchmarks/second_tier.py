"""The second test tier: what trains for minutes (the minis to their targets, multi-process runs to target,
the graph checks), outside the gate. One command; its last run is recorded.

    python benchmarks/second_tier.py            # pytest -m second_tier, then docs/second-tier.json
    python benchmarks/second_tier.py -k maskrcnn   # a part of it (recorded as a partial run: no calibration)
    python benchmarks/second_tier.py --rerun-failed   # the last whole run's failures again, on the same code

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
    parser.add_argument("--rerun-failed", action="store_true",
                        help="run the last whole run's failed tests again on the very same code (a failure of a "
                             "loaded machine, say); if they pass now the record says so, both outcomes kept")
    args = parser.parse_args()

    from trainperf.bench import tiers

    code = tiers.code_hash()
    if args.rerun_failed:
        return rerun_failed(code)
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


def rerun_failed(code: str) -> int:
    """The last whole run's failed tests once more, on the code it ran on: each one's new outcome replaces the
    failure in the record, the first outcome kept under `reruns` (what a reader of docs/testing.md sees)."""
    from trainperf.bench import tiers

    record = tiers.last_second_tier()
    if record is None or record.get("code") != code:
        print(f"{tiers.RECORD}: the last whole run is not of this code ({(record or {}).get('code')}, this code is "
              f"{code}): run the whole second tier", file=sys.stderr)
        return 1
    failed = [name for name, outcome in record["tests"].items() if outcome == "failed"]
    if not failed:
        print("the last whole run had no failures: nothing to run again")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "second_tier", f"--junitxml={junit}",
                               "-p", "no:cacheprovider", "-n", "0", *failed], cwd=ROOT)
        seconds = time.perf_counter() - start
        tests, durations = outcomes(junit) if junit.is_file() else ({}, {})
    if tiers.code_hash() != code:
        print("the package's code changed while the tests ran: nothing recorded", file=sys.stderr)
        return 1
    reruns = record.setdefault("reruns", [])
    for name in failed:
        outcome = tests.get(name, "failed")
        reruns.append({"test": name, "first": "failed", "again": outcome, "date": datetime.date.today().isoformat(),
                       "seconds": durations.get(name)})
        record["tests"][name] = outcome
    for kind in ("passed", "failed", "skipped"):
        record[kind] = sum(v == kind for v in record["tests"].values())
    record["exit"] = 0 if record["failed"] == 0 else 1
    record["duration_s"] = round(record["duration_s"] + seconds)
    tiers.RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"second tier, {len(failed)} failed test(s) run again: {sum(tests.get(n) == 'passed' for n in failed)} "
          f"passed; recorded in {tiers.RECORD}")
    return 0 if done.returncode == 0 else done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
