"""Bad input exits non-zero with one clear line naming the path or option: no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainperf.cli import main


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real entry point, in a fresh interpreter (proves no traceback reaches the user)."""
    return subprocess.run([sys.executable, "-m", "trainperf", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.fixture
def cli(capsys, monkeypatch):
    """In-process main(), for the many error cases (a fresh interpreter costs seconds of torch import)."""
    def invoke(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        code = main(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)
    return invoke


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("trainperf: error: ")
    return lines[0]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_unknown_workload(tmp_path):
    line = _one_line_error(_run_cli("run", "resnot", cwd=tmp_path))
    assert "unknown workload 'resnot'; known workloads: resnet" in line
    assert not (tmp_path / "runs").exists()


def test_bad_set_key_lists_valid_keys(tmp_path, cli):
    line = _one_line_error(cli("run", "resnet", "--set", "learning_rate=1", cwd=tmp_path))
    assert "--set 'learning_rate=1': unknown recipe field" in line and "base_lr" in line
    assert not (tmp_path / "runs").exists()


def test_bad_set_type(tmp_path, cli):
    line = _one_line_error(cli("run", "resnet", "--set", "max_epochs=many", cwd=tmp_path))
    assert "expected an integer, got 'many'" in line


@pytest.mark.parametrize("argv, message", [
    (["run", "dlrm", "--channels-last"], "channels_last=True: not supported by dlrm"),
    (["run", "resnet", "--cuda-graphs", "--device", "cpu"], "CUDA Graphs need a CUDA GPU; this run is on cpu"),
    # A parallelism the processes cannot hold: the workload's record (Workload.parallelism) checked by its engine.
    (["run", "gpt_oss_20b", "--set", "ep=2"], "gpt_oss_20b: expert parallelism ep=2: needs launched processes"),
    (["run", "gpt_oss_20b", "--set", "ep=4", "--nproc", "2"], "ep=4: the 2 processes are not a multiple of it"),
    (["scale", "gpt_oss_20b", "--set", "ep=2", "--nproc", "1,2"], "needs launched processes (--nproc 2"),
])
def test_unsupported_switch_is_refused_before_anything_is_written(tmp_path, cli, argv, message):
    line = _one_line_error(cli(*argv, cwd=tmp_path))
    assert message in line
    assert not (tmp_path / "runs").exists()


def test_full_without_data(tmp_path, cli):
    line = _one_line_error(cli("run", "resnet", "--scale", "full", cwd=tmp_path))
    assert "needs --data DIR" in line


def test_missing_data_folder(tmp_path, cli):
    missing = tmp_path / "no-such-imagenet"
    line = _one_line_error(cli("run", "resnet", "--scale", "full", "--data", str(missing), cwd=tmp_path))
    assert str(missing) in line and "does not exist" in line
    assert not (tmp_path / "runs").exists()


def test_malformed_data_folder_names_what_is_missing(tmp_path, cli):
    data = tmp_path / "imagenet"
    (data / "train" / "n01440764").mkdir(parents=True)
    (data / "train" / "n01440764" / "a.JPEG").write_bytes(b"not really")
    line = _one_line_error(cli("prepare", "resnet", "--scale", "full", "--data", str(data), cwd=tmp_path))
    assert str(data / "val") in line and "expected val/<wnid>/*.JPEG" in line


def test_empty_class_folder(tmp_path, cli):
    data = tmp_path / "imagenet"
    (data / "train" / "n01440764").mkdir(parents=True)
    (data / "val" / "n01440764").mkdir(parents=True)
    line = _one_line_error(cli("prepare", "resnet", "--scale", "full", "--data", str(data), cwd=tmp_path))
    assert "n01440764: class folder holds no .JPEG images" in line


def test_out_folder_with_a_run_is_refused(tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mlperf_log.txt").write_text("old")
    line = _one_line_error(cli("run", "resnet", "--out", str(out), cwd=tmp_path))
    assert "already holds a run" in line
    assert (out / "mlperf_log.txt").read_text() == "old"


def test_check_missing_log(tmp_path, cli):
    line = _one_line_error(cli("check", str(tmp_path / "nope.txt"), cwd=tmp_path))
    assert "nope.txt: no such log file" in line


def test_check_non_mlperf_file(tmp_path, cli):
    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    line = _one_line_error(cli("check", str(f), cwd=tmp_path))
    assert "no ':::MLLOG' submission_benchmark record" in line


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpeg_ends_run_aborted_with_one_line_naming_the_file(tmp_path, capsys, workers):
    """With DataLoader workers too: the worker's traceback stays out of the terminal, the log and the result."""
    import json

    from tests.conftest import imagenet_folder, read_log

    data = imagenet_folder(tmp_path / "imagenet")
    bad = data / "val" / "n01440760" / "n01440760_0.JPEG"
    bad.write_bytes(b"\xff\xd8 truncated")
    out = tmp_path / "run"
    code = main(["run", "resnet", "--scale", "full", "--data", str(data), "--out", str(out), "--quiet",
                 "--set", f"num_workers={workers}", "--set", "global_batch_size=4", "--set", "max_epochs=1",
                 "--set", "eval_first=1", "--set", "image_size=32", "--set", "eval_resize=36"])
    assert code == 1
    printed = capsys.readouterr().out
    assert f"{bad}: cannot decode image" in printed and "Traceback" not in printed
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "aborted" and result["abort_reason"].startswith(f"{bad}: cannot decode image")
    assert "\n" not in result["abort_reason"]
    stop = read_log(out / "mlperf_log.txt")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["reason"] == result["abort_reason"]


def test_list_shows_workloads(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "resnet" in out and "top1" in out and "0.759" in out and "0.97" in out


@pytest.mark.parametrize("argv", [["--version"]])
def test_version(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


@pytest.mark.parametrize("written, message", [
    (None, "the run left no result.json (launcher exit code 1"),
    ({"status": "success"}, "rank 0 reached the target but a process failed (launcher exit code 1)"),
])
def test_failed_launch_is_an_error_even_without_a_result(tmp_path, cli, monkeypatch, written, message):
    """A rank killed before rank 0 saved its result used to make `run --nproc 2` exit 0."""
    import json

    from trainperf.runtime import distributed

    out = tmp_path / "ddp"

    def launch(nproc: int, argv: list[str]) -> distributed.Launched:
        out.mkdir()
        if written is not None:
            (out / "result.json").write_text(json.dumps(written))
        return distributed.Launched(code=1)

    monkeypatch.setattr(distributed, "launch_local", launch)
    line = _one_line_error(cli("run", "resnet", "--nproc", "2", "--out", str(out), cwd=tmp_path))
    assert message in line


def test_main_module_runs_the_cli_only_as_main():
    """A process spawned by `python -m trainperf …` imports this module as __mp_main__."""
    import runpy

    runpy.run_module("trainperf", run_name="__mp_main__")  # must not parse sys.argv and exit
    with pytest.raises(SystemExit):
        runpy.run_module("trainperf", run_name="__main__")


def test_each_option_is_defined_once_and_no_parser_function_is_long():
    """Every command registers its own options beside its cmd_* function; an option several commands take
    comes from one helper of cli/options.py (its type and metavar the same everywhere)."""
    import ast
    import collections
    from pathlib import Path

    import trainperf.cli

    folder = Path(trainperf.cli.__file__).parent
    defined: collections.Counter = collections.Counter()
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
                defined.update(flags)
            if isinstance(node, ast.FunctionDef) and (node.name.startswith("add_") or node.name == "build_parser"):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, f"{path.name}: {node.name} is {length} lines"
    twice = {flag: n for flag, n in defined.items() if n > 1}
    assert not twice, f"options defined more than once: {twice}"


def test_the_make_commands_are_what_the_workloads_declare():
    """Each `make-*` command comes from its workload's MAKES literal; the command line names no workload."""
    import re

    import trainperf.cli
    from trainperf import registry
    from trainperf.cli import build_parser

    declared = registry.makes()
    assert {command: name for command, (name, _) in declared.items()} == {
        "make-phase1": "bert", "make-lora-base": "llama2_70b_lora", "make-minigo-target": "minigo",
        "make-grpo-base": "qwen35_397b_grpo"}
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert set(declared) <= set(commands)
    for path in Path(trainperf.cli.__file__).parent.glob("*.py"):
        assert not re.search(r"registry\.get\([\"']", path.read_text()), path
