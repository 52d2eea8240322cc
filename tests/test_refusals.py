"""Paths and numbers a careless or hostile user types: each refused in one line (exit 2) before any
work — names longer than a file system takes, NaN/infinite/negative rates and peaks, the `trainperf
run` arguments a Slurm script embeds — and batches that cannot be what the log says."""

from __future__ import annotations

import argparse
import json

import pytest

import trainperf.cli as cli


def _refused(argv: list[str], capsys, expected: str) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse refuses before main's own handlers
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err[-300:])
    assert "Traceback" not in err and expected in err, err[-300:]
    assert len(err.strip().splitlines()) == 1, err[-300:]


@pytest.mark.parametrize("argv", [
    ["run", "ncf", "--out", "a" * 300],
    ["run", "ncf", "--out", "missing/" + "a" * 300 + "/x"],
    ["report", "runs", "-o", "a" * 300 + ".html"],
    ["bench", "ncf", "--json", "b" * 240 + ".json"],  # fits 255 bytes; its temporary sibling does not
    ["suite", "--out", "a" * 300],
    ["allreduce", "--json", "a" * 300 + ".json"],
])
def test_an_over_long_output_name_is_one_line(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from trainperf.bench import throughput

    monkeypatch.setattr(throughput, "run_bench", lambda *a, **k: pytest.fail("the bench ran"))
    _refused(argv, capsys, "expected at most")
    assert not list(tmp_path.iterdir())


def test_a_path_over_path_max_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(["run", "ncf", "--out", "/".join(["d" * 250] * 18)], capsys, "File name too long")


def test_every_float_option_refuses_nan_inf_and_negatives():
    parser = cli.build_parser()
    checked = []
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.type is None:
                continue
            try:
                value = action.type("0.5")
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue
            if not isinstance(value, float):
                continue
            checked.append(f"{name} {action.option_strings[0]}")
            for bad in ("nan", "inf", "-inf", "-1"):
                with pytest.raises(argparse.ArgumentTypeError):
                    action.type(bad)
                    pytest.fail(f"{name} {action.option_strings[0]} {bad}: accepted")
    assert len(checked) >= 12, checked


def test_predict_refuses_a_nan_throughput_before_writing(tmp_path, capsys):
    _refused(["predict", "resnet", "--samples-per-s", "nan", "--json", str(tmp_path / "p.json")], capsys,
             "--samples-per-s: 'nan'")
    assert not (tmp_path / "p.json").exists()


def test_the_projections_guard_their_inputs_too():
    from trainperf.errors import TrainperfError
    from trainperf.science import measure

    with pytest.raises(TrainperfError, match="--bandwidth"):
        measure.link(float("nan"), 5.0, 2, None, "cpu")
    with pytest.raises(TrainperfError, match="--bandwidth"):
        measure.link(10.0, float("inf"), 2, None, "cpu")


@pytest.mark.parametrize("run_args, expected", [
    (["--set", "bogus_key=1"], "unknown recipe field 'bogus_key'"),
    (["--set", "base_lr=nan"], "base_lr=nan"),
    (["--recipe", "nosuch"], "--recipe 'nosuch'"),
    (["--bogus-option"], "--bogus-option"),
    (["--seed", "-1"], "expected a seed"),
    (["--nproc=2"], "--nproc: set by the script"),
    (["--ou=x"], "--out: set by the script"),
    (["--runs", "3"], "--runs"),
    (["--scale", "full", "--set", "global_batch_size=1000"], "not divisible by 16"),
])
def test_slurm_checks_the_run_arguments_it_embeds(run_args, expected, capsys):
    _refused(["slurm", "ncf", "--nodes", "2", "--gpus-per-node", "8", "--", *run_args], capsys, expected)
    assert capsys.readouterr().out == ""  # no script printed


def test_slurm_still_prints_the_script_for_good_arguments(capsys):
    assert cli.main(["slurm", "ncf", "--nodes", "1", "--gpus-per-node", "2", "--", "--seed", "3"]) == 0
    assert "trainperf run ncf --seed 3" in capsys.readouterr().out


def test_bench_names_an_option_it_has_when_the_batch_does_not_fit(capsys, monkeypatch):
    from trainperf.bench import memory

    monkeypatch.setattr(memory, "available", lambda device: 2**30)  # 1 GiB free, whatever the machine
    code = cli.main(["bench", "ncf", "--synthetic", "--batch-size", "100000000", "--steps", "1", "--warmup", "0",
                     "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--bench-batch" not in err and "fits (--set global_batch_size=" in err, err


def test_a_global_batch_larger_than_an_epoch_is_never_logged_as_used(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "ncf", "--set", "global_batch_size=100000000", "--out", str(out), "--quiet"]) == 1
    result = json.loads((out / "result.json").read_text())
    assert "global_batch_size=100000000: expected at most" in result["abort_reason"]
    assert result["steps"] == 0 and not result["evaluations"]


@pytest.mark.parametrize("argv, expected", [
    (["run", "ncf", "--set", f"global_batch_size={10**400}"], "out of range (at most 9,223,372,036,854,775,807)"),
    (["run", "ncf", "--set", f"global_batch_size={2**63}"], "out of range"),
    (["plan", "llama31_8b", "--set", f"seq_len={-10**30}"], "out of range"),
])
def test_an_integer_past_64_bits_is_one_line(argv, expected, tmp_path, capsys, monkeypatch):
    """Issue 60, 10: `--set global_batch_size=10**400` was an OverflowError traceback."""
    monkeypatch.chdir(tmp_path)
    _refused(argv, capsys, expected)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_plan_never_hangs_on_a_huge_batch_or_device_count(capsys):
    """Issue 60, 11: `plan llama31_8b --batch-size 1000000000000` walked every number up to the batch, and
    `plan dlrm_dcnv2 --devices 50000` ran TorchRec's planner over 50,000 devices: neither ended."""
    import time

    start = time.perf_counter()
    assert cli.main(["plan", "llama31_8b", "--batch-size", "1000000000000"]) == 0
    assert time.perf_counter() - start < 120  # 13 s on this CPU
    assert "| 8 | full |" in capsys.readouterr().out
    _refused(["plan", "dlrm_dcnv2", "--devices", "50000"], capsys, "at most 1,024")
