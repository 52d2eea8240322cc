"""The report renders for one run, many runs and two systems, and escapes hostile names."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import SHARED, Page
from trainperf.cli import main
from trainperf.errors import TrainperfError
from trainperf.report import collect, render

FIXTURES = SHARED / "fixtures" / "mlperf-results-v1.0"
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("series") / "sub"
    assert main(["run", "resnet", "--runs", "3", "--seed", "20", "--out", str(out), "--quiet",
                 "--system", "plain"]) == 0
    # `--system` takes names only; a results tree from elsewhere may still name its system anything.
    for folder in ("results", "trainperf"):
        (out / folder / "plain").rename(out / folder / HOSTILE)
    desc = json.loads((out / "systems" / "plain.json").read_text())
    (out / "systems" / f"{HOSTILE}.json").write_text(json.dumps({**desc, "system_name": HOSTILE}))
    (out / "systems" / "plain.json").unlink()
    return out


def _png_ok(src: str) -> bool:
    assert src.startswith("data:image/png;base64,")
    return base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def _render(paths: list[Path], tmp_path: Path, markdown: bool = False) -> Page:
    out = tmp_path / "report.html"
    assert main(["report", *map(str, paths), "-o", str(out)] + (["--markdown"] if markdown else [])) == 0
    return Page(out.read_text())


@pytest.mark.to_target
@pytest.mark.slow
def test_report_of_one_run(tmp_path):
    run = tmp_path / "one"
    assert main(["run", "resnet", "--seed", "4", "--out", str(run), "--quiet"]) == 0
    page = _render([run], tmp_path)
    summary = page.tables[0]
    assert summary[0][:5] == ["system", "benchmark", "scale", "runs", "converged"]
    assert summary[1][1:5] == ["resnet", "mini", "1", "1"] and summary[1][5].endswith("(mean)")
    assert len(page.images) == 1 and _png_ok(page.images[0])  # the convergence curve
    assert page.scripts == 0


@pytest.mark.to_target
@pytest.mark.slow
def test_report_of_many_runs_escapes_hostile_names(series, tmp_path):
    page = _render([series], tmp_path, markdown=True)
    summary = page.tables[0]
    assert summary[1][0] == HOSTILE  # shown as text ...
    assert summary[1][3:5] == ["3", "3"] and "3 of the 5 runs" in summary[1][-1]
    html_text = (tmp_path / "report.html").read_text()
    assert HOSTILE not in html_text and "&lt;img src=x onerror=alert(1)&gt;" in html_text  # ... never as markup
    assert len(page.images) == 1 and all(_png_ok(src) for src in page.images)
    systems = next(t for t in page.tables if t[0][0] == "field")
    assert systems[0][1] == HOSTILE
    md = (tmp_path / "report.md").read_text()
    assert "report_convergence_0.png" in md and (tmp_path / "report_convergence_0.png").is_file()
    outside_code = re.sub(r"```.*?```", "", md, flags=re.S)  # fenced code is shown literally by renderers
    assert HOSTILE not in outside_code and "&lt;img src=x onerror=alert(1)&gt;" in outside_code
    assert "trainperf run resnet --runs 3 --seed 20" in html_text  # the exact command


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures not present")
@pytest.mark.slow
def test_report_of_two_systems_and_a_scaling_study(series, tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    from trainperf.bench import scaling
    rows = scaling.summarize({1: [_fake(10.0)], 2: [_fake(6.0)]})
    scaling.save(rows, study, "resnet mini")
    other = tmp_path / "other"
    shutil.copytree(series, other)
    (other / "results" / HOSTILE).rename(other / "results" / "second")
    (other / "systems" / f"{HOSTILE}.json").rename(other / "systems" / "second.json")
    (other / "trainperf" / HOSTILE).rename(other / "trainperf" / "second")
    page = _render([series, other, FIXTURES, study], tmp_path)
    summary = page.tables[0]
    systems = [row[0] for row in summary[1:]]
    assert HOSTILE in systems and "second" in systems and "dgxa100_ngc21.05_mxnet" in systems
    side = next(t for t in page.tables if t[0][0] == "system" and t[0][-1].startswith("speedup vs"))
    assert [row[0] for row in side[1:]] == [HOSTILE, "second"] and side[1][2] == "1.00x"
    assert not any("dgxa100" in row[0] for row in side)  # full and mini are never compared
    scaling_table = next(t for t in page.tables if t[0][0] == "devices")
    assert scaling_table[2][:2] == ["2", "32"]
    assert len(page.images) == 3 and all(_png_ok(src) for src in page.images)  # resnet, dlrm, scaling


def _fake(ttt: float) -> dict:
    return {"status": "success", "time_to_train_s": ttt, "epoch_times_s": [ttt / 4] * 4, "epochs_to_target": 4,
            "recipe": {"global_batch_size": 32}}


def test_report_rejects_unknown_paths(tmp_path):
    with pytest.raises(TrainperfError, match="not a run folder"):
        collect.collect([tmp_path])
    with pytest.raises(TrainperfError, match="no such file"):
        collect.collect([tmp_path / "nope"])


def test_markdown_tables_escape_pipes():
    assert render._md_table(["a|b"], [["x|y"]]).splitlines()[2] == "| x\\|y |"


def test_report_of_an_ablation(tmp_path):
    from trainperf.bench import ablate

    rows = [ablate.AblationRow("baseline (all off)", "baseline", [], 100.0, 1.0, 0.1),
            ablate.AblationRow("channels_last", "cumulative", ["channels_last=true"], 150.0, 1.5, 0.15, 3, 4.2, True)]
    study = tmp_path / "abl"
    ablate.save(rows, study, "resnet mini")
    page = _render([study], tmp_path)
    table = next(t for t in page.tables if t[0][0] == "configuration")
    assert table[2][:4] == ["channels_last", "cumulative", "150.0", "1.50x"] and table[2][5] == "3"
    assert len(page.images) == 1 and _png_ok(page.images[0])


def _fake_run(folder: Path, system: str = "box") -> Path:
    """A run folder's result.json without training: what the report reads of one resnet mini run."""
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "workload": "resnet", "benchmark": "resnet", "scale": "mini", "status": "success", "seed": 1,
        "time_to_train_s": 60.0, "target": 0.97, "epochs_to_target": 2,
        "evaluations": [{"epoch": 1, "value": 0.9}, {"epoch": 2, "value": 0.98}],
        "recipe": {"global_batch_size": 32}, "environment": {"system": system, "command": "trainperf run resnet"}}))
    return folder


