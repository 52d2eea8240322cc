"""The two tiers of the suite, kept honest (a pytest plugin, loaded by conftest.py).

- The gate (`python -m pytest -q`, CI's command; `addopts` deselects the second tier): every unit,
  contract, conformance, fuzzing, docs and safety test, each mini's first steps against its golden record,
  the fast minis to their targets and one short multi-process test per engine. `-m "not slow"` leaves
  out the gate's seconds-long ones too: everyday work.
- The second tier (`python benchmarks/second_tier.py`, i.e. `pytest -m second_tier`): what trains for
  minutes — the other minis to their targets, multi-process runs to target, the graph checks.

The audit: a test of the gate that launches processes must be marked `multiprocess` (and `slow`), one
that trains more than GATE_STEPS harness steps must be marked `to_target` (and `slow`) — the fast minis
trained to their targets — or belong to the second tier. Anything else fails, saying which marker. Every
second-tier test is also `slow`.

At the end of every run the plugin prints the run's budget: its total, the 20 slowest tests, and the
seconds each workload adds (its own test file and the tests parametrised by its name); with
TRAINPERF_TEST_DURATIONS=FILE it also writes every test's duration and tier there as JSON
(benchmarks/test_budget.py turns it into the table in docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# Harness steps a gate test may train without being marked `to_target`: the golden records' few steps and a
# short run's, not a mini trained to its target.
GATE_STEPS = 24


class _Audit:
    def __init__(self) -> None:
        self.steps = 0
        self.launches: list[str] = []


_current: _Audit | None = None


def _count_step() -> None:
    if _current is not None:
        _current.steps += 1


def _count_launch(what: str) -> None:
    if _current is not None:
        _current.launches.append(what)


def _install() -> None:
    """Counters around the harness's training step and every way the tests start processes: torch's
    elastic launcher (trainperf's and the tests' own), and Python or trainperf run in a subprocess."""
    from torch.distributed.launcher import api as launcher

    from trainperf.runtime import step

    call = step.TrainStep.__call__

    def counted_call(self: Any, batch: Any) -> Any:
        # A step of trainperf's workloads (or of a model stepped directly) costs milliseconds to seconds; the
        # contract's fakes (tests/harness/fakes.py, the docs' example) step in microseconds and are not counted.
        owner = getattr(self.split, "__self__", None)
        if owner is None or type(owner).__module__.startswith("trainperf."):
            _count_step()
        return call(self, batch)

    step.TrainStep.__call__ = counted_call
    launch = launcher.elastic_launch.__call__

    def counted_launch(self: Any, *args: Any) -> Any:
        _count_launch(f"elastic launch of {self._config.nproc_per_node} processes")
        return launch(self, *args)

    launcher.elastic_launch.__call__ = counted_launch
    popen = subprocess.Popen.__init__

    def counted_popen(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        if _runs_trainperf([str(a) for a in (args if isinstance(args, (list, tuple)) else str(args).split())]):
            _count_launch(" ".join(str(a) for a in args[:5]) if isinstance(args, (list, tuple)) else str(args))
        popen(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = counted_popen


def _runs_trainperf(argv: list[str]) -> bool:
    """A subprocess that is a training run or a tool of ours (its start-up alone costs seconds): trainperf
    itself, torchrun, a benchmarks/ script. Not the official checker or pip, which the tests call as tools."""
    if not argv:
        return False
    exe = Path(argv[0]).name
    if exe.startswith(("trainperf", "torchrun")):
        return True
    if exe.startswith("python") or argv[0] == sys.executable:
        rest = argv[1:]
        module = rest[rest.index("-m") + 1] if "-m" in rest[:-1] else None
        script = bool(rest) and Path(rest[0]).parent.name == "benchmarks"
        return module in ("trainperf", "torch.distributed.run") or script
    return False


_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    _install()
    config._trainperf_durations = {}  # type: ignore[attr-defined]
    config._trainperf_started = time.monotonic()  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _current
    _current = _Audit()
    item._trainperf_audit = _current  # type: ignore[attr-defined]
    try:
        yield
    finally:
        _current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or report.outcome != "passed":
        return
    problem = tier_problem(item, item._trainperf_audit)  # type: ignore[attr-defined]
    if problem:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: {problem}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's setup, call and teardown seconds, as the process that prints the summary receives them
    (pytest-xdist's controller included)."""
    durations = _config._trainperf_durations if _config is not None else None  # type: ignore[attr-defined]
    if durations is not None:
        durations[report.nodeid] = durations.get(report.nodeid, 0.0) + report.duration


def tier_problem(item: pytest.Item, audit: _Audit) -> str | None:
    """Why a test's markers do not say what it did (None when they do)."""
    marks = {m.name for m in item.iter_markers()}
    if "second_tier" in marks:
        return None
    if audit.launches and not {"multiprocess", "slow"} <= marks:
        return (f"it started processes ({audit.launches[0]}{', …' if len(audit.launches) > 1 else ''}): mark it "
                "`second_tier`, or, if it is one of the gate's short multi-process tests, `multiprocess` and `slow`")
    if audit.steps > GATE_STEPS and not {"to_target", "slow"} <= marks:
        return (f"it trained {audit.steps} steps (the gate allows {GATE_STEPS} without a marker): mark it "
                "`second_tier`, or, if it trains a fast mini to its target, `to_target` and `slow`")
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # before the markers select: `-m "not slow"` never runs a second-tier test
        if item.get_closest_marker("compile") and not item.get_closest_marker("second_tier"):
            item.add_marker(pytest.mark.second_tier)  # the graph checks take minutes
        if item.get_closest_marker("second_tier") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    durations = config._trainperf_durations  # type: ignore[attr-defined]
    if not durations or hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller prints
        return
    from trainperf import registry
    from trainperf.bench.tiers import WORKLOAD_BUDGET_S, budget

    found = budget(durations, registry.names())
    write = terminalreporter.write_line
    terminalreporter.section("test budget")
    expr = config.getoption("markexpr") or "(all)"
    wall = time.monotonic() - config._trainperf_started  # type: ignore[attr-defined]
    write(f"{len(durations)} tests ({expr}): {found['total_s'] / 60:.1f} min of test time, "
          f"{wall / 60:.1f} min from start to end")
    for nodeid, seconds in found["slowest"]:
        write(f"{seconds:8.1f} s  {nodeid}")
    heavy = sorted(found["workloads"].items(), key=lambda kv: kv[1], reverse=True)
    write("per workload: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in heavy))
    over = [name for name, seconds in heavy if seconds > WORKLOAD_BUDGET_S]
    if over and "second_tier" not in expr.replace("not second_tier", ""):
        write(f"over the {WORKLOAD_BUDGET_S:.0f} s a workload may add to the gate: {', '.join(over)}")
    out = os.environ.get("TRAINPERF_TEST_DURATIONS")
    if out:
        wall = time.monotonic() - config._trainperf_started  # type: ignore[attr-defined]
        Path(out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "markexpr": expr, "wall_s": round(wall),
                                         "durations": {k: round(v, 2) for k, v in durations.items()}},
                                        indent=1) + "\n")
