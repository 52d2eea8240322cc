"""The docs' generated parts, from the code and the calibration file: the README's workload table and
command table, and the summary at the top of every workload's page (docs/workloads/<name>.md).

    python benchmarks/make_docs.py           # rewrite the generated regions
    python benchmarks/make_docs.py --check   # exit 1 if any is out of date (tests/test_docs.py runs this)

A generated region sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`; everything
else in the docs is written by hand. After `benchmarks/mini_ttt.py --record`, run this to update the
tables with the new calibration.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import test_budget  # benchmarks/test_budget.py: the recorded gate and second-tier runs

from trainperf import calibration, registry
from trainperf.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
REGION = re.compile(r"(<!-- generated:(?P<name>[a-z0-9:_-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def calibration_text(c: calibration.Calibration) -> str:
    spread = f" ({_seconds(c.min_s)}–{_seconds(c.max_s)} s)" if c.min_s is not None else ""
    return f"{c.reached} of {c.seeds} seeds, median {c.median_s:.1f} s{spread}, {c.progress}"


def title(name: str) -> str:
    """The workload's name as its docs page's first heading gives it ("# ResNet-50 v1.5 (`resnet`)")."""
    page = ROOT / "docs" / "workloads" / f"{name}.md"
    if not page.is_file():
        raise SystemExit(f"{page.relative_to(ROOT)}: missing (every workload has a docs page)")
    first = page.read_text(encoding="utf-8").splitlines()[0]
    return re.sub(r"^#\s*|\s*\(`[^`]*`\)\s*$", "", first)


def workload_table() -> str:
    lines = ["| workload | MLPerf key (ruleset) | metric | full target | mini target "
             "| mini: trivial baseline → best seen "
             "| mini time-to-train, 2-core CPU |",
             "|---|---|---|---|---|---|---|"]
    for name in registry.names():
        w = registry.get(name)
        found = calibration.main(name)
        ttt = (f"{found.median_s:.1f} s (median; {found.reached}/{found.seeds} seeds)" if found
               else "not calibrated" if "mini" in w.scales else "full scale only")
        span = f"{found.baseline} → {found.best}" if found and found.baseline else "-"
        mini = w.metric.describe_target(w.recipe("mini").target) if "mini" in w.scales else "-"
        lines.append(f"| [{title(name)}](docs/workloads/{name}.md) `{name}` | `{w.benchmark}` ({w.mlperf.ruleset}) "
                     f"| {w.metric.name} | {w.metric.describe_target(w.recipe('full').target)} "
                     f"| {mini} | {span} | {ttt} |")
    return "\n".join(lines) + "\n"


def commands_table() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    lines = ["| command | what it does |", "|---|---|"]
    for choice in sub._choices_actions:
        lines.append(f"| [`trainperf {choice.dest}`](docs/commands.md#trainperf-{choice.dest}) | {choice.help} |")
    return "\n".join(lines) + "\n"


def workload_summary(name: str) -> str:
    w = registry.get(name)
    full = w.recipes("full")
    mini = (f"; mini {w.metric.describe_target(w.recipe('mini').target)}" if "mini" in w.scales
            else " (full scale only)")
    direction = "higher is better" if w.metric.higher_is_better else "lower is better"
    rows = [
        ("what", w.summary), ("MLPerf key", f"`{w.benchmark}`"), ("compliance ruleset", w.mlperf.ruleset),
        ("metric", f"{w.metric.name} ({direction})"),
        ("targets", f"full {w.metric.describe_target(next(iter(full.values())).target)}{mini}"),
        ("full recipes (`--recipe`)", ", ".join(f"`{r}`" for r in full)),
        ("runs MLPerf scores", f"{w.mlperf.runs}, the olympic mean dropping {w.mlperf.olympic_drop} at each end"),
        ("speedup switches", ", ".join(sorted(w.speedups)) or "-"),
    ]
    for c in sorted((c for c in calibration.load() if c.workload == name), key=lambda c: (c.nproc, c.sets)):
        how = " ".join(c.sets) or "the mini recipe"
        where = f", {c.nproc} processes" if c.nproc > 1 else ""
        note = f"; {c.note}" if c.note else ""
        rows.append((f"calibration: {how}{where}",
                     f"{calibration_text(c)} ({c.machine}, {c.date}; `{c.command}`{note})"))
        if c.baseline:
            rows.append(("mini: trivial baseline, best seen", f"{c.baseline}; {c.best}"))
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def generated(name: str) -> str:
    if name == "workloads":
        return workload_table()
    if name == "commands":
        return commands_table()
    if name.startswith("summary:"):
        return workload_summary(name.split(":", 1)[1])
    if name == "test-budget":
        return test_budget.tables()
    raise SystemExit(f"unknown generated region {name!r}")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def render(text: str) -> str:
    return REGION.sub(lambda m: m.group(1) + generated(m.group("name")) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated region is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in stale:
        print(f"{path.relative_to(ROOT)}: {'out of date' if args.check else 'updated'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
