"""Where the test suite's time goes: the gate's total, its 20 slowest tests, and the seconds per test file
and per workload in each tier.

    python benchmarks/test_budget.py             # the recorded gate run (docs/gate-durations.json)
    python benchmarks/test_budget.py --measure   # run the gate (the README's pytest command) and record it
    python benchmarks/make_docs.py               # then: the tables in docs/testing.md

The gate's record is written by the suite's own plugin (tests/tiers.py, TRAINPERF_TEST_DURATIONS=FILE),
which also prints the same summary at the end of every pytest run, CI's included. The second tier's
seconds come from its record (docs/second-tier.json, benchmarks/second_tier.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainperf import registry  # noqa: E402
from trainperf.bench import tiers  # noqa: E402


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def gate_record(path: Path = tiers.GATE_RECORD) -> dict[str, Any] | None:
    return _load(path)


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 1 else ("<1" if value > 0 else "–")


def tables(gate: dict[str, Any] | None = None, second: dict[str, Any] | None = None) -> str:
    """The markdown tables of docs/testing.md: each test file's and each workload's seconds in the gate and
    in the second tier, from the two records."""
    gate = gate if gate is not None else gate_record()
    second = second if second is not None else tiers.last_second_tier()
    if not gate:
        return "No gate run recorded yet: `python benchmarks/test_budget.py --measure`.\n"
    names = registry.names()
    in_gate = tiers.budget(gate["durations"], names)
    in_second = tiers.budget((second or {}).get("seconds") or {}, names)
    lines = [f"The gate's last recorded run ({gate['date']}, this machine's 2 cores): {len(gate['durations'])} tests, "
             f"{gate.get('wall_s', in_gate['total_s']) / 60:.1f} minutes from start to end "
             f"({in_gate['total_s'] / 60:.1f} minutes of test time over its workers). The seconds below are test "
             "time, a test's own and its fixtures' (two workers: about half of it is wall time); a workload's "
             "are its own test file's and those of the tests parametrised by its name."]
    if second:
        lines.append(f"The second tier's last run ({second.get('date')}, commit {str(second.get('commit'))[:12]}): "
                     f"{second.get('passed', 0)} passed, {second.get('failed', 0)} failed, "
                     f"{second.get('skipped', 0)} skipped in {second.get('duration_s', 0) / 60:.0f} minutes.")
        for rerun in second.get("reruns") or []:  # a failure run again on the same code (--rerun-failed)
            lines[-1] += (f" `{rerun['test']}` failed in the whole run and {rerun['again']} when run again alone "
                          f"({rerun['date']}).")
    lines += ["", "| workload | gate (s) | second tier (s) |", "|---|--:|--:|"]
    for name in registry.names():
        g = in_gate["workloads"].get(name, 0.0)
        flag = " (over the 40 s budget)" if g > tiers.WORKLOAD_BUDGET_S else ""
        lines.append(f"| {name} | {_seconds(g)}{flag} | {_seconds(in_second['workloads'].get(name, 0.0))} |")
    lines += ["", "| test file | gate (s) | second tier (s) |", "|---|--:|--:|"]
    files = sorted(set(in_gate["files"]) | set(in_second["files"]),
                   key=lambda f: (-(in_gate["files"].get(f, 0.0) + in_second["files"].get(f, 0.0)), f))
    for path in files:
        lines.append(f"| `{path}` | {_seconds(in_gate['files'].get(path, 0.0))} | "
                     f"{_seconds(in_second['files'].get(path, 0.0))} |")
    return "\n".join(lines) + "\n"


def show(record: dict[str, Any]) -> None:
    found = tiers.budget(record["durations"], registry.names())
    print(f"gate ({record['date']}, -m {record.get('markexpr')}): {len(record['durations'])} tests, "
          f"{record.get('wall_s', 0) / 60:.1f} min from start to end, {found['total_s'] / 60:.1f} min in tests")
    for nodeid, seconds in found["slowest"]:
        print(f"{seconds:8.1f} s  {nodeid}")
    heavy = sorted(found["workloads"].items(), key=lambda kv: kv[1], reverse=True)
    print("per workload: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in heavy))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="run the gate now and record its durations")
    parser.add_argument("--record", type=Path, default=tiers.GATE_RECORD, help="the durations file")
    args = parser.parse_args(argv)
    if args.measure:
        env = {**os.environ, "TRAINPERF_TEST_DURATIONS": str(args.record.resolve())}
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                              env=env).returncode
        if code != 0:
            print(f"the gate failed (exit {code}); its durations are in {args.record}", file=sys.stderr)
            return code
    record = gate_record(args.record)
    if record is None:
        print(f"{args.record}: no gate run recorded (run with --measure)", file=sys.stderr)
        return 1
    show(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
