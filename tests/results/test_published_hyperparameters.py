"""Every workload's full recipe against a published MLPerf result log of its round, key by key.

`published_hyperparameters.json` holds, per workload, the hyperparameter records of one published log
(mlcommons/training_results_v0.7 ... v5.1, cited by repository, path and commit; for NCF, whose only
logs are v0.5's, the reference's own example log) and, for each key where trainperf's recipe logs
something else or nothing, the reason. The test fails when a key differs without a listed reason, when
trainperf logs a key the published log lacks without a reason, and when a listed reason is no longer
needed — so the list in the file is exactly the set of remaining differences. ResNet-50 and DLRM are
compared with the v1.0 logs of ../shared/fixtures in test_reference_hyperparameters.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.results.test_reference_hyperparameters import _logged, unexplained_differences
from trainperf import registry

PUBLISHED = json.loads((Path(__file__).with_name("published_hyperparameters.json")).read_text())["logs"]


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return ours is theirs or ours == theirs and type(ours) is type(theirs)
    if isinstance(theirs, (int, float)) and isinstance(ours, (int, float)):
        return ours == pytest.approx(theirs, rel=1e-6)
    if hasattr(ours, "value"):  # a Logged value with metadata: the value is what is compared
        return _same(ours.value, theirs)
    if isinstance(theirs, list) and isinstance(ours, (list, tuple)):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs, strict=True))
    return ours == theirs


def _case_id(entry: dict[str, Any]) -> str:
    return f"{entry['workload']}-{entry['recipe']}"


def test_every_workload_is_compared_with_a_published_log():
    compared = {e["workload"] for e in PUBLISHED} | {"resnet", "dlrm"}  # those two: the ../shared fixtures
    assert compared == set(registry.names()), set(registry.names()) - compared


@pytest.mark.parametrize("entry", PUBLISHED, ids=_case_id)
def test_the_full_recipe_logs_what_the_published_log_logs(entry: dict[str, Any]):
    ours = _logged(entry["workload"], entry["recipe"])
    renamed = entry.get("renamed", {})
    theirs = {renamed.get(k, k): v for k, v in entry["values"].items()}
    explained = entry["differs"]
    unexplained = unexplained_differences(ours, theirs, explained, _same)
    for key in ours.keys() - theirs.keys() - explained.keys():
        unexplained[key] = ("not in the published log", ours[key])
    assert not unexplained, f"differs from {entry['log']['path']} without a listed reason: {unexplained}"
    for key in explained:
        assert key not in ours or key not in theirs or not _same(ours[key], theirs[key]), f"{key} no longer differs"


def test_each_listed_difference_says_why():
    for entry in PUBLISHED:
        assert {"repo", "path"} <= entry["log"].keys()
        for key, why in entry["differs"].items():
            assert isinstance(why, str) and len(why) > 20, (entry["workload"], key)
