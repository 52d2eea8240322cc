"""The tiers' audit (tests/tiers.py) run on a test file of its own: an unmarked gate test that starts
trainperf (or a benchmarks/ script) in a process or trains past GATE_STEPS steps fails, naming the marker it
needs; a marked one and a short one pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = '''
import subprocess
import sys

import pytest
import torch

from trainperf.contract import ModelParts
from trainperf.runtime.step import TrainStep


def _steps(n):
    model = torch.nn.Linear(2, 1)
    parts = ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                       loss_fn=lambda m, batch: m(batch).pow(2).mean(), lr_schedule=lambda spe: (lambda s: 1.0))
    step = TrainStep(parts, None)
    for _ in range(n):
        step(torch.ones(4, 2))


def test_launches_unmarked():  # a benchmarks/ script in a process, as a trainperf run would be
    subprocess.run([sys.executable, "benchmarks/noop.py"], check=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_launches_marked():
    subprocess.run([sys.executable, "benchmarks/noop.py"], check=True)


def test_trains_past_the_gate_unmarked():
    _steps(25)


@pytest.mark.slow
@pytest.mark.to_target
def test_trains_to_target_marked():
    _steps(25)


def test_a_few_steps():
    _steps(4)
'''


@pytest.mark.slow  # a pytest of its own: seconds
def test_the_audit_fails_unmarked_tests_that_launch_or_train(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)
    (pytester.path / "benchmarks").mkdir()
    (pytester.path / "benchmarks" / "noop.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("-p", "tests.tiers", "-p", "no:cacheprovider", "-o",
                                           "markers=slow\nmultiprocess\nto_target\nsecond_tier\ncompile")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 2 and outcomes.get("passed") == 3, result.stdout.str()
    out = result.stdout.str()
    assert "test_launches_unmarked: it started processes" in out and "mark it `second_tier`" in out
    assert "test_trains_past_the_gate_unmarked: it trained 25 steps (the gate allows 24" in out
    assert "test budget" in out  # the budget is printed at the end of every run
