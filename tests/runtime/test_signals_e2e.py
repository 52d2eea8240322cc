"""The exit-code promise, end to end, as a user's shell or scheduler delivers signals: Ctrl-C to the
job's process group, SIGTERM or SIGHUP (a closed terminal) to the command, and rank 0 killed, in one
and two processes. Each run is stopped after its first evaluation (its target is out of reach, so it
is still training): the command exits 130 (1 when a rank was killed), its log ends with `run_stop`
`aborted` and passes the official checker, and result.json says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import read_log
from trainperf.results.compliance import check

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")]


def _rank_pids(parent: int, rank: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == parent and f"RANK={rank}".encode() in env:
            found.append(int(entry.name))
    return found


# The gate keeps one stop in one process and one in a launched pair; every other way, the second tier.
_SECOND = pytest.mark.second_tier


@pytest.mark.parametrize("nproc, how, code", [
    pytest.param(1, "ctrl-c", 130, marks=_SECOND), pytest.param(1, "SIGTERM", 130, marks=pytest.mark.multiprocess),
    pytest.param(1, "SIGHUP", 130, marks=_SECOND), pytest.param(2, "ctrl-c", 130, marks=pytest.mark.multiprocess),
    pytest.param(2, "SIGTERM", 130, marks=_SECOND), pytest.param(2, "SIGHUP", 130, marks=_SECOND),
    pytest.param(2, "kill rank 0", 1, marks=_SECOND),
])
def test_a_stopped_run_exits_as_promised_with_its_log_closed(tmp_path, nproc, how, code):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINPERF_COLLECTIVE_TIMEOUT_S": "30"}
    cmd = [sys.executable, "-m", "trainperf", "run", "ncf", "--nproc", str(nproc), "--seed", "0", "--out", str(out),
           "--quiet", "--set", "target=0.99", "--set", "max_epochs=40"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group, as a shell job has
    log = out / "mlperf_log.txt"
    deadline = time.time() + 600
    try:
        while not (log.exists() and '"eval_accuracy"' in log.read_text()):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "kill rank 0":
            victims = _rank_pids(proc.pid, 0) if nproc > 1 else []
            assert victims
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
        else:
            proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    records = read_log(log)
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
    assert [r["key"] for r in records].count("run_stop") == 1
    verdict = check(log, "0.7.0")
    complaints = [line for line in verdict.output.splitlines() if line.startswith("WARNING")]
    assert verdict.valid or all("checks for eval_accuracy" in line for line in complaints), verdict.output
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "aborted"
    expected = "rank 0 failed first" if how == "kill rank 0" else "received SIG"
    assert expected in result["abort_reason"], result["abort_reason"]
