"""R2E-Gym tasks as the v6.1 reference stores and grades them.

**Rows.** One JSON object a line (`benchmark_r2e_gym_easy_{train...,val}.jsonl`), written by NeMo-RL's
`tools/create_r2e_gym_easy_subset_jsonl.py` (`convert_row`; its `validate_converted_row` is the strict
check this reader mirrors): top-level `responses_create_params` and `agent_ref` only;
`responses_create_params.input` empty; ten `metadata` keys, of which `instance_dict` is a JSON string
whose `parsed_commit_content`, `execution_result_content` and `expected_output_json` are JSON strings
again; `FAIL_TO_PASS`/`PASS_TO_PASS` empty; `container_id` an integer.

**Grading** (nv-R2E-Gym's `run_local_evaluation` over R2E-Gym's `execution_log_parser.parse_log_pytest`
and `DockerRuntime._calculate_reward_r2e`): the task's `run_tests.sh` prints pytest's `-rA` summary (or,
for unittest suites, a runner's summary in the same form); after "short test summary info" each line
with PASSED, FAILED or ERROR names a test by what follows the file path, `::` joined by "."; the patch
resolves the task when that mapping has exactly the keys of `expected_output_json`, each with the same
status. The exit code is not read. Reward 1.0 or 0.0 (NeMo Gym `swe_agents/app.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError, shown

METADATA_KEYS = ("instance_id", "base_commit", "dataset_name", "split", "problem_statement", "hints_text",
                 "version", "created_at", "instance_dict", "repo")
STATUSES = ("PASSED", "FAILED", "ERROR")
_COLOR = re.compile(r"\x1b\[\d+m")


@dataclass(frozen=True)
class Task:
    """What the loop needs of one row: its identity, the issue the policy is shown, the tests and the
    statuses that resolve it, and the row itself (the container and agent read the rest)."""

    instance_id: str
    repo: str
    repo_name: str
    base_commit: str
    problem_statement: str
    agent: str
    expected: dict[str, str]
    test_files: dict[str, str]
    row: dict[str, Any]


def _json_field(where: str, value: object, name: str) -> dict:
    if not isinstance(value, str):
        raise TrainperfError(f"{where}: {name} must be a JSON string, got {type(value).__name__}")
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise TrainperfError(f"{where}: {name} is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except (ValueError, RecursionError) as exc:
        raise TrainperfError(f"{where}: {name} is not valid JSON ({shown(str(exc), 60)})") from None
    if not isinstance(decoded, dict):
        raise TrainperfError(f"{where}: {name} must hold a JSON object, got {type(decoded).__name__}")
    return decoded


def _string(where: str, mapping: dict, key: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str):
        raise TrainperfError(f"{where}: {key} must be a string, got {shown(repr(value), 40)}")
    return value


def parse_row(row: object, where: str) -> Task:
    """One decoded row as a Task, or one line naming `where` and the field at fault."""
    if not isinstance(row, dict) or set(row) != {"responses_create_params", "agent_ref"}:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise TrainperfError(f"{where}: a row has exactly responses_create_params and agent_ref, got {keys}")
    params, agent = row["responses_create_params"], row["agent_ref"]
    if not isinstance(params, dict) or params.get("input") != [] or not isinstance(params.get("metadata"), dict):
        raise TrainperfError(f"{where}: responses_create_params must hold input [] and a metadata object")
    if not isinstance(agent, dict) or agent.get("type") != "responses_api_agents" or not isinstance(
            agent.get("name"), str):
        raise TrainperfError(f"{where}: agent_ref must be {{type: responses_api_agents, name: ...}}")
    meta = params["metadata"]
    if set(meta) != set(METADATA_KEYS):
        missing, extra = sorted(set(METADATA_KEYS) - set(meta)), sorted(set(meta) - set(METADATA_KEYS))
        raise TrainperfError(f"{where}: metadata keys differ from the reference's (missing {missing}, "
                             f"unexpected {extra})")
    for key in METADATA_KEYS:
        _string(where, meta, key)
    inner = _json_field(where, meta["instance_dict"], "metadata.instance_dict")
    for key in ("instance_id", "base_commit", "repo"):
        if inner.get(key) != meta[key]:
            raise TrainperfError(f"{where}: instance_dict.{key} differs from metadata.{key}")
    if inner.get("FAIL_TO_PASS") != [] or inner.get("PASS_TO_PASS") != []:
        raise TrainperfError(f"{where}: instance_dict.FAIL_TO_PASS and PASS_TO_PASS must be empty lists")
    if type(inner.get("container_id")) is not int:
        raise TrainperfError(f"{where}: instance_dict.container_id must be an integer")
    repo_name = _string(where, inner, "repo_name")
    expected = _json_field(where, inner.get("expected_output_json"), "instance_dict.expected_output_json")
    bad = [k for k, v in expected.items() if v not in STATUSES]
    if bad or not expected:
        raise TrainperfError(f"{where}: expected_output_json maps test names to {'/'.join(STATUSES)}"
                             + (f"; {shown(bad[0], 40)} has {shown(repr(expected[bad[0]]), 20)}" if bad
                                else ": it is empty"))
    execution = _json_field(where, inner.get("execution_result_content"), "instance_dict.execution_result_content")
    names, codes = execution.get("test_file_names"), execution.get("test_file_codes")
    if not (isinstance(names, list) and isinstance(codes, list) and len(names) == len(codes)
            and all(isinstance(x, str) for x in names + codes)):
        raise TrainperfError(f"{where}: execution_result_content needs test_file_names and test_file_codes, "
                             "two lists of strings of one length")
    _json_field(where, inner.get("parsed_commit_content"), "instance_dict.parsed_commit_content")
    return Task(meta["instance_id"], meta["repo"], repo_name, meta["base_commit"], meta["problem_statement"],
                agent["name"], dict(expected), dict(zip(names, codes, strict=True)), row)


def read_tasks(path: Path) -> Iterator[Task]:
    """The tasks of a JSONL file, in its order; a damaged line refused with its file and line number."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below; a generator)
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TrainperfError(f"{where}: not UTF-8 text (byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainperfError(f"{where}: not a JSON object ({exc.msg} at column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:  # a number past Python's digit limit, nesting too deep
                raise TrainperfError(f"{where}: not a JSON object ({shown(str(exc), 60)})") from None
            yield parse_row(row, where)


def parse_test_log(log: str) -> dict[str, str]:
    """Test name -> status from a pytest `-rA` summary (R2E-Gym's `parse_log_pytest`, re-stated): nothing
    before "short test summary info" counts; a test's name is what follows its file path."""
    marker = "short test summary info"
    if marker not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split(marker, 1)[1].strip().split("\n"):
        for status in STATUSES:
            if status in line:
                name = ".".join(line.split("::")[1:])
                if status != "PASSED":
                    name = name.split(" - ")[0]
                statuses[name] = status
                break
    return statuses


def resolved(log: str, expected: dict[str, str]) -> bool:
    """Whether a test run's log resolves its task: as many tests as expected, each with its expected
    status (colour codes and " - " messages stripped from the names; a name not expected fails)."""
    found = {_COLOR.sub("", k).split(" - ")[0]: v for k, v in parse_test_log(log).items()}
    want = {_COLOR.sub("", k).split(" - ")[0]: v for k, v in expected.items()}
    # counted, never compared: nv-R2E-Gym skips the empty name (a summary line with no "::")
    return len(found) == len(want) and all(want.get(name) == status for name, status in found.items() if name)


def build_row(instance_id: str, repo: str, problem_statement: str, test_files: dict[str, str],
              expected: dict[str, str], agent: str, base_commit: str = "0" * 40, commit_hash: str = "1" * 40,
              container_id: int = 0, created_at: str = "") -> dict[str, Any]:
    """A row in the reference's layout (what `convert_row` writes, its fields in its order) for a task of
    trainperf's own: the generated mini's tasks are stored exactly as R2E-Gym's are."""
    repo_name = repo.split("/")[-1].lower()
    parsed = {"file_diffs": [], "old_commit_hash": base_commit, "new_commit_hash": commit_hash,
              "commit_message": "", "commit_date": created_at, "metadata": {}}
    execution = {"repo_name": repo_name, "new_commit_hash": commit_hash, "test_file_codes": list(test_files.values()),
                 "test_file_names": list(test_files), "setup_res_code": 0, "setup_res_stdout": "",
                 "setup_res_stderr": ""}
    inner = {"FAIL_TO_PASS": [], "PASS_TO_PASS": [], "created_at": created_at, "hints_text": "", "version": "",
             "instance_id": instance_id, "base_commit": base_commit, "repo": repo,
             "problem_statement": problem_statement, "repo_name": repo_name,
             "docker_image": f"trainperf/{repo_name}_final:{commit_hash}", "commit_hash": commit_hash,
             "parsed_commit_content": json.dumps(parsed), "execution_result_content": json.dumps(execution),
             "modified_files": [], "modified_entity_summaries": [], "relevant_files": [], "num_non_test_files": 1,
             "num_non_test_func_methods": 1, "num_non_test_lines": 1, "prompt": "",
             "expected_output_json": json.dumps(expected), "container_formatter": "", "container_id": container_id,
             "dataset_name": "R2E-Gym/R2E-Gym-Subset", "split": "train", "resolved_commit": commit_hash,
             "repo_formatter": "/swe-bench-repos/{repo}"}
    meta = {"instance_id": instance_id, "base_commit": base_commit, "dataset_name": "R2E-Gym/R2E-Gym-Subset",
            "split": "train", "problem_statement": problem_statement, "hints_text": "", "version": "",
            "created_at": created_at, "instance_dict": json.dumps(inner), "repo": repo}
    return {"responses_create_params": {"input": [], "metadata": meta, "model": "default", "temperature": 1.0,
                                        "top_p": 1.0},
            "agent_ref": {"type": "responses_api_agents", "name": agent}}
