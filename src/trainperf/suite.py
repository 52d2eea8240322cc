"""`trainperf suite`: a whole round in one command. Every registered workload (or a chosen few) runs
its series of runs into one folder in the MLPerf results layout, then one report reads them back:
a round table, one convergence figure per workload, and the environment.

A failing workload does not stop the round: it becomes a row with its reason. The folder holds one
results tree per compliance ruleset (`round-1.0.0/results/<system>/<benchmark>/result_N.txt`), since
two rounds may use the same benchmark key (SSD in v1.0, RetinaNet under `ssd` in v2.0).
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainperf import jobs, registry
from trainperf.contract import Workload
from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic
from trainperf.power import PowerRequest

Say = Callable[[str], None]
# Before any workload has finished: a run's wall time beyond its time-to-train (process start, data
# preparation, model build, untimed evaluations). Replaced by what the finished workloads show.
FIRST_OVERHEAD_S = 8.0
INTERRUPTED = "interrupted"


@dataclass
class SuiteRow:
    workload: str
    benchmark: str
    ruleset: str
    metric: str
    target: str
    runs: int
    converged: int
    status: str  # "ok", "partial" (some runs missed), "failed", "not run" (the round was interrupted)
    reason: str = ""
    score_minutes: float | None = None  # MLPerf olympic mean, or the mean of converged runs when too few
    score_kind: str = ""  # "olympic" | "mean" | "single"
    times_s: list[float] = field(default_factory=list)  # time-to-train of each converged run
    epochs_to_target: float | None = None  # median over converged runs (samples for a sample cadence)
    epoch_unit: str = "epochs"
    samples_per_s: float | None = None  # median training throughput
    wall_s: float = 0.0  # the workload's whole wall time in this suite, setup included
    results: str = ""  # its results folder (result_N.txt)
    run_dirs: list[str] = field(default_factory=list)
    busy_runs: int = 0  # runs timed while other processes loaded the machine: their times are not figures


def parse_only(text: str | None, scale: str = "mini") -> list[str]:
    """--only a,b: registered names in registry order; every name is checked. Without it, every workload
    that declares the scale (a full-scale-only workload has no mini to run)."""
    known = registry.names()
    if text is None:
        return [n for n, w in registry.usable().items() if scale in w.scales]
    wanted = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise TrainperfError(f"--only {text!r}: unknown workload(s) {', '.join(unknown) or '(none given)'}; "
                             f"known: {', '.join(known)}")
    lacking = [n for n in wanted if scale not in registry.get(n).scales]
    if lacking:
        raise TrainperfError(f"--only {text!r}: {', '.join(lacking)} declare(s) no {scale} scale")
    return [n for n in known if n in wanted]


def estimate_s(workload: Workload, scale: str, runs: int) -> float | None:
    """A workload's expected time-to-train for `runs` runs (the calibrated mini medians of
    calibration.json; unknown at full scale or where not calibrated)."""
    from trainperf import calibration

    found = calibration.main(workload.name) if scale == "mini" else None
    if found is None:
        return None
    return found.median_s * runs


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def _tree_name(ruleset: str) -> str:
    return f"round-{ruleset}"


def resumable(out_dir: Path, names: Sequence[str], scale: str, runs: int, seed: int | None,
              system: str | None = None, data_root: Path | None = None, device: str | None = None
              ) -> dict[str, Any]:
    """What a suite folder being resumed holds: its seed and the rows of the workloads that finished
    (the rest run again, each series resumed). The same round only: the same workloads, scale, run
    count, system, data and device, and the seed it drew (one line naming what differs otherwise): a
    row never counts the runs of two systems."""
    path = out_dir / "suite.json"
    if not path.exists():
        return {"seed": seed, "rows": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        recorded = {"scale": data["scale"], "runs": data["runs"], "seed": data["seed"],
                    "only": data.get("workloads") or [r["workload"] for r in data["rows"]],
                    # Suites recorded before these were kept ran with the defaults.
                    "system": data.get("system"), "data": data.get("data"), "device": data.get("device")}
        rows = {r["workload"]: SuiteRow(**r) for r in data["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainperfError(f"{path}: not a trainperf suite file ({type(exc).__name__}); choose another "
                             "folder") from None
    asked = {"scale": scale, "runs": runs, "seed": recorded["seed"] if seed is None else seed, "only": list(names),
             "system": system, "data": _root(data_root), "device": device}
    for key, value in asked.items():
        if value != recorded[key]:
            shown = ",".join(value) if key == "only" else "(the default)" if value is None else value
            was = ",".join(recorded[key]) if key == "only" else "(the default)" if recorded[key] is None else \
                recorded[key]
            raise TrainperfError(f"--resume: {path} is a suite with --{key} {was}, this command says --{key} "
                                 f"{shown}; a resumed suite must be the same round")
    done = {name: row for name, row in rows.items() if row.status != "not run" and row.reason != INTERRUPTED}
    return {"seed": recorded["seed"], "rows": done}


def run_suite(names: Sequence[str], scale: str, runs: int, out_dir: Path, seed: int, device: str | None = None,
              data_root: Path | None = None, system: str | None = None, say: Say = print, warn: Say = print,
              done: dict[str, SuiteRow] | None = None, power: PowerRequest | None = None) -> list[SuiteRow]:
    """Each workload's series in turn; returns one row per workload (written to suite.json as it goes).
    `done`: the rows of a suite being resumed (see `resumable`): those workloads are not run again, and
    the others resume their series."""
    if runs < 1:
        raise TrainperfError(f"--runs {runs}: expected >= 1")
    if (out_dir / "suite.json").exists() and done is None:
        raise TrainperfError(f"--out {out_dir}: already holds a suite; add --resume to go on with it, or choose "
                             "another folder")
    resume, done = done is not None, done or {}
    same = {"system": system, "data": _root(data_root), "device": device}  # what a resumed suite must repeat
    workloads = [registry.get(n) for n in names]
    rows: list[SuiteRow] = []
    used: dict[str, set[str]] = {}
    started = time.perf_counter()
    ttt_seen, median_seen, overheads = 0.0, 0.0, []  # what the finished workloads took vs their medians
    for index, workload in enumerate(workloads, 1):
        recipe = workload.recipe(scale)
        ruleset = recipe.ruleset or workload.mlperf.ruleset
        tree = _tree_name(ruleset)
        if workload.benchmark in used.setdefault(tree, set()):
            tree = f"{tree}-{workload.name}"  # a second workload with this key in one round: its own tree
        used.setdefault(tree, set()).add(workload.benchmark)
        # Time left: the calibrated medians, scaled by how this machine compares so far, plus each run's
        # time off the clock as seen so far.
        ratio = ttt_seen / median_seen if median_seen else 1.0
        overhead = statistics.fmean(overheads) if overheads else FIRST_OVERHEAD_S
        left = [estimate_s(w, scale, runs) for w in workloads[index - 1:]]
        eta = ("" if any(e is None for e in left) else
               f", about {_clock(sum(e for e in left if e is not None) * ratio + len(left) * runs * overhead)} left")
        if workload.name in done:
            rows.append(done[workload.name])
            say(f"[{index}/{len(workloads)}] {workload.name}: kept from the suite being resumed "
                f"({rows[-1].status})")
            continue
        say(f"[{index}/{len(workloads)}] {workload.name}: {runs} run(s) at {scale} scale "
            f"(elapsed {_clock(time.perf_counter() - started)}{eta})")
        row = _row(workload, scale, runs, "failed")
        t0 = time.perf_counter()
        request = jobs.RunRequest(workload=workload.name, scale=scale, device=device, seed=seed, runs=runs,
                                  out=str(out_dir / tree), system=system, quiet=True, resume=resume, power=power,
                                  data=str(data_root / workload.name) if data_root is not None else None,
                                  command=jobs.command_line(["run", workload.name, "--scale", scale,
                                                             "--seed", str(seed), "--runs", str(runs)]))
        stopped = False
        try:
            stopped = jobs.start(request, say=lambda line: None, warn=lambda line: None).code == 130
        except TrainperfError as exc:
            row.reason = str(exc)
        except KeyboardInterrupt:
            stopped = True
        except Exception as exc:  # noqa: BLE001 - a broken workload is a row with its reason, never the end
            last = traceback.extract_tb(exc.__traceback__)[-1]
            row.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} " \
                         f"({Path(last.filename).name}:{last.lineno})"
        _fill(row, out_dir / tree, time.perf_counter() - t0)
        rows.append(row)
        if stopped:  # the user stopped the round: what finished is kept and reported, the rest is not run
            row.status, row.reason = "failed", INTERRUPTED
            rows += [_row(w, scale, runs, "not run", "the round was interrupted") for w in workloads[index:]]
            _save(out_dir, rows, scale, runs, seed, started, names, same)
            warn(f"suite: interrupted during {workload.name}; the finished workloads are kept (add --resume to "
                 "the same command to go on)")
            return rows
        _save(out_dir, rows, scale, runs, seed, started, names, same)
        estimate = estimate_s(workload, scale, runs)
        if estimate is not None and row.times_s and row.converged == row.runs:
            ttt_seen += sum(row.times_s)
            median_seen += estimate
            overheads.append((row.wall_s - sum(row.times_s)) / row.runs)
        done = f"{row.converged}/{row.runs} converged"
        if row.times_s:
            done += f", time-to-train {statistics.median(row.times_s):.1f} s (median)"
        say(f"[{index}/{len(workloads)}] {workload.name}: {row.status} ({done}; wall {row.wall_s:.0f} s)"
            + (f": {row.reason}" if row.reason else ""))
        if row.status == "failed":
            warn(f"{workload.name}: failed: {row.reason}")
    say(f"suite: {sum(r.status == 'ok' for r in rows)} of {len(rows)} workloads reached their targets in every "
        f"run; wall time {_clock(time.perf_counter() - started)}")
    return rows


def _row(workload: Workload, scale: str, runs: int, status: str, reason: str = "") -> SuiteRow:
    """A workload's row before its runs are read back."""
    recipe = workload.recipe(scale)
    return SuiteRow(workload=workload.name, benchmark=workload.benchmark,
                    ruleset=recipe.ruleset or workload.mlperf.ruleset,
                    metric=workload.metric.name, target=workload.metric.describe_target(recipe.target), runs=runs,
                    converged=0, status=status, reason=reason,
                    epoch_unit="samples" if recipe.log_epoch_num == "samples" else "epochs")


