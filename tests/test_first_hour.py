"""What a new user (and an adversary) typed in their first hour: every input refused in one line with
exit 2 before anything is written, the exit-code scheme, names that stay paths-free, a series that
resumes, `list` at 80 columns, help for every option, and a run that says what to do next."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path

import pytest

from trainperf import jobs
from trainperf.cli import build_parser, main

RUN_DEFAULTS = ["--quiet"]


def _refused(argv: list[str], capsys, expected: str) -> None:
    """Exit 2, one line on stderr naming the problem, no traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses before main's own handlers
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert "Traceback" not in err and expected in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, expected", [
    (["run", "resnet", "--set", "label_smoothing=2"], "label_smoothing=2: expected a finite value in [0, 1)"),
    (["run", "resnet", "--set", "momentum=-5"], "momentum=-5"),
    (["run", "resnet", "--set", "stem_width=0"], "stem_width=0"),
    (["run", "resnet", "--set", "base_lr=nan"], "base_lr=nan"),
    (["run", "resnet", "--set", "base_lr=1e400"], "base_lr=inf"),
    (["run", "resnet", "--set", "ruleset=9.9.9"], "ruleset='9.9.9': expected blank or one of the official"),
    (["run", "resnet", "--seed", "99999999999999999999"], "expected a seed from 0 to 4294967295"),
    (["run", "resnet", "--seed", "-1"], "expected a seed"),
    (["run", "resnet", "--device", "gpu"], "--device 'gpu': expected cpu, cuda or cuda:N"),
    (["bench", "resnet", "--device", "gpu"], "--device 'gpu'"),
    (["allreduce", "--device", "gpu"], "--device 'gpu'"),
    (["run", "resnet", "--runs", "0"], "'0': expected a whole number >= 1"),
    (["run", "resnet", "--runs", "-2"], "'-2': expected a whole number >= 1"),
    (["run", "resnet", "--resume"], "--resume: only a series (--runs) can be resumed"),
    (["suite", "--only", ""], "--only '': unknown workload(s) (none given)"),
    (["predict", "resnet", "--epochs", "-1"], "'-1': expected a finite number > 0"),
    (["predict", "resnet", "--eval-s", "-5"], "'-5': expected a finite number >= 0"),
    (["ablate", "resnet", "--steps", "0"], "'0': expected a whole number >= 1"),
    (["check", "x.txt", "--ruleset", "9.9.9"], "expected one of the official checker's rulesets"),
    (["score", "x", "--ruleset", "bogus"], "expected one of the official checker's rulesets"),
    (["compare", "a", "b", "--ruleset", "9.9.9"], "expected one of the official checker's rulesets"),
    (["run", "resnet", "--runs", "2", "--system", "../../../escaped"], "'../../../escaped': expected a name"),
    (["suite", "--system", "<script>alert(1)</script>"], "expected a name of letters"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(argv, capsys, expected)
    assert not list(tmp_path.iterdir()), "nothing is written for a refused command"


def test_a_file_where_a_folder_is_wanted_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("FILE").write_text("")
    _refused(["run", "resnet", "--runs", "2", "--out", "FILE"], capsys, "--out: FILE: exists and is not a folder")
    _refused(["suite", "--out", "FILE"], capsys, "--out: FILE: exists and is not a folder")
    _refused(["allreduce", "--json", "FILE/x.json"], capsys, "FILE/x.json: FILE is a file, not a folder")
    _refused(["bench", "resnet", "--json", "FILE/x.json"], capsys, "FILE is a file, not a folder")
    _refused(["report", "runs", "-o", "FILE/r.html"], capsys, "FILE is a file, not a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _refused(["run", "resnet", "--out", str(ro / "run")], capsys, "Permission denied")
    finally:
        ro.chmod(0o755)


def test_a_failed_cleanup_does_not_hide_the_error(tmp_path, monkeypatch):
    from trainperf.files import write_bytes_atomic

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: (_ for _ in ()).throw(OSError(30, "ro")))
    with pytest.raises(OSError, match="No space left on device"):
        write_bytes_atomic(tmp_path / "x.bin", b"1")


# -- the exit-code scheme ------------------------------------------------------------------------------
def test_the_exit_codes_are_the_documented_ones(monkeypatch, capsys):
    text = (Path(__file__).resolve().parents[1] / "docs" / "commands.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in (jobs.EXIT_OK, jobs.EXIT_NOT_REACHED, jobs.EXIT_USAGE, jobs.EXIT_INTERNAL, jobs.EXIT_INTERRUPTED):
        assert f"| {code} |" in section, code

    def boom(args):
        raise RuntimeError("a bug")

    def interrupt(args):
        raise KeyboardInterrupt

    parser = build_parser()
    for func, code, said in ((boom, 3, "internal error"), (interrupt, 130, "interrupted")):
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                            lambda self, argv=None, namespace=None, f=func: argparse.Namespace(func=f))
        assert main(["list"]) == code
        assert said in capsys.readouterr().err
    del parser


@pytest.mark.parametrize("reason, code", [("received SIGINT", 130), ("received SIGTERM", 130),
                                          ("target top1 >= 0.97 not reached within 1 epochs", 1)])
def test_a_single_run_exits_130_when_interrupted_and_1_when_short_of_its_target(reason, code, tmp_path, monkeypatch,
                                                                                  capsys):
    result = {"status": "aborted", "abort_reason": reason, "time_to_train_s": 1.0, "environment": {}}
    monkeypatch.setattr(jobs, "run_once", lambda *args: result)
    assert main(["run", "resnet", "--out", str(tmp_path / "r"), "--quiet"]) == code
    capsys.readouterr()


# -- names, listing, help ------------------------------------------------------------------------------
def test_one_machine_has_one_system_name():
    import torch

    from trainperf.results import submission
    from trainperf.runtime import environment

    cpu = torch.device("cpu")
    name = environment.system_name(cpu)
    assert name == submission.default_system_name(cpu, 1) == environment.describe(cpu)["system"]
    assert jobs.SYSTEM_NAME_OK(name) if hasattr(jobs, "SYSTEM_NAME_OK") else name.replace("_", "").isalnum()


def test_a_single_run_and_a_series_are_one_system_in_a_report(tmp_path):
    from trainperf.report import collect
    from trainperf.runtime import environment

    data = collect.ReportData()
    run = tmp_path / "run"
    run.mkdir()
    import torch

    env = environment.describe(torch.device("cpu"))
    (run / "result.json").write_text(json.dumps({
        "workload": "resnet", "benchmark": "resnet", "scale": "mini", "status": "success", "metric": "top1",
        "target": 0.97, "time_to_train_s": 3.0, "evaluations": [], "environment": env, "seed": 1}))
    collect._add_run_folder(data, run)
    assert [g.system for g in data.groups] == [env["system"]]


def test_list_is_readable_at_80_columns(monkeypatch, capsys):
    from trainperf import registry

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    starts = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert all(name in starts for name in registry.names())  # every name whole, at the start of a line


def test_every_option_and_positional_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, p in sub.choices.items() for action in p._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.to_target
def test_a_run_says_what_to_do_next(tmp_path, capsys):
    assert main(["run", "resnet", "--seed", "0", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"trainperf report {tmp_path / 'r'}" in out and "--runs 5 --out sub/ && trainperf score sub/" in out
    # Each printed command works when pasted (issue 60, 14: `--runs` without its count did not).
    series = out.split("the MLPerf runs: ", 1)[1].split(" && ")[0]
    args = build_parser().parse_args(shlex.split(series)[1:])
    assert args.runs == 5 and args.out == "sub/"


@pytest.mark.slow
@pytest.mark.to_target
def test_check_verbose_names_the_users_log_not_a_temporary_copy(tmp_path, capsys):
    assert main(["run", "resnet", "--seed", "0", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    capsys.readouterr()
    log = tmp_path / "r" / "mlperf_log.txt"
    main(["check", str(log), "--verbose"])
    out = capsys.readouterr().out
    assert str(log) in out and "/tmp" not in out.replace(str(tmp_path), "")


# -- interrupted work ------------------------------------------------------------------------------------
def test_stale_partials_of_dead_processes_are_removed(tmp_path):
    from trainperf.files import remove_stale_partials

    dead = tmp_path / ".resnet-mini.999999999.deadbeef.partial"
    (dead / "train").mkdir(parents=True)
    live = tmp_path / f".resnet-mini.{os.getpid()}.0123abcd.partial"
    live.mkdir()
    other = tmp_path / "resnet-mini"
    other.mkdir()
    assert remove_stale_partials(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


@pytest.mark.second_tier
def test_an_interrupted_series_resumes(tmp_path, capsys):
    out = tmp_path / "sub"
    assert main(["run", "resnet", "--runs", "2", "--seed", "5", "--out", str(out), "--quiet"]) == 0
    logs = next(out.glob("results/*/resnet"))
    first = (logs / "result_0.txt").stat().st_mtime_ns
    # As a kill leaves it: run 1 started (its folder, a partial log) but never reached results/.
    (logs / "result_1.txt").unlink()
    run1 = next(out.glob("trainperf/*/resnet/run_1"))
    (run1 / "result.json").unlink()
    capsys.readouterr()
    _refused(["run", "resnet", "--runs", "2", "--out", str(out)], capsys, "add --resume")
    assert main(["run", "resnet", "--runs", "2", "--out", str(out), "--resume", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "1 kept" in said and "run 1 (seed 6)" in said
    assert (logs / "result_0.txt").stat().st_mtime_ns == first and (logs / "result_1.txt").is_file()
    assert main(["score", str(out)]) == 0


# -- damaged generated data --------------------------------------------------------------------------------
def _copy_mini(name: str, tmp_path: Path) -> Path:
    import shutil

    from tests.conftest import mini_data

    root = tmp_path / f"{name}-mini"
    shutil.copytree(mini_data(name), root)
    return root


def test_a_deleted_class_folder_of_the_resnet_mini_is_found_and_regenerated(tmp_path, capsys):
    import shutil

    root = _copy_mini("resnet", tmp_path)
    assert main(["prepare", "resnet", "--data", str(root)]) == 0  # records the files of an older copy
    assert "already present" in capsys.readouterr().out
    victim = sorted((root / "val").iterdir())[-1]
    shutil.rmtree(victim)
    assert jobs.data_problems(__import__("trainperf.registry", fromlist=["get"]).get("resnet"), "mini", root)
    assert main(["prepare", "resnet", "--data", str(root)]) == 0
    out = capsys.readouterr().out
    assert "generated files missing or changed since generated" in out and "generating it again" in out
    assert victim.is_dir()


@pytest.mark.slow
def test_a_truncated_ncf_mini_is_regenerated_before_a_run(tmp_path, capsys):
    from trainperf import registry

    root = _copy_mini("ncf", tmp_path)
    jobs.prepared_data(registry.get("ncf"), "mini", str(root), say=lambda s: None)
    ratings = root / "train-ratings.csv"
    size = ratings.stat().st_size
    lines = ratings.read_text().splitlines(keepends=True)
    ratings.write_text("".join(lines[:50_000]))
    problems = jobs.data_problems(registry.get("ncf"), "mini", root)
    assert problems and "train-ratings.csv is" in problems[0] and f"was {size:,}" in problems[0]
    said = []
    jobs.prepared_data(registry.get("ncf"), "mini", str(root), say=said.append)
    assert any("generating it again" in line for line in said) and ratings.stat().st_size == size


@pytest.mark.second_tier
def test_a_resumed_series_must_be_the_same_series(tmp_path, capsys):
    out = tmp_path / "sub"
    assert main(["run", "ncf", "--runs", "2", "--seed", "5", "--org", "lab", "--out", str(out), "--quiet"]) == 0
    logs = next(out.glob("results/*/ncf"))
    (logs / "result_1.txt").unlink()
    capsys.readouterr()
    base = ["run", "ncf", "--runs", "2", "--out", str(out), "--resume", "--quiet"]
    _refused([*base, "--org", "lab", "--set", "base_lr=0.01"], capsys, "base_lr")
    _refused([*base], capsys, "--org lab")  # the default organisation is not the kept runs' one
    _refused([*base, "--org", "lab", "--division", "closed"], capsys, "--division open")
    _refused([*base, "--org", "lab", "--seed", "9"], capsys, "--seed 5")
    assert not (logs / "result_1.txt").exists()
    assert main([*base, "--org", "lab"]) == 0
    assert (logs / "result_1.txt").is_file()
