"""The README stays true: its smallest complete workload runs through the harness to its target and
its log passes the official checker, and CI runs the README's test command."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from tests.conftest import read_log
from trainperf.harness import RunConfig, run
from trainperf.results.compliance import check
from trainperf.spec import RuntimeContext

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _example() -> dict:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- example-workload -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README: the example workload block is missing"
    module = types.ModuleType("readme_example")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(match.group(1), str(README), "exec"), module.__dict__)  # noqa: S102 - our own README
    return module.__dict__


def test_the_readme_example_workload_reaches_its_target(tmp_path):
    workload = _example()["Circles"]()
    recipe = workload.recipe("mini")
    assert workload.data_problems("mini", tmp_path)
    workload.prepare("mini", tmp_path, print)
    assert not workload.data_problems("mini", tmp_path)
    log = tmp_path / "log.txt"
    result = run(RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=tmp_path, seed=1, log_path=log),
                 RuntimeContext.create("cpu"))
    assert result.status == "success" and result.final_metric >= 0.95, result.abort_reason
    assert read_log(log)[-1]["metadata"]["status"] == "success"
    assert check(log).valid


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(pip install [^\n]*pytest[^\n]*)\n```", text)
    assert commands, "README: no test command in a bash block"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[0] in ci.splitlines()


def test_the_calibrated_medians_suite_estimates_from_are_the_readmes():
    """`suite` estimates its time left from each workload's `mini_median_s`: the README's table figure."""
    from trainperf import registry

    text = README.read_text(encoding="utf-8")
    for name in registry.names():
        workload = registry.get(name)
        row = next((line for line in text.splitlines() if f"| `{workload.benchmark}`" in line
                    and line.rstrip().endswith("|") and f"{workload.mini_median_s} s (median" in line), None)
        assert row is not None, f"{name}: README's workload table lacks '{workload.mini_median_s} s (median'"
