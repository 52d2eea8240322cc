"""Running untrusted code — a policy's completion and a task's hidden tests — as a reward.

One call runs one program in a fresh scratch folder under `jail.py`'s confinement (Landlock, seccomp,
rlimits: read its docstring), with a wall-clock limit enforced from here and a watchdog on the scratch
folder's size. Whatever the program does — write outside its folder, fork without end, allocate without
limit, open a socket, sleep forever, signal its parent — it is contained and its outcome is a failure;
the folder is removed afterwards and, since the program cannot create processes, killing it leaves
nothing running.

The reference runs each R2E-Gym task's tests in an Apptainer container (`apptainer exec --writable-tmpfs
--cleanenv --pid --no-mount home,tmp,bind-paths`, NeMo Gym's swe_agents); the full workload goes through
`container_runtime()` instead of this sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.workloads.common.rl import jail

_JAIL = Path(jail.__file__)
_SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo", "/etc/ld.so.cache",
                "/etc/localtime")


@dataclass(frozen=True)
class Limits:
    """What one sandboxed program may use. The defaults fit a small Python test suite."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 512 << 20
    file_bytes: int = 8 << 20
    scratch_bytes: int = 32 << 20
    scratch_entries: int = 2_000
    open_files: int = 64
    output_bytes: int = 64 << 10


@dataclass(frozen=True)
class Outcome:
    """How a sandboxed program ended. `passed` is the only thing a reward reads: exit status 0 within
    every limit."""

    status: str  # "passed", "failed", "timeout", "killed" (a signal or a limit), "scratch" (folder too big)
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _read_only_paths() -> list[str]:
    python = [sys.base_prefix, sys.prefix, sysconfig.get_paths()["stdlib"], os.path.dirname(os.path.realpath(
        sys.executable))]
    return sorted(set(python) | set(_SYSTEM_READ))