def _results_tree(root: Path, system: str = "sys") -> Path:
    """results/<system>/resnet/result_0.txt (a minimal closed log) and systems/<system>.json under `root`."""
    from tests.conftest import write_minimal_closed_log

    folder = root / "results" / system / "resnet"
    folder.mkdir(parents=True)
    write_minimal_closed_log(folder / "result_0.txt", "resnet", 32, {}, 0.76, 1)
    (root / "systems").mkdir()
    (root / "systems" / f"{system}.json").write_text(json.dumps({"system_name": system}))
    return folder


def test_report_counts_a_run_once_however_often_it_is_given(tmp_path):
    run = _fake_run(tmp_path / "runs" / "r1")
    data = collect.collect([run, run, tmp_path / "runs" / ".." / "runs" / "r1", tmp_path / "runs"])
    assert [len(g.runs) for g in data.groups] == [1]
    tree = _results_tree(tmp_path / "sub")
    data = collect.collect([tmp_path / "sub", tree, tmp_path / "sub"])
    assert [len(g.runs) for g in data.groups] == [1]


def test_report_of_a_results_folder_given_from_inside(tmp_path, monkeypatch):
    folder = _results_tree(tmp_path)
    monkeypatch.chdir(folder)  # trainperf report .
    data = collect.collect([Path(".")])
    assert [g.system for g in data.groups] == ["sys"] and list(data.systems) == ["sys"]
    monkeypatch.chdir(folder.parent)  # trainperf report resnet
    assert [g.system for g in collect.collect([Path("resnet")]).groups] == ["sys"]


def test_report_of_a_system_folder_whose_name_is_not_utf8(tmp_path):
    name = os.fsdecode(b"sys\xff")  # as Python reads such a name: with a lone surrogate
    try:
        _results_tree(tmp_path, name)
    except OSError:
        pytest.skip("this file system takes UTF-8 names only")
    page = _render([tmp_path], tmp_path)
    assert page.tables[0][1][0] == "sys\ufffd"  # shown with a replacement character, never an internal error


def test_report_never_times_an_invalid_score(tmp_path):
    data = collect.ReportData()
    for system, valid in (("sysA", False), ("sysB", True)):
        group = data.group(system, "ncf", "mini")
        group.runs = [collect.RunView(system, "ncf", f"result_{i}.txt", "success", 4.0, []) for i in range(2)]
        group.valid = valid  # sysA: 3 more runs aborted, too many for a score
    _, rows = render.summary_rows(data)
    assert [row[5] for row in rows] == ["invalid", "4.000 (mean)"]
    assert render.comparison_rows(data) == []  # nothing to compare an invalid result with
