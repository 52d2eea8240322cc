"""Signals: every way a run can be stopped leaves a closed log and a result (prototype tests)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import read_log
from tests.harness.test_run import FakeWorkload, _run
from trainperf.contract import RuntimeContext
from trainperf.errors import Interrupted, TrainperfError
from trainperf.harness import RunConfig, run
from trainperf.harness.run import close_for_rank0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_aborts_with_a_closed_log(tmp_path, sig):
    def on_step(epoch: int, i: int) -> None:
        if epoch == 2 and i == 8:
            os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    result, records = _run(tmp_path, FakeWorkload(scores=[0.1] * 10, on_step=on_step))
    assert (result.status, result.abort_reason) == ("aborted", f"received {sig.name}")
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
    assert signal.getsignal(sig) is before


def test_a_second_signal_cannot_cut_the_closing_short(tmp_path):
    """Ctrl-C pressed twice (or the user's SIGINT, then the launcher's SIGTERM): one abort, one run_stop."""
    def on_step(epoch: int, i: int) -> None:
        if epoch == 2 and i == 8:
            os.kill(os.getpid(), signal.SIGINT)

    saved = []
    workload = FakeWorkload(scores=[0.1] * 10, on_step=on_step)
    cfg = RunConfig(workload=workload, recipe=workload.recipe("mini"), scale="mini", data_dir=tmp_path, seed=7,
                    log_path=tmp_path / "log.txt")

    def on_result(result) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # comes while the result is being saved
        saved.append(result.abort_reason)

    result = run(cfg, RuntimeContext.create("cpu"), on_result=on_result)
    assert saved == ["received SIGINT"] and result.abort_reason == "received SIGINT"
    assert [r["key"] for r in read_log(tmp_path / "log.txt")].count("run_stop") == 1


def test_a_workloads_except_exception_does_not_hide_the_signal(tmp_path):
    def on_step(epoch: int, i: int) -> None:
        if epoch == 2 and i == 8:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10**6):  # the handler runs at a bytecode boundary in here
                    pass
            except Exception as exc:  # noqa: BLE001 - what a decoder's error handling looks like
                raise TrainperfError("x.jpg: cannot decode") from exc

    result, _ = _run(tmp_path, FakeWorkload(scores=[0.1] * 10, on_step=on_step))
    assert result.abort_reason == "received SIGTERM"


def test_an_ignored_signal_stays_ignored(tmp_path):
    """nohup: a closed terminal does not stop the run."""
    def on_step(epoch: int, i: int) -> None:
        if epoch == 2 and i == 8:
            os.kill(os.getpid(), signal.SIGHUP)

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        result, _ = _run(tmp_path, FakeWorkload(scores=[0.2, 0.5, 0.95], on_step=on_step))
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert result.status == "success"


def _cut(log: Path, keep_keys_until: str, partial_line: bool) -> None:
    lines = log.read_text().splitlines(keepends=True)
    last = min(i for i, line in enumerate(lines) if f"\"key\": \"{keep_keys_until}\"" in line)
    text = "".join(lines[:last + 1])
    if partial_line:
        text += lines[last + 1][:40]  # a record the kill cut in the middle
    log.write_text(text)


@pytest.mark.parametrize("partial_line", [False, True])
def test_the_launching_process_closes_the_log_of_a_killed_rank0(tmp_path, partial_line):
    from trainperf.results.compliance import check
    from trainperf.results.logs import read_records

    workload = FakeWorkload(scores=[0.2, 0.5, 0.95])
    cfg = RunConfig(workload=workload, recipe=workload.recipe("mini"), scale="mini", data_dir=tmp_path, seed=7,
                    log_path=tmp_path / "mlperf_log.txt")
    run(cfg, RuntimeContext.create("cpu"))
    _cut(cfg.log_path, "eval_accuracy", partial_line)  # rank 0 killed after its first evaluation
    result = close_for_rank0(cfg, 2, "rank 0 failed first (signal 9)", read_records(cfg.log_path))
    records = read_records(cfg.log_path)
    assert records[-1]["key"] == "run_stop"
    assert records[-1]["metadata"] == {**records[-1]["metadata"], "status": "aborted",
                                       "reason": "rank 0 failed first (signal 9)"}
    assert [r["key"] for r in records].count("run_stop") == 1
    assert result.status == "aborted" and len(result.evaluations) == 1 and result.final_metric == 0.2
    assert result.environment["world_size"] == 2
    assert check(cfg.log_path).valid, check(cfg.log_path).output
    # A log rank 0 closed itself is left as it is.
    before = cfg.log_path.read_text()
    again = close_for_rank0(cfg, 2, "another reason", read_records(cfg.log_path))
    assert cfg.log_path.read_text() == before and again.abort_reason == "rank 0 failed first (signal 9)"


def test_a_launched_run_interrupted_exits_130_with_the_log_closed(tmp_path, monkeypatch, capsys):
    """The launcher passed Ctrl-C on; rank 0 was killed after its grace period, before it closed its run."""
    from trainperf.cli import main
    from trainperf.harness.mlperf_log import MLPerfLog
    from trainperf.runtime import distributed

    out = tmp_path / "run"

    def launch(nproc, argv):
        out.mkdir()
        log = MLPerfLog(out / "mlperf_log.txt")
        for key in ("init_start", "init_stop", "run_start"):
            log.event(key, None, time_ms=1000)
        log.start("epoch_start", metadata={"epoch_num": 1}, time_ms=1001)
        log.close()
        raise Interrupted("SIGINT")

    monkeypatch.setattr(distributed, "launch_local", launch)
    assert main(["run", "ncf", "--nproc", "2", "--out", str(out), "--quiet"]) == 130
    records = read_log(out / "mlperf_log.txt")
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["reason"] == "received SIGINT"
    assert json.loads((out / "result.json").read_text())["abort_reason"] == "received SIGINT"
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_launcher_leaves_the_signal_handlers_as_they_were():
    from trainperf.runtime import distributed

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(s) for s in sigs]
    env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    assert distributed.launch_local(2, ["--version"]).code == 0
    assert [signal.getsignal(s) for s in sigs] == before
    assert os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE") == env


@pytest.mark.slow
@pytest.mark.parametrize("sig", [pytest.param("SIGTERM", marks=pytest.mark.multiprocess),
                                 pytest.param("SIGINT", marks=pytest.mark.second_tier)])
def test_a_signal_while_python_exits_ends_the_command_quietly_with_its_code(sig):
    """A launcher stops the ranks that outlive a failed one with SIGTERM, which may land after the command
    has returned, inside an exit hook (torch's compile report): no traceback, the command's exit code."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import atexit, os, signal, sys, time
        from trainperf.cli import main
        atexit.register(lambda: (os.kill(os.getpid(), signal.{sig}), time.sleep(600)))
        sys.argv = ["trainperf", "list"]
        raise SystemExit(main())
    """)
    # Ended by the signal, not after the exit hook's 600 s: a handler that let Python go on would time out here.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "resnet" in proc.stdout
