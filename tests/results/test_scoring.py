"""Scores equal the official mlperf_logging result summarizer's, on real published NVIDIA logs."""

from __future__ import annotations

import contextlib
import io
import random
import re
import shutil
from pathlib import Path

import pytest
from mlperf_logging.result_summarizer import result_summarizer as official

from tests.conftest import SHARED, read_log
from trainperf.cli import main
from trainperf.errors import TrainperfError
from trainperf.results import scoring

FIXTURES = SHARED / "fixtures" / "mlperf-results-v1.0" / "NVIDIA" / "results"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures not present")
FOLDERS = [("dgxa100_ngc21.05_mxnet", "resnet"), ("dgxa100_ngc21.05_merlin_hugectr", "dlrm")]


def _official(folder: Path, benchmark: str) -> tuple[dict[str, float], float | None]:
    with contextlib.redirect_stdout(io.StringIO()):
        per_file, _power, score, _power_score, _scale = official._compute_strong_score_standalone(
            benchmark, folder.parent.name, False, str(folder), "training", "1.0.0", return_full_scores=True)
    return {Path(f).name: v for f, v in per_file.items()}, score


@needs_fixtures
@pytest.mark.parametrize("system, bench_key", FOLDERS)
def test_scores_equal_official_summarizer(system, bench_key):
    folder = FIXTURES / system / bench_key
    per_file, score = _official(folder, bench_key)
    ours = scoring.score_folder(folder)
    assert ours.benchmark == bench_key and ours.system == system and ours.ruleset == "1.0.0"
    assert ours.score == pytest.approx(score, rel=1e-12)
    assert {Path(r.file).name: r.minutes for r in ours.runs if r.converged} == pytest.approx(per_file, rel=1e-12)
    assert len(ours.runs) == 5 and ours.required_runs == 5


@needs_fixtures
def test_published_resnet_folder_has_one_non_converged_run():
    ours = scoring.score_folder(FIXTURES / "dgxa100_ngc21.05_mxnet" / "resnet")
    bad = [r for r in ours.runs if not r.converged]
    assert [Path(r.file).name for r in bad] == ["result_1.txt"] and "compliance" in bad[0].reason
    assert ours.valid and ours.rcp.startswith("pass")
    assert all(r.converge_point and 30 <= r.converge_point <= 45 for r in ours.runs if r.converged)


def _spoil(path: Path) -> None:
    """Make a closed ResNet log miss the target: every eval_accuracy below 0.759."""
    text = re.sub(r'("key": "eval_accuracy", "value": )0\.7[5-9]\d*', r"\g<1>0.75", path.read_text())
    path.write_text(text)


@needs_fixtures
@pytest.mark.parametrize("spoiled, valid", [([], True), (["result_0.txt"], False)])
def test_non_converged_runs_match_official(tmp_path, spoiled, valid):
    folder = tmp_path / "results" / "sys" / "resnet"
    shutil.copytree(FIXTURES / "dgxa100_ngc21.05_mxnet" / "resnet", folder)
    for name in spoiled:  # result_1.txt already misses the target in the published logs
        _spoil(folder / name)
    _, score = _official(folder, "resnet")
    ours = scoring.score_folder(folder, rcp=False)
    assert ours.converged == 4 - len(spoiled)
    assert ours.valid is valid
    if valid:
        assert ours.score == pytest.approx(score, rel=1e-12)
    else:
        assert ours.score is None and "invalid: 2 non-converged" in ours.note


def test_olympic_mean_matches_official_rule():
    rng = random.Random(0)
    for benchmark in ("resnet", "unet3d"):
        drop = scoring.max_dropped(benchmark)
        for _ in range(200):
            n = rng.randint(drop * 2 + 1, 12)
            scores = [rng.uniform(1, 100) for _ in range(n)]
            dropped = rng.randint(0, drop)
            expected = official._compute_olympic_average(list(scores), dropped, drop)
            assert scoring.olympic_mean(scores, dropped, benchmark) == pytest.approx(expected)
    assert scoring.olympic_mean([1.0, 2.0, 3.0], 2, "resnet") is None


@pytest.mark.slow
def test_score_command_on_a_trainperf_run(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "resnet", "--seed", "2", "--out", str(out / "a"), "--quiet"]) == 0
    layout = tmp_path / "results" / "cpu" / "resnet"
    layout.mkdir(parents=True)
    shutil.copy(out / "a" / "mlperf_log.txt", layout / "result_0.txt")
    capsys.readouterr()
    assert main(["score", str(tmp_path / "results")]) == 0
    text = capsys.readouterr().out
    assert "cpu / resnet" in text and "converged 1" in text and "n/a (open division)" in text
    assert "1 of the 5 runs MLPerf requires" in text


def test_score_rejects_a_folder_without_logs(tmp_path):
    with pytest.raises(TrainperfError, match="no result_\\*.txt MLPerf logs found"):
        scoring.find_benchmark_folders(tmp_path)


@pytest.mark.slow
def test_runs_series_in_submission_layout_passes_official_checkers(tmp_path, caplog, capsys):
    import json
    import logging

    from mlperf_logging.package_checker import package_checker
    from mlperf_logging.system_desc_checker import system_desc_checker

    out = tmp_path / "sub"
    assert main(["run", "resnet", "--runs", "3", "--seed", "10", "--out", str(out), "--quiet",
                 "--system", "cpu_box"]) == 0
    logs = sorted((out / "results" / "cpu_box" / "resnet").iterdir())
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt", "result_2.txt"]
    seeds = [next(r["value"] for r in read_log(p) if r["key"] == "seed") for p in logs]
    assert seeds == [10, 11, 12]
    system = out / "systems" / "cpu_box.json"
    desc = json.loads(system.read_text())
    assert desc["system_name"] == "cpu_box" and desc["submitter"] == "trainperf" and desc["division"] == "open"
    assert desc["host_processor_vcpu_count"] and desc["framework"].startswith("PyTorch")
    assert desc["accelerator_model_name"] == "" and desc["accelerators_per_node"] == "0"  # nothing invented
    with caplog.at_level(logging.INFO):
        assert system_desc_checker.check_system_desc(str(system), "training", "1.0.0")[0]
        assert package_checker.check_systems(str(out), "training", "1.0.0")
        caplog.clear()
        package_checker.check_training_result_files(str(out), "training", "1.0.0", True, False, True, False, True)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # With 3 runs the one complaint that applies is the count (MLPerf wants 5 for resnet).
    assert len(errors) == 1 and "found 3, expected 5" in errors[0]
    capsys.readouterr()
    assert main(["score", str(out)]) == 0
    assert "olympic score:" in capsys.readouterr().out


def test_compare_two_result_folders(capsys):
    if not FIXTURES.is_dir():
        pytest.skip("../shared/fixtures not present")
    assert main(["compare", str(FIXTURES), str(FIXTURES)]) == 0
    out = capsys.readouterr().out
    assert "resnet" in out and "dlrm" in out and "1.00x" in out
