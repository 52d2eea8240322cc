"""Golden records: each mini's first steps, exactly, so that any numeric change shows.

A workload's mini runs its first `steps` training steps through the harness (its real data, model,
optimizer, schedule and loop) from a fixed seed, on one CPU thread, and the loss of every step and the
value of the evaluation that ends the run are kept in one file, `goldens.json`, beside the calibration.
The gate (tests/test_goldens.py) runs them again and fails on the first step whose loss differs,
naming the workload and the step. Recording them is `benchmarks/mini_ttt.py W --runs 10 --record`: the
10-seed calibration is measured on the same code, and calibration.json keeps the golden record's hash
(a test holds the two together), so a change that moves a workload's numbers cannot land with a stale
claim that its mini reaches its target.

Exactness: a loss is kept as the float32 value the step returned (as a Python float). On the CPU kernel
family it was recorded on (`torch.backends.cpu.get_cpu_capability()`, one thread) and the same CPU vendor
(AMD's and Intel's AVX-512 kernels differ in the last bit; `cpu_vendor` keeps each record's) the losses
repeat bit for bit; elsewhere (AVX2 vs AVX-512 kernels sum in other orders), they are held within
RTOL_ELSEWHERE and the test says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainperf.contract import RuntimeContext, Workload
from trainperf.errors import RunAborted, TrainperfError

if TYPE_CHECKING:
    from trainperf.contract import GoldenSpec

PATH = Path(__file__).resolve().parents[1] / "goldens.json"
SEED = 0
THREADS = 1
# Between kernel families (AVX2 and AVX-512 reduce in other orders) a few steps drift by ~1e-6 relative.
RTOL_ELSEWHERE = 1e-4


def cpu_vendor() -> str | None:
    """The CPU's vendor (/proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD), None where it is not known."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), None)


def recorded_here(name: str, data: dict[str, Any]) -> bool:
    """Whether `name`'s record came from this CPU vendor (goldens.json's `cpu_vendor`, by workload, `default` for
    records kept before it was): AMD's and Intel's AVX-512 kernels round differently in the last bit, so only
    the same vendor repeats a record bit for bit (an unknown vendor is taken as the same)."""
    vendors = data.get("cpu_vendor", {})
    recorded, here = vendors.get(name, vendors.get("default")), cpu_vendor()
    return recorded is None or here is None or recorded == here


def settings() -> dict[str, Any]:
    """What a golden record is reproduced with (recorded with it; the CPU kernels decide exactness)."""
    return {"seed": SEED, "threads": THREADS, "device": "cpu", "torch": torch.__version__.split("+")[0],
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


@dataclass
class _Recorder:
    """The harness's progress display, asking for every step's loss (one device read a step: fine on a CPU)."""

    steps: int
    stop_after: bool  # end the run after `steps` (no evaluation) instead of letting its budget end it

    def __post_init__(self) -> None:
        self.losses: list[float] = []

    def start(self, *args: Any) -> None:
        pass

    def epoch_start(self, epoch: int) -> None:
        pass

    def wants_loss(self) -> bool:
        return True

    def step(self, epoch: int, step: int, samples_per_s: float, loss: float | None) -> None:
        assert loss is not None
        self.losses.append(float(loss))
        if self.stop_after and len(self.losses) >= self.steps:
            raise RunAborted(f"golden record: {self.steps} steps")

    def epoch_end(self, *args: Any) -> None:
        pass

    def evaluation(self, *args: Any) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def spec_of(workload: Workload) -> GoldenSpec:
    spec = workload.golden
    if spec is None:
        raise TrainperfError(f"{workload.name}: declares no golden record (a full-scale-only workload)")
    return spec


def measure(workload: Workload, data_dir: Path, spec: GoldenSpec | None = None, log_path: Path | None = None
            ) -> dict[str, Any]:
    """The first steps of `workload`'s mini as the harness trains them: every step's loss, and the value of
    the evaluation that ends the run (None where the workload's is too slow to be part of the gate).
    Uses nothing of trainperf but the harness's `run` and a recipe's overrides, so that it measures the
    code of an older commit too (benchmarks/goldens.py --at COMMIT), given the spec."""
    from trainperf.harness import RunConfig, run

    spec = spec or spec_of(workload)
    base = workload.recipe("mini")
    sets = list(spec.sets)
    if spec.evaluate:
        sets.append(f"max_samples={spec.steps * base.global_batch_size}")  # its budget's end is evaluated
    recipe = base.with_overrides(sets) if sets else base
    recorder = _Recorder(spec.steps, stop_after=not spec.evaluate)
    with _threads(THREADS), tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=data_dir, seed=SEED,
                           log_path=log_path or Path(tmp) / "log.txt")
        result = run(config, RuntimeContext.create("cpu", seed=SEED), progress=recorder)  # type: ignore[arg-type]
    if len(recorder.losses) < spec.steps:
        raise TrainperfError(f"{workload.name}: golden run ended after {len(recorder.losses)} of {spec.steps} steps "
                             f"({result.abort_reason})")
    evaluation = result.evaluations[-1].value if spec.evaluate and result.evaluations else None
    return {"steps": spec.steps, "sets": sets, "losses": recorder.losses[:spec.steps], "evaluation": evaluation}


