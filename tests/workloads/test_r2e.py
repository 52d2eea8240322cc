"""R2E-Gym's task rows read as the reference writes them, and its grading rule held to a re-statement of
R2E-Gym's parse_log_pytest and _calculate_reward_r2e; the unittest runner's summary graded end to end."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from trainperf.errors import TrainperfError
from trainperf.workloads.common.rl import jail, r2e, sandbox

TESTS = {"r2e_tests/test_1.py": "import unittest\nfrom solution import f\n\n\nclass TestF(unittest.TestCase):\n"
         + "".join(f"    def test_{i}(self):\n        self.assertEqual(f({i}), {3 * i})\n" for i in range(3))}
EXPECTED = {f"TestF.test_{i}": "PASSED" for i in range(3)}


def _row(**changes: object) -> dict:
    row = r2e.build_row("acme__calc-" + "a" * 40, "acme/calc", "f triples its argument", TESTS, EXPECTED,
                        "swe_agents_val")
    for path, value in changes.items():
        *parents, last = path.split(".")
        target = row
        for p in parents:
            target = target[p]
        target[last] = value
    return row


def _write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return path


def test_a_row_in_the_references_layout_is_read() -> None:
    row = _row()
    assert list(row) == ["responses_create_params", "agent_ref"]
    assert list(row["responses_create_params"]["metadata"]) == list(r2e.METADATA_KEYS)
    task = r2e.parse_row(row, "x")
    assert (task.instance_id, task.repo, task.repo_name, task.agent) == ("acme__calc-" + "a" * 40, "acme/calc",
                                                                         "calc", "swe_agents_val")
    assert task.expected == EXPECTED and task.test_files == TESTS


@pytest.mark.parametrize("change, message", [
    ({"agent_ref.type": "x"}, "agent_ref"),
    ({"responses_create_params.input": ["hi"]}, "input"),
    ({"responses_create_params.metadata.split": 3}, "split must be a string"),
    ({"responses_create_params.metadata.instance_dict": "{oops"}, "instance_dict is not valid JSON"),
    ({"responses_create_params.metadata.repo": "other/repo"}, "instance_dict.repo differs"),
])
def test_a_damaged_row_is_refused_in_one_line_naming_its_line(tmp_path: Path, change: dict, message: str) -> None:
    path = _write(tmp_path, [_row(), _row(**change)])
    with pytest.raises(TrainperfError, match=re.escape(message)) as err:
        list(r2e.read_tasks(path))
    assert str(err.value).startswith(f"{path}:2: ") and "\n" not in str(err.value)


def test_damaged_inner_fields_and_lines_are_refused(tmp_path: Path) -> None:
    row = _row()
    inner = json.loads(row["responses_create_params"]["metadata"]["instance_dict"])
    for key, value, message in (("expected_output_json", json.dumps({"t": "SKIPPED"}), "SKIPPED"),
                                ("container_id", "0", "container_id"), ("FAIL_TO_PASS", ["t"], "FAIL_TO_PASS"),
                                ("execution_result_content", json.dumps({"test_file_names": ["a"]}), "test_file")):
        broken = json.loads(json.dumps(row))
        changed = dict(inner, **{key: value})
        broken["responses_create_params"]["metadata"]["instance_dict"] = json.dumps(changed)
        with pytest.raises(TrainperfError, match=message):
            r2e.parse_row(broken, "x")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n" + json.dumps(row).encode() + b"\n{not json\n")
    with pytest.raises(TrainperfError, match=r"bad.jsonl:3: not a JSON object"):
        list(r2e.read_tasks(path))
    with pytest.raises(TrainperfError, match="cannot read"):
        list(r2e.read_tasks(tmp_path / "missing.jsonl"))


def _reference_parse(log: str) -> dict[str, str]:
    # R2E-Gym src/r2egym/repo_analysis/execution_log_parser.py::parse_log_pytest, re-stated
    if "short test summary info" not in log:
        return {}
    out = {}
    for line in log.split("short test summary info")[1].strip().split("\n"):
        if "PASSED" in line:
            out[".".join(line.split("::")[1:])] = "PASSED"
        elif "FAILED" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "FAILED"
        elif "ERROR" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "ERROR"
    return out


def _reference_reward(log: str, expected: dict[str, str]) -> bool:
    # runtime/docker.py::_calculate_reward_r2e (decolor_dict_keys, " - " cut, count and status match)
    def decolor(d: dict) -> dict:
        return {re.sub(r"\x1b\[\d+m", "", k): v for k, v in d.items()}
    parse, want = decolor(_reference_parse(log)), decolor(expected)
    parse = {k.split(" - ")[0]: parse[k] for k in sorted(parse)}
    want = {k.split(" - ")[0]: want[k] for k in sorted(want)}
    if len(parse) != len(want):
        return False
    return all(parse[k] == want.get(k) for k in parse if k)


def test_grading_equals_r2e_gyms_on_random_logs() -> None:
    rng = random.Random(0)
    names = ["TestF.test_0", "TestF.test_1", "test_top", "TestG::test_x"]
    agree = 0
    for _ in range(400):
        lines = [f"{rng.choice(r2e.STATUSES)} r2e_tests/test_1.py::{n.replace('.', '::')}"
                 + rng.choice(["", " - AssertionError: 1 != 2", " - x"]) for n in rng.sample(names, rng.randint(0, 4))]
        if rng.random() < 0.2:
            lines.append("ERROR r2e_tests/test_2.py")
        head = rng.choice(["collected 3 items\nPASSED nothing", ""])
        log = head + "\n===== short test summary info =====\n" + "\n".join(lines) if rng.random() < 0.9 else head
        expected = {n.replace("::", "."): rng.choice(["PASSED", "PASSED", "FAILED"])
                    for n in rng.sample(names, rng.randint(1, 4))}
        assert r2e.parse_test_log(log) == _reference_parse(log)
        assert r2e.resolved(log, expected) == _reference_reward(log, expected)
        agree += r2e.resolved(log, expected)
    assert 0 < agree < 400


@pytest.mark.skipif(jail.landlock_abi() < 1, reason="the sandbox needs Linux Landlock")
def test_the_unittest_runner_prints_the_summary_the_grader_reads() -> None:
    runner = (Path(r2e.__file__).parent / "task_runner.py").read_text()
    verdicts = []
    for solution in ("def f(x):\n    return 3 * x\n", "def f(x):\n    return 3 * x if x != 2 else 0\n", "def f(x) ="):
        out = sandbox.run({"task_runner.py": runner, "solution.py": solution, **TESTS},
                          ["python", "task_runner.py", "r2e_tests"])
        verdicts.append((r2e.resolved(out.stdout, EXPECTED), r2e.parse_test_log(out.stdout)))
    assert verdicts[0] == (True, EXPECTED)
    assert verdicts[1] == (False, dict(EXPECTED, **{"TestF.test_2": "FAILED"}))
    assert verdicts[2][0] is False and set(verdicts[2][1].values()) == {"ERROR"}


@pytest.mark.skipif(jail.landlock_abi() < 1, reason="the sandbox needs Linux Landlock")
def test_completions_are_graded_in_the_pool_and_a_repeated_text_runs_once() -> None:
    from trainperf.workloads.common.rl.rewards import SandboxRewarder

    tasks = [r2e.parse_row(_row(), "x")]
    with sandbox.Pool(workers=2) as pool:
        rewarder = SandboxRewarder(pool, tasks, decode=lambda t: "".join(map(chr, t)),
                                   files_of=lambda task, text: {"solution.py": f"def f(x):\n    return {text}\n"},
                                   limits=sandbox.Limits(wall_s=2.0, cpu_s=2), memo=2)
        texts = ["3 * x", "x + x + x", "2 * x", "3 * x", "__import__('time').sleep(9)", "x * 3"]
        assert rewarder.grade([(0, t) for t in texts]) == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
        assert rewarder.runs == 5
