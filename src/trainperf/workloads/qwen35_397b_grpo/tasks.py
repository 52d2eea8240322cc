"""The mini's programming tasks: one-line integer functions to write from a short specification, each
with hidden unit tests, stored as R2E-Gym rows (`common/rl/r2e.py`) in the reference's two files.

A task is a kind and two digits: `pow 3 5` asks for f(n) = n**3 + 5. Ten kinds, each with one bug that
programmers write (`^` for `**`, `/` for `//`, an exclusive range end for an inclusive one, `int` for
`round`, ...). The tests call `solution.f(n)` for n = 0..15 and compare values and types; every bug fails
at least one of them (checked when the tasks are made).

The mini's base policy learns from a teacher that writes a kind's bug at that kind's rate
(`TEACHER_BUG_RATE`): for three kinds the teacher is mostly right, for seven mostly wrong. Sampled at the
validation temperature (0.1) such a base writes the bug on those seven kinds, so its pass@4 is low; at the
training temperature (1.0) it writes the right program often enough for group-relative rewards to find it.
GRPO must turn those seven kinds around: the mini's target measures that.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainperf.workloads.common.rl import r2e

# spec word, the right expression, the bug (a and b are the task's digits)
KINDS: tuple[tuple[str, str, str], ...] = (
    ("pow", "n**{a}+{b}", "n^{a}+{b}"),
    ("div", "n//{a}+{b}", "n/{a}+{b}"),
    ("sum", "sum(range({a},n+{b}+1))", "sum(range({a},n+{b}))"),
    ("cnt", "len(range({a},n+1,{b}))", "len(range({a},n,{b}))"),
    ("mul", "(n+{b})%{a}==0", "(n+{b})%{a}"),
    ("abs", "abs(n-{a})+{b}", "n-{a}+{b}"),
    ("avg", "(n+{a})/2+{b}", "n+{a}/2+{b}"),
    ("sqr", "n*n-{a}+{b}", "n*2-{a}+{b}"),
    ("rnd", "round(n/{a})+{b}", "int(n/{a})+{b}"),
    ("top", "max(n,{a})+{b}", "min(n,{a})+{b}"),
)
TEACHER_BUG_RATE = (0.7, 0.6, 0.75, 0.2, 0.65, 0.25, 0.7, 0.6, 0.2, 0.65)
INPUTS = tuple(range(16))
TEST_GROUPS = 4  # test methods per task, each checking len(INPUTS) / TEST_GROUPS inputs
REPO = "trainperf/intfuncs"
AGENT = "swe_agents_train"  # the reference's agent name in its rows
TRAIN_FILE = "benchmark_r2e_gym_easy_train.jsonl"
VAL_FILE = "benchmark_r2e_gym_easy_val.jsonl"
# The reference's newer training file (NeMo-RL's curriculum order of the same rows), read when present.
CURRICULUM_FILE = "benchmark_r2e_gym_easy_train.filtered.curriculum-v2-classic-cycles2-seed20260710.jsonl"
SOLUTION = "solution.py"
ALPHABET = "\n abcdefghijklmnopqrstuvwxyz0123456789*^/%+-(),=:<>."
VALIDATION = 64  # held-out tasks of the mini
SPLIT_SEED = 20_261_129  # the fixed shuffle that holds them out (the base never trains on them)
MARKER = "intfuncs.json"  # written last by the mini's generator: what says a folder is the mini's


@dataclass(frozen=True)
class Spec:
    kind: int
    a: int
    b: int

    @property
    def statement(self) -> str:
        return f"{KINDS[self.kind][0]} {self.a} {self.b}"

    @property
    def right(self) -> str:
        return KINDS[self.kind][1].format(a=self.a, b=self.b)

    @property
    def bug(self) -> str:
        return KINDS[self.kind][2].format(a=self.a, b=self.b)


def specs() -> list[Spec]:
    """Every task: ten kinds x a in 2..9 x b in 1..9 (720)."""
    return [Spec(k, a, b) for k in range(len(KINDS)) for a in range(2, 10) for b in range(1, 10)]


def _values(expression: str) -> list[object]:
    function: Callable[[int], object] = eval("lambda n: " + expression)  # noqa: S307 (the generator's own text)
    return [function(n) for n in INPUTS]


def test_file(spec: Spec) -> str:
    """The hidden tests: unittest methods comparing f(n)'s value and type with the right program's."""
    expected = _values(spec.right)
    per = len(INPUTS) // TEST_GROUPS
    lines = ["import unittest", "", "from solution import f", "", "", "class TestF(unittest.TestCase):"]
    for group in range(TEST_GROUPS):
        lines.append(f"    def test_inputs_{group}(self):")
        for n in INPUTS[group * per:(group + 1) * per]:
            lines.append(f"        self.assertEqual((f({n}), type(f({n})).__name__), "
                         f"({expected[n]!r}, {type(expected[n]).__name__!r}))")
        lines.append("")
    return "\n".join(lines)


def expected_statuses() -> dict[str, str]:
    """The statuses that resolve a task, as R2E-Gym's parser names them."""
    return {f"TestF.test_inputs_{g}": "PASSED" for g in range(TEST_GROUPS)}