def digest(entry: dict[str, Any]) -> str:
    """The hash of one workload's golden record (what calibration.json keeps beside its calibration)."""
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]


def load(path: Path = PATH) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"settings": settings(), "workloads": {}}
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: unreadable golden records ({exc})") from None
    return data


def record(name: str, entry: dict[str, Any], path: Path = PATH) -> str:
    """Write one workload's golden record (the others kept); its hash."""
    from trainperf.files import write_json_atomic

    data = load(path)
    if data.get("settings") != settings():
        # Every record is reproduced with one set of settings: another machine's records are not mixed in.
        differs = sorted(k for k in settings() if data.get("settings", {}).get(k) != settings()[k])
        if data.get("workloads") and set(data["workloads"]) - {name}:
            raise TrainperfError(f"{path}: recorded with other settings ({', '.join(differs)}: "
                                 f"{[data.get('settings', {}).get(k) for k in differs]}, here "
                                 f"{[settings()[k] for k in differs]}); record every workload again here")
        data["settings"] = settings()
    data.setdefault("workloads", {})[name] = entry
    data["workloads"] = dict(sorted(data["workloads"].items()))
    vendor = cpu_vendor()
    if vendor is not None:
        data.setdefault("cpu_vendor", {})[name] = vendor
    write_json_atomic(path, data)
    return digest(entry)


def differences(name: str, found: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Where a measured record departs from the recorded one, first step first (empty: none)."""
    recorded = data.get("workloads", {}).get(name)
    if recorded is None:
        return [f"{name}: no golden record (benchmarks/mini_ttt.py {name} --runs 10 --record writes it)"]
    exact = data.get("settings") == settings() and recorded_here(name, data)
    if found["sets"] != recorded["sets"] or found["steps"] != recorded["steps"]:
        return [f"{name}: the golden run's settings changed ({recorded['sets']} -> {found['sets']}); record again"]

    def same(a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return a is b
        if exact:
            return a == b or (math.isnan(a) and math.isnan(b))
        return math.isclose(a, b, rel_tol=RTOL_ELSEWHERE, abs_tol=1e-12)

    out = []
    for i, (now, was) in enumerate(zip(found["losses"], recorded["losses"], strict=True), 1):
        if not same(now, was):
            out.append(f"{name}: step {i} loss {now!r}, recorded {was!r}")
    was_eval, now_eval = recorded.get("evaluation"), found.get("evaluation")
    if isinstance(was_eval, dict) or isinstance(now_eval, dict):
        equal = isinstance(was_eval, dict) and isinstance(now_eval, dict) and was_eval.keys() == now_eval.keys() \
            and all(same(now_eval[k], was_eval[k]) for k in was_eval)
    else:
        equal = same(now_eval, was_eval)
    if not equal:
        out.append(f"{name}: evaluation after step {found['steps']}: {now_eval!r}, recorded {was_eval!r}")
    return out