def _tail(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[... output cut]" if len(data) > limit else "")


def run(files: Mapping[str, str | bytes], argv: list[str], limits: Limits = Limits(),
        workdir: Path | None = None) -> Outcome:
    """Write `files` (relative paths) into a fresh scratch folder and run `argv` there, confined.
    `argv[0]` "python" means this interpreter without site-packages, user paths or PYTHON* variables
    (`-E -s -S`; the script's folder stays importable, as a task's tests import its solution).
    Raises TrainperfError only when confinement itself fails on this machine."""
    base = Path(tempfile.mkdtemp(prefix="trainperf-sandbox-", dir=workdir))
    scratch, logs = base / "scratch", base / "logs"
    try:
        scratch.mkdir()
        logs.mkdir()
        _write_files(scratch, files)
        program = [sys.executable, "-E", "-s", "-S", *argv[1:]] if argv[0] == "python" else list(argv)
        spec = {"scratch": str(scratch), "argv": program, "read_only": _read_only_paths(), "files": ["/dev/null"],
                "env": {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
                        "PYTHONDONTWRITEBYTECODE": "1"},
                "limits": {k: v for k, v in asdict(limits).items()
                           if k in ("cpu_s", "memory_bytes", "file_bytes", "open_files")}}
        start = time.perf_counter()
        with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(_JAIL), json.dumps(spec)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch, env={},
                                    start_new_session=True, close_fds=True)
            status = None
            try:
                deadline = start + limits.wall_s
                while proc.poll() is None:
                    if time.perf_counter() > deadline:
                        status = "timeout"
                        break
                    if jail._folder_too_big(str(scratch), limits.scratch_bytes, limits.scratch_entries):
                        status = "scratch"
                        break
                    time.sleep(0.02)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.perf_counter() - start
        stderr = _tail(logs / "stderr", limits.output_bytes)
        if proc.returncode == jail.JAIL_FAILED and stderr.startswith("sandbox: "):
            raise TrainperfError(stderr.splitlines()[0])
        if status is None:
            status = "passed" if proc.returncode == 0 else "killed" if proc.returncode < 0 else "failed"
        return Outcome(status, proc.returncode, seconds, _tail(logs / "stdout", limits.output_bytes), stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class Job:
    """A Python script to run in a `Pool`: its files (relative paths), the script's name and arguments."""

    files: Mapping[str, str | bytes]
    script: str
    args: tuple[str, ...] = ()
    limits: Limits = Limits()


def _write_files(folder: Path, files: Mapping[str, str | bytes]) -> None:
    root = folder.resolve()
    for name, content in files.items():
        path = (folder / name).resolve()
        if root not in path.parents:
            raise TrainperfError(f"sandbox: file name {name!r} leaves the scratch folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


class Pool:
    """Many jobs under the same confinement as `run`, without a Python start-up each: one confined server
    (jail.py's `serve`) forks a child per job, `workers` at a time, each child in a nested Landlock domain
    over its own folder only (a completion cannot read or rewrite another's tests) and the no-fork
    filter. What the RL loop uses: a step's rewards are hundreds of test runs.

    Use as a context manager; `run` takes a batch of jobs and returns their outcomes in order."""

    def __init__(self, workers: int = 2, workdir: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="trainperf-pool-", dir=workdir))
        self._next = 0
        self._log = open(self.root.parent / f"{self.root.name}.log", "w+b")  # noqa: SIM115 (kept open)
        jobs = self.root / "jobs"
        jobs.mkdir()
        spec = {"serve": True, "root": str(jobs), "workers": workers, "read_only": _read_only_paths(),
                "files": ["/dev/null"]}
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(_JAIL), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=jobs,
                                     env={}, start_new_session=True, close_fds=True)
        self.jobs = jobs
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if b"ready" not in line:
            self.proc.wait()
            self._log.seek(0)
            message = self._log.read().decode("utf-8", "replace").strip().splitlines()
            self.close()
            raise TrainperfError(message[-1] if message else "sandbox: the pool's server did not start")

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, jobs: list[Job]) -> list[Outcome]:
        ids = []
        for job in jobs:
            self._next += 1
            name = f"j{self._next}"
            (self.jobs / name).mkdir()
            _write_files(self.jobs / name / "work", job.files)
            (self.jobs / name / "work").mkdir(exist_ok=True)
            ids.append(name)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        for name, job in zip(ids, jobs, strict=True):
            limits = job.limits
            line = {"id": name, "dir": name, "argv": [job.script, *job.args], "wall_s": limits.wall_s,
                    "scratch_bytes": limits.scratch_bytes, "scratch_entries": limits.scratch_entries,
                    "limits": {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                               "file_bytes": limits.file_bytes, "open_files": limits.open_files}}
            self.proc.stdin.write(json.dumps(line).encode() + b"\n")
        self.proc.stdin.flush()
        results: dict[str, dict] = {}
        while len(results) < len(ids):
            raw = self.proc.stdout.readline()
            if not raw:
                raise TrainperfError("sandbox: the pool's server stopped before its jobs ended")
            result = json.loads(raw)
            results[result["id"]] = result
        outcomes = []
        for name, job in zip(ids, jobs, strict=True):
            r, home = results[name], self.jobs / name
            outcomes.append(Outcome(r["status"], r.get("returncode"), r["seconds"],
                                    _tail(home / "stdout", job.limits.output_bytes),
                                    _tail(home / "stderr", job.limits.output_bytes)))
            shutil.rmtree(home, ignore_errors=True)
        return outcomes

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)


def container_runtime() -> str:
    """The container runtime the reference runs R2E-Gym's tests in (Apptainer, or its older name
    Singularity), or one line saying it is missing."""
    for name in ("apptainer", "singularity"):
        found = shutil.which(name)
        if found:
            return found
    raise TrainperfError("R2E-Gym's tests run in Apptainer containers as the reference runs them "
                         "(NeMo Gym swe_agents): neither `apptainer` nor `singularity` is on PATH")
