"""`trainperf suite`: a round of workloads into one results folder and one report; a failing workload
is a row with its reason, never the end of the round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainperf import cli, registry, suite
from trainperf.errors import TrainperfError
from trainperf.results import scoring


@pytest.mark.to_target
@pytest.mark.slow
def test_a_round_of_two_fast_workloads_runs_to_target_and_writes_one_report(tmp_path, capsys):
    out = tmp_path / "round"
    code = cli.main(["suite", "--only", "ncf,resnet", "--seed", "0", "--out", str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # A progress line per workload, with the time left estimated from the calibrated medians.
    assert "[1/2] resnet: 1 run(s) at mini scale (elapsed 0:00, about 0:" in printed
    assert "[2/2] ncf: ok (1/1 converged" in printed
    data = suite.load(out)
    rows = {r.workload: r for r in data["rows"]}
    assert list(rows) == ["resnet", "ncf"]  # registry order, whatever --only's order
    for name, row in rows.items():
        assert row.status == "ok" and row.converged == 1 and not row.reason, row
        assert row.score_kind == "single" and row.score_minutes == pytest.approx(row.times_s[0] / 60, rel=0.01)
        assert row.epochs_to_target >= 1 and row.samples_per_s > 0 and row.wall_s >= row.times_s[0]
        # Each is an MLPerf results folder the official checker passes and the scorer reads.
        scored = scoring.score_folder(Path(row.results))
        assert scored.converged == 1 and scored.benchmark == name
    assert (out / "round-1.0.0" / "results").is_dir() and (out / "round-0.7.0" / "results").is_dir()
    html = (out / "suite.html").read_text(encoding="utf-8")
    md = (out / "suite.md").read_text(encoding="utf-8")
    for text in (html, md):
        assert "Round" in text and "Convergence" in text and "Environment" in text
        assert registry.get("ncf").metric.name in text and registry.get("resnet").metric.name in text
    assert md.count("![") == 2 and (out / "suite_convergence_0.png").stat().st_size > 1000
    assert json.loads((out / "suite.json").read_text())["wall_s"] > 0


def test_a_failing_workload_is_a_row_with_its_reason(tmp_path, capsys):
    out = tmp_path / "round"
    # Full scale with no dataset: the workload fails before training; the round goes on and reports it.
    code = cli.main(["suite", "--only", "ncf", "--scale", "full", "--seed", "0", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    (row,) = suite.load(out)["rows"]
    assert row.status == "failed" and "--data" in row.reason and row.converged == 0
    assert "ncf: failed:" in captured.err
    assert "failed: ncf --scale full needs --data" in (out / "suite.md").read_text(encoding="utf-8")


def test_only_names_registered_workloads(tmp_path):
    assert suite.parse_only(None)[0] == "resnet"
    with pytest.raises(TrainperfError, match="unknown workload.*nope"):
        suite.parse_only("resnet,nope")
    # A full-scale-only workload is in a full round, not in a mini one, and naming it there is refused.
    assert "llama31_405b" not in suite.parse_only(None) and "llama31_405b" in suite.parse_only(None, "full")
    with pytest.raises(TrainperfError, match="llama31_405b declare.s. no mini scale"):
        suite.parse_only("resnet,llama31_405b")
    with pytest.raises(TrainperfError, match="already holds a suite"):
        (tmp_path / "suite.json").write_text("{}")
        suite.run_suite(["ncf"], "mini", 1, tmp_path, 0)


def test_an_interrupted_round_keeps_what_finished_and_reports_the_rest_not_run(tmp_path, monkeypatch, capsys):
    from trainperf import jobs

    def stopped(request, say, warn):
        raise KeyboardInterrupt  # Ctrl-C while the first workload's run was being set up

    monkeypatch.setattr(jobs, "start", stopped)
    out = tmp_path / "round"
    assert cli.main(["suite", "--only", "ncf,dlrm", "--seed", "0", "--out", str(out)]) == 130
    rows = suite.load(out)["rows"]
    assert [(r.workload, r.status, r.reason) for r in rows] == [
        ("ncf", "failed", "interrupted"), ("dlrm", "not run", "the round was interrupted")]
    assert "interrupted during ncf" in capsys.readouterr().err and (out / "suite.html").is_file()


@pytest.mark.second_tier
def test_an_interrupted_round_resumes_with_what_finished_kept(tmp_path, monkeypatch, capsys):
    from trainperf import jobs

    real_start, started = jobs.start, []

    def stop_at_dlrm(request, say, warn):
        if request.workload == "dlrm":
            raise KeyboardInterrupt
        return real_start(request, say, warn)

    monkeypatch.setattr(jobs, "start", stop_at_dlrm)
    out = tmp_path / "round"
    argv = ["suite", "--only", "ncf,dlrm", "--out", str(out)]
    assert cli.main(argv) == 130
    seed = suite.load(out)["seed"]
    assert "add --resume" in capsys.readouterr().err
    # Re-running without --resume is refused and says how to go on; another round is refused too.
    assert cli.main(argv) == 2 and "add --resume" in capsys.readouterr().err
    assert cli.main([*argv, "--resume", "--runs", "2"]) == 2
    assert "--runs 1, this command says --runs 2" in capsys.readouterr().err

    def record(request, say, warn):
        started.append((request.workload, request.resume, request.seed))
        return real_start(request, say, warn)

    monkeypatch.setattr(jobs, "start", record)
    assert cli.main([*argv, "--resume"]) == 0
    assert started == [("dlrm", True, seed)]  # ncf kept, dlrm run with the round's seed
    rows = suite.load(out)["rows"]
    assert [(r.workload, r.status) for r in rows] == [("ncf", "ok"), ("dlrm", "ok")]


@pytest.mark.parametrize("extra, said", [
    (["--system", "another"], "--system (the default), this command says --system another"),
    (["--data", "elsewhere"], "--data (the default), this command says --data"),
    (["--device", "cpu"], "--device (the default), this command says --device cpu")])
def test_a_resumed_suite_must_be_the_same_system_data_and_device(tmp_path, monkeypatch, capsys, extra, said):
    """Issue 60, 8: `suite --resume` accepted another --system or --data, and the row then counted both
    systems' runs ("4/3 converged")."""
    from trainperf import jobs

    def stop(request, say, warn):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "start", stop)
    monkeypatch.chdir(tmp_path)
    argv = ["suite", "--only", "ncf", "--out", str(tmp_path / "round")]
    assert cli.main(argv) == 130
    capsys.readouterr()
    assert cli.main([*argv, "--resume", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and "a resumed suite must be the same round" in err[0], err
