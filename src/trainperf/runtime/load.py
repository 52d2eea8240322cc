"""How busy the machine was while a run was timed: a time-to-train measured beside another training
process is not a figure (two processes' OpenMP threads spinning against each other on 2 cores turned a
4.6 s epoch into 193 s). A monitor samples, every few seconds from the run's start to its end, the
load average and the CPU share that processes outside this run took (from /proc: the whole machine's
busy time less this run's processes: itself, its launcher and their descendants), and which other
processes hold the run's GPU. The run records the samples' summary in result.json and says in one
line when the machine was busy; `score` and `suite` flag such runs.

On a system without /proc only the load average is recorded (and nothing where there is none).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Other processes' CPU, in the machine's cores, above which a run's time is not a figure: a quarter
# of the machine (half a core on 2 cores: one busy foreign thread is enough to disturb a CPU run).
BUSY_SHARE = 0.25
SAMPLE_EVERY_S = 2.0
# The shortest window a CPU share is measured over. /proc counts CPU time in ticks of 10 ms: over the 3-5 ms
# between the monitor's start and its first sample a share could only read 0, 1 or 2 cores, and idle runs
# were called busy "at the start" (35 of 200 readings >= 1 core). Over a second, a tick is 0.01 core.
MIN_WINDOW_S = 1.0
# The launcher of a multi-process run exports its pid, so each rank counts its siblings as the run's.
LAUNCHER_ENV = "TRAINPERF_LAUNCHER_PID"
_PROC = Path("/proc")


def _jiffies(pid: int) -> int | None:
    """CPU time (user + system, in clock ticks) of one process and its reaped children (so a data
    worker that exits moves its time to its parent, not out of the run)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime (fields 14-17 of proc(5))


def _parents() -> dict[int, int]:
    found = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        found[int(entry.name)] = int(text[text.rindex(")") + 2:].split()[1])
    return found


def run_processes(root: int | None = None) -> set[int]:
    """This run's processes: the launcher and everything below it (trainperf's own launcher; else
    torchrun's agent or Slurm's step daemon, the parent of a launched rank; else this process)."""
    if root is None:
        launched = "LOCAL_RANK" in os.environ
        root = int(os.environ.get(LAUNCHER_ENV) or (os.getppid() if launched else os.getpid()))
    parents = _parents()
    family, grew = {root, os.getpid()}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in family and pid not in family}
        family |= more
        grew = bool(more)
    return family


def _machine_busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    try:
        first = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user time
    return total - idle, total


@dataclass
class Sample:
    at_s: float  # since the monitor started
    load_1min: float | None
    others_cores: float | None  # other processes' CPU over the window ending here, in cores
    window_s: float = 0.0  # the window others_cores was measured over (at least MIN_WINDOW_S but at the end)


@dataclass
class LoadMonitor:
    """Samples in a daemon thread; `summary()` when the run ends."""

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    every_s: float = SAMPLE_EVERY_S
    gpu_index: int | None = None
    samples: list[Sample] = field(default_factory=list)
    gpu_others: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._previous, self._since = self._cpu_state(), self._t0

    def _cpu_state(self) -> tuple[int, int, int] | None:
        machine = _machine_busy_jiffies()
        if machine is None:
            return None
        ours = sum(j for pid in run_processes() if (j := _jiffies(pid)) is not None)
        return machine[0], machine[1], ours

    def sample(self, last: bool = False) -> Sample:
        """One sample now: the load average, and other processes' CPU over the window since the previous
        share, once that window is MIN_WINDOW_S long (shorter, it is left to grow; the `last` sample closes
        it, as short as it is, only when nothing was measured before)."""
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        at, others, window = time.monotonic(), None, 0.0
        measured = any(s.others_cores is not None for s in self.samples)
        if at - self._since >= MIN_WINDOW_S or (last and not measured):
            now = self._cpu_state()
            if now is not None and self._previous is not None:
                busy, total, ours = (a - b for a, b in zip(now, self._previous, strict=True))
                if total > 0:
                    # total counts every CPU's ticks: busy/total is the machine's busy share.
                    others, window = max(0.0, (busy - ours) / total * self.cores), at - self._since
            self._previous, self._since = now, at
        if self.gpu_index is not None:
            from trainperf import devices

            self.gpu_others |= set(devices.gpu_processes(self.gpu_index)) - run_processes()
        found = Sample(at_s=round(at - self._t0, 3), load_1min=load,
                       others_cores=None if others is None else round(others, 3), window_s=round(window, 3))
        self.samples.append(found)
        return found

    def start(self) -> LoadMonitor:
        self.sample()  # the load average now; the CPU shares come with the first window
        self._thread = threading.Thread(target=self._loop, name="trainperf-load", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample(last=True)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """What result.json records: the start, the mean and peak of other processes' CPU, and the verdict."""
        measured = [s for s in self.samples if s.others_cores is not None]
        shares = [s.others_cores for s in measured]
        loads = [s.load_1min for s in self.samples if s.load_1min is not None]
        weight = sum(s.window_s for s in measured)
        mean = (sum(s.others_cores * s.window_s for s in measured) / weight if weight > 0 else
                sum(shares) / len(shares) if shares else None)  # each window by its length
        # The start: the first window with a CPU share (the load average alone before it).
        start = next((s for s in self.samples if s.others_cores is not None), None)
        reasons = []
        limit = BUSY_SHARE * self.cores
        if start is not None and start.others_cores is not None and start.others_cores >= limit:
            reasons.append(f"other processes used {start.others_cores:.1f} of {self.cores} cores at the start")
        if mean is not None and mean >= limit:
            reasons.append(f"other processes used {mean:.1f} of {self.cores} cores on average during the run")
        if self.gpu_others:
            reasons.append(f"{len(self.gpu_others)} other process(es) on the GPU (pid "
                           f"{', '.join(map(str, sorted(self.gpu_others)[:3]))})")
        return {
            "cores": self.cores,
            "start": asdict(start) if start is not None else None,
            "others_cores_mean": None if mean is None else round(mean, 3),
            "others_cores_max": None if not shares else round(max(shares), 3),
            "load_1min_max": None if not loads else round(max(loads), 2),
            "gpu_other_pids": sorted(self.gpu_others),
            "samples": len(self.samples),
            "busy": bool(reasons),
            "why": "; ".join(reasons),
        }


def busy_note(load: dict[str, Any] | None) -> str | None:
    """The one line a run, `score` or `suite` says about a run timed on a busy machine; None otherwise."""
    if not load or not load.get("busy"):
        return None
    return (f"the machine was busy ({load.get('why')}): this time-to-train is not a figure; run it again on an "
            "idle machine")