def _fill(row: SuiteRow, tree: Path, wall: float) -> None:
    """Read the workload's finished runs back from its results tree."""
    from trainperf.results import scoring

    row.wall_s = wall
    details = sorted(tree.glob(f"trainperf/*/{row.benchmark}/run_*/result.json"),
                     key=lambda p: int(p.parent.name.removeprefix("run_")))
    results = []
    for path in details:
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
        row.run_dirs.append(str(path.parent))
    ok = [r for r in results if r.get("status") == "success"]
    row.busy_runs = sum(1 for r in results if (r.get("machine_load") or {}).get("busy"))
    row.converged = len(ok)
    row.times_s = [float(r["time_to_train_s"]) for r in ok]
    if ok:
        key = "samples_to_target" if row.epoch_unit == "samples" else "epochs_to_target"
        points = [float(r[key]) for r in ok if r.get(key) is not None]
        row.epochs_to_target = statistics.median(points) if points else None
    rates = [float(r["train_samples_per_s"]) for r in results if r.get("train_samples_per_s")]
    row.samples_per_s = statistics.median(rates) if rates else None
    folders = sorted(tree.glob(f"results/*/{row.benchmark}"))
    if folders and any(folders[0].glob("result_*.txt")):
        row.results = str(folders[0])
        scored = scoring.score_folder(folders[0])
        if scored.score is not None:
            row.score_minutes, row.score_kind = scored.score, "olympic"
        elif scored.mean is not None:
            row.score_minutes, row.score_kind = scored.mean, "single" if len(scored.runs) == 1 else "mean"
    if not results and not row.reason:
        row.reason = "no run finished (see the run folders)"
    if results and not row.reason:
        failed = [r.get("abort_reason") or r.get("status") for r in results if r.get("status") != "success"]
        if len(results) < row.runs:
            failed.append(f"{row.runs - len(results)} run(s) not started")
        row.reason = "; ".join(dict.fromkeys(str(f) for f in failed))
    row.status = "ok" if row.converged == row.runs else "partial" if row.converged else "failed"