def row(spec: Spec, split: str) -> dict:
    """The task as an R2E-Gym row, as the reference's converter lays it out."""
    instance = f"intfuncs__{KINDS[spec.kind][0]}-{spec.a}{spec.b}"
    made = r2e.build_row(instance, REPO, spec.statement, {"r2e_tests/test_1.py": test_file(spec)},
                         expected_statuses(), AGENT, container_id=spec.kind)
    made["responses_create_params"]["metadata"]["split"] = split
    return made


def check_bugs_fail() -> None:
    """Every kind's bug differs from its right program on some input, for every task (the generator's guard)."""
    for spec in specs():
        right, wrong = _values(spec.right), _values(spec.bug)
        if [(v, type(v)) for v in right] == [(v, type(v)) for v in wrong]:
            raise AssertionError(f"{spec.statement}: the bug {spec.bug} passes the tests")


def split_specs(validation: int, seed: int) -> tuple[list[Spec], list[Spec]]:
    """(train, validation): a fixed shuffle of every task, the first `validation` held out."""
    every = specs()
    random.Random(seed).shuffle(every)
    return every[validation:], every[:validation]


def write(folder: Path, validation: int, seed: int) -> tuple[int, int]:
    """The train and validation files in `folder` (atomically, each); returns their row counts."""
    check_bugs_fail()
    train, val = split_specs(validation, seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, chosen, split in ((TRAIN_FILE, train, "train"), (VAL_FILE, val, "val")):
        partial = folder / (name + ".partial")
        with open(partial, "w", encoding="utf-8") as out:
            for spec in chosen:
                out.write(json.dumps(row(spec, split)) + "\n")
        partial.replace(folder / name)
    return len(train), len(val)


def spec_of(task: r2e.Task) -> Spec | None:
    """The generated task's spec from its statement (None for a task that is not the mini's)."""
    parts = task.problem_statement.split()
    words = [k[0] for k in KINDS]
    if len(parts) != 3 or parts[0] not in words or not all(p.isdigit() for p in parts[1:]):
        return None
    return Spec(words.index(parts[0]), int(parts[1]), int(parts[2]))


def teacher(specs_: list[Spec], rng: random.Random) -> Iterator[tuple[str, str]]:
    """(statement, program) pairs written by the mini's teacher: a kind's bug at its TEACHER_BUG_RATE."""
    while True:
        spec = rng.choice(specs_)
        yield spec.statement, spec.bug if rng.random() < TEACHER_BUG_RATE[spec.kind] else spec.right


def solution_files(task: r2e.Task, text: str) -> dict[str, str]:
    """What a completion becomes: the module its tests import, the completion as f's return expression
    (its stop token and surrounding blanks removed)."""
    return {SOLUTION: "def f(n):\n    return " + text.strip() + "\n"}
