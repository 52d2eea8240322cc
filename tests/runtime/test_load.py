"""The machine-load monitor: a run timed beside another busy process says so, in result.json and in
one line; its own processes (data workers, sibling ranks) are not 'other processes'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from trainperf.runtime import load

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc (Linux)")

BURN = "import time\nt = time.time() + 20\nwhile time.time() < t: pass\n"


def _orphan_burner() -> int:
    """A CPU-bound process that is not ours (its parent exits: it is re-parented to init), as another
    user's training would be."""
    out = subprocess.run(["sh", "-c", f'{sys.executable} -c "{BURN}" >/dev/null 2>&1 & echo $!'],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def test_another_busy_process_is_seen_and_the_run_called_busy():
    pid = _orphan_burner()
    try:
        assert pid not in load.run_processes()
        monitor = load.LoadMonitor(every_s=0.5).start()
        time.sleep(1.5)
        summary = monitor.stop()
    finally:
        os.kill(pid, 9)
    assert summary["others_cores_mean"] >= 0.6, summary  # one spinning core, measured over the run
    assert summary["busy"] and "other processes used" in summary["why"]
    assert "not a figure" in load.busy_note(summary)
    json.dumps(summary)  # goes into result.json as it is


def test_the_runs_own_processes_are_the_run():
    child = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        assert child.pid in load.run_processes()
        assert load.run_processes(root=child.pid) >= {child.pid}
    finally:
        child.kill()
        child.wait()


def test_the_verdict_is_read_from_the_samples():
    monitor = load.LoadMonitor(cores=2)
    monitor.samples = [load.Sample(0.2, 0.1, 0.05), load.Sample(2.2, 0.4, 0.1)]
    assert not monitor.summary()["busy"] and load.busy_note(monitor.summary()) is None
    monitor.samples.append(load.Sample(4.2, 3.0, 3.5))  # mean 1.2 of 2 cores: busy
    summary = monitor.summary()
    assert summary["busy"] and summary["others_cores_max"] == 3.5 and summary["load_1min_max"] == 3.0
    monitor.samples = [load.Sample(0.2, 1.0, 1.0), load.Sample(2.2, 0.1, 0.0), load.Sample(4.2, 0.1, 0.0),
                       load.Sample(6.2, 0.1, 0.0)]
    assert "at the start" in monitor.summary()["why"]  # busy when it began, idle later: still said
    monitor.samples, monitor.gpu_others = [load.Sample(0.2, 0.0, 0.0)], {4242}
    assert "on the GPU (pid 4242)" in monitor.summary()["why"]