def _root(data_root: Path | None) -> str | None:
    return str(Path(data_root).expanduser().absolute()) if data_root is not None else None


def _save(out_dir: Path, rows: list[SuiteRow], scale: str, runs: int, seed: int, started: float,
          names: Sequence[str], same: dict[str, Any]) -> None:
    write_json_atomic(out_dir / "suite.json", {
        "scale": scale, "runs": runs, "seed": seed, "workloads": list(names), **same,
        "wall_s": time.perf_counter() - started, "rows": [asdict(r) for r in rows]})


def load(out_dir: Path) -> dict[str, Any]:
    path = out_dir / "suite.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = [SuiteRow(**row) for row in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainperfError(f"{path}: not a trainperf suite file ({type(exc).__name__}: {exc})") from None
    data["rows"] = rows
    return data


def write_report(out_dir: Path, markdown: bool = True) -> list[Path]:
    """suite.html (and suite.md with its figures) from the suite's folder."""
    from trainperf import devices
    from trainperf.report import collect, render
    from trainperf.runtime import environment

    data = load(out_dir)
    groups = [collect.workload_group(r.workload, data["scale"], [Path(d) for d in r.run_dirs])
              for r in data["rows"] if r.run_dirs]
    env: dict[str, Any] = {}
    for group in groups:  # where the runs ran, as their results recorded it
        env = env or next((r.environment for r in group.runs if r.environment), {})
    if not env:
        env = environment.describe(devices.resolve(None))
    return render.write_documents(render.suite_document(data, groups, env), out_dir / "suite.html", markdown)


def table_text(rows: Sequence[SuiteRow]) -> str:
    lines = [f"{'workload':<12} {'converged':>9} {'time-to-train':>22} {'epochs':>10} {'samples/s':>11} "
             f"{'wall s':>7}  status"]
    for r in rows:
        ttt = "-" if r.score_minutes is None else f"{r.score_minutes * 60:.1f} s ({r.score_kind})"
        epochs = "-" if r.epochs_to_target is None else f"{r.epochs_to_target:g}"
        rate = "-" if r.samples_per_s is None else f"{r.samples_per_s:,.1f}"
        lines.append(f"{r.workload:<12} {f'{r.converged}/{r.runs}':>9} {ttt:>22} {epochs:>10} {rate:>11} "
                     f"{r.wall_s:>7.0f}  {r.status}" + (f": {r.reason}" if r.reason else "")
                     + (f" [{r.busy_runs} run(s) on a busy machine: not figures]" if r.busy_runs else ""))
    return "\n".join(lines)
