"""Score benchmark result folders the MLPerf way: per-run time-to-train and the olympic mean.

Works on any folder of `result_*.txt` MLPerf logs (trainperf's own submission layout, or one
published in the MLCommons `training_results_vX.Y` repositories): logs are read by trainperf's own
reader (results/logs.py: noise lines and rank prefixes are skipped) and checked with the official
`mlperf_logging` compliance checker. A run counts as converged when its log passes the checker and its `run_stop`
status is `success`. Score: drop the fastest and the slowest run (four each for unet3d) and average
the rest; non-converged runs count as the slowest, and more of them than runs dropped makes the
score invalid (MLPerf Training rules, "Benchmark Results").
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.compliance_checker import mlp_compliance

from trainperf.errors import TrainperfError
from trainperf.results import keys
from trainperf.results.logs import for_official_checker, read_records
from trainperf.rulesets import RULESET_KEY, WORKLOAD_KEY


@dataclass
class RunScore:
    file: str
    minutes: float | None  # run_start -> run_stop
    converged: bool
    reason: str | None  # why the run does not count as converged
    converge_point: float | None  # epoch_num (or samples_count) of the last evaluation
    division: str | None = None
    quality: Any = None  # the last eval_accuracy value: a number, or named numbers
    busy: str | None = None  # trainperf's record says the machine was busy while it was timed: why
    energy_j: float | None = None  # its power logs' energy (power/result_<i>/), as the official summarizer counts


@dataclass
class BenchmarkScore:
    system: str
    benchmark: str
    folder: str
    ruleset: str
    runs: list[RunScore] = field(default_factory=list)
    required_runs: int | None = None
    score: float | None = None  # olympic mean, minutes
    mean: float | None = None  # plain mean of converged runs (shown when there are too few for olympic)
    valid: bool = False  # not invalidated by non-converged runs
    note: str = ""
    rcp: str | None = None
    eval_samples: int | None = None  # tells a mini result from a full one
    # The RCP normalisation (v4.0+): a submission converging faster than the reference within the allowed
    # speedup has its olympic mean multiplied by RCP mean / its mean, as the official results table does.
    scaling: float = 1.0
    scaling_source: str = "none"  # "scaling.json", "rcp_checker" (computed here: the folder has none) or "none"
    unscaled: float | None = None  # the olympic mean before the factor
    # The energy score (a folder with power/result_<i>/ logs): the official summarizer's — each run's node and
    # interconnect joules, the olympic mean over the runs the time score keeps, times the same factor.
    energy_j: float | None = None

    @property
    def converged(self) -> int:
        return sum(1 for r in self.runs if r.converged)


def max_dropped(benchmark: str, workload: str | None = None) -> int:
    return keys.dropped_runs(benchmark, workload)


def olympic_mean(converged_minutes: list[float], non_converged: int, benchmark: str,
                 workload: str | None = None) -> float | None:
    """Drop the `max_dropped` fastest and slowest (non-converged runs are the slowest); average the rest."""
    drop = max_dropped(benchmark, workload)
    if non_converged > drop:
        return None
    ordered = sorted(converged_minutes)
    kept = ordered[drop:len(ordered) - (drop - non_converged)]
    return statistics.fmean(kept) if kept else None


def find_benchmark_folders(root: Path) -> list[Path]:
    """Every folder under `root` (itself included) that holds result_*.txt logs."""
    if not root.exists():
        raise TrainperfError(f"{root}: no such folder")
    if root.is_file():
        raise TrainperfError(f"{root}: expected a results folder, got a file")
    folders = sorted({p.parent for p in root.rglob("result_*.txt")})
    if not folders:
        raise TrainperfError(f"{root}: no result_*.txt MLPerf logs found (expected results/<system>/<benchmark>/)")
    return folders


@contextlib.contextmanager
def _quiet() -> None:
    """The official checker prints and logs freely; keep its chatter out of trainperf's output."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _read(path: Path) -> dict:
    """What scoring needs from a log; a field of the wrong type counts as absent (the compliance
    check then says what is wrong with the log)."""
    info: dict = {"benchmark": None, "division": None, "start": None, "stop": None, "status": None, "point": None,
                  "eval_samples": None, "quality": None, "workload": None, "ruleset": None}
    for record in read_records(path):
        key, value = record["key"], record.get("value")
        meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        if key == "submission_benchmark" and info["benchmark"] is None and isinstance(value, str):
            info["benchmark"] = value
        elif key == WORKLOAD_KEY and info["workload"] is None and isinstance(value, str):
            info["workload"] = value
        elif key == RULESET_KEY and info["ruleset"] is None and isinstance(value, str):
            info["ruleset"] = value
        elif key == "submission_division" and info["division"] is None and isinstance(value, str):
            info["division"] = value
        elif key == "eval_samples" and info["eval_samples"] is None:
            info["eval_samples"] = _number(value)
        elif key == "run_start" and info["start"] is None:
            info["start"] = _number(record.get("time_ms"))
        elif key == "run_stop" and info["stop"] is None:
            info["stop"] = _number(record.get("time_ms"))
            info["status"] = meta.get("status")
        elif key == "eval_accuracy":
            point = _number(meta.get("samples_count", meta.get("epoch_num")))
            info["point"] = point if point is not None else info["point"]
            info["quality"] = value
    return info


def quality_text(value: Any) -> str:
    """An eval_accuracy value as read from a log: a number, or named numbers (Mask R-CNN's BBOX/SEGM)."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.4f}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in value.items())
    if isinstance(value, (int, float)):
        return f"{value:.4f}"
    return "-"


def score_run(path: Path, ruleset: str) -> tuple[RunScore, str | None]:
    info = _read(path)
    minutes = None
    if info["start"] is not None and info["stop"] is not None:
        minutes = (info["stop"] - info["start"]) / 60_000.0
    unreadable = None
    with _quiet():
        checker = mlp_compliance.make_checker("training", ruleset, True, False)
        try:
            with for_official_checker(path) as copy:
                # The rules a benchmark no official ruleset knows (ncf) are trainperf's own, as `check` runs them.
                own = keys.own_rules(info["benchmark"] or "", info["workload"])
                compliant = checker.check_file(str(copy), str(own) if own else f"training_{ruleset}/common.yaml")
        except Exception as exc:  # noqa: BLE001 - the official parser fails in many ways on a broken log
            compliant, unreadable = False, f"{type(exc).__name__} {exc}".splitlines()[0]
    reason = None
    if minutes is None:
        reason = "no run_start/run_stop"
    elif unreadable:
        reason = f"the official checker cannot parse it ({unreadable})"
    elif not compliant:
        reason = "fails the compliance check"
    elif minutes <= 0:  # the official checker does not compare the two times
        reason = "run_stop is not after run_start"
    elif info["status"] != "success":
        reason = f"run_stop status {info['status']}"
    run = RunScore(file=str(path), minutes=minutes, converged=reason is None, reason=reason,
                   converge_point=info["point"], division=info["division"], quality=info["quality"])
    return run, info["benchmark"]


def score_folder(folder: Path, ruleset: str | None = None,
                 progress: Callable[[int, int], None] | None = None) -> BenchmarkScore:
    """Score the result_*.txt logs of one benchmark folder; `progress(done, total)` after each log. The one
    scoring path of `score`, `compare`, `report` and `suite`: the olympic mean, with the RCP normalisation
    the official results tables apply (scaling.json, else the RCP checker's factor for a closed v4.0+
    folder). Fewer runs than MLPerf requires: no olympic score (the mean of converged runs is kept)."""
    files = sorted(folder.glob("result_*.txt"), key=lambda p: (len(p.name), p.name))
    if not files:
        raise TrainperfError(f"{folder}: no result_*.txt logs")
    first = _read(files[0])
    benchmark = first["benchmark"]
    if benchmark is None:
        raise TrainperfError(f"{files[0]}: no submission_benchmark record")
    ruleset = ruleset or keys.ruleset_for(benchmark, first["workload"], first["ruleset"])
    if ruleset is None:
        raise TrainperfError(f"{folder}: no compliance ruleset known for benchmark {benchmark!r} (use --ruleset)")
    # The system is the folder above, also when FOLDER is "." or ends in "..".
    result = BenchmarkScore(system=Path(os.path.abspath(folder)).parent.name, benchmark=benchmark, folder=str(folder),
                            ruleset=ruleset, eval_samples=first["eval_samples"])
    for done, path in enumerate(files, 1):
        run, logged = score_run(path, ruleset)
        if logged != benchmark:  # one folder, one benchmark: a log of another is never scored as this one's run
            raise TrainperfError(f"{path}: benchmark {logged or '(none)'} among {benchmark} logs ({files[0].name}); "
                                 "a benchmark folder holds the runs of one benchmark")
        result.runs.append(run)
        if progress is not None:
            progress(done, len(files))
    result.required_runs = get_result_file_counts("training").get(benchmark)
    minutes = [r.minutes for r in result.runs if r.converged and r.minutes is not None]
    non_converged = len(result.runs) - len(minutes)
    drop = max_dropped(benchmark, first["workload"])
    short = result.required_runs is not None and len(files) < result.required_runs
    # An olympic score is MLPerf's over the runs it requires: a folder short of them has none (a 9-run
    # folder of a 10-run benchmark is not a score to compare), only the mean of its converged runs.
    result.score = None if short else olympic_mean(minutes, non_converged, benchmark, first["workload"])
    result.mean = statistics.fmean(minutes) if minutes else None
    result.valid = non_converged <= drop and bool(minutes)
    notes = []
    if non_converged > drop:
        notes.append(f"invalid: {non_converged} non-converged runs (at most {drop} allowed)")
    elif non_converged:
        notes.append(f"{non_converged} non-converged run(s) counted as the slowest")
    if short:
        notes.append(f"{len(files)} of the {result.required_runs} runs MLPerf requires: no olympic score")
    if result.score is None and result.valid:
        notes.append(f"too few runs for olympic scoring; mean of converged runs {result.mean:.3f} minutes")
    busy = _busy_runs(folder, result)
    if busy:
        notes.append(f"{busy} run(s) timed on a busy machine: their times are not figures")
    result.note = "; ".join(notes)
    if (folder / "power").is_dir():
        notes += _energy(folder, files, result, drop)
        result.note = "; ".join(notes)
    factor = read_scaling(folder)
    if factor is not None:
        result.scaling, result.scaling_source = factor, "scaling.json"
    result.rcp, norm = rcp_check(folder, ruleset, first["division"], keys.rcp_in_samples(benchmark, first["workload"]))
    if factor is None and norm is not None and norm != 1.0 and _version(ruleset) >= SCALING_FROM:
        result.scaling, result.scaling_source = norm, "rcp_checker"
    if result.scaling != 1.0:
        result.unscaled = result.score
        if result.score is not None:
            result.score *= result.scaling
        if result.energy_j is not None:
            result.energy_j *= result.scaling
        where = ("its scaling.json" if result.scaling_source == "scaling.json" else
                 "the RCP checker's normalisation (the folder has no scaling.json; the official package checker "
                 "would write it)")
        notes.append(f"score multiplied by {result.scaling:.4f}, {where}")
        result.note = "; ".join(notes)
    elif (factor is None and first["division"] == "closed" and _version(ruleset) >= SCALING_FROM
          and (result.rcp or "").startswith("pass")):
        notes.append("no RCP scaling: the RCP checker applies none to these runs")
        result.note = "; ".join(notes)
    return result


def _energy(folder: Path, files: list[Path], result: BenchmarkScore, drop: int) -> list[str]:
    """Each converged run's energy and the energy score, by the official summarizer's own functions
    (`_compute_total_power`: every node's power log, plus the interconnect's estimate, over the run's time to
    train; `_index_olympic_average`: the runs ordered by their times, the same ones dropped)."""
    from mlperf_logging.result_summarizer import result_summarizer as official

    counted: list[tuple[float, float]] = []  # (minutes, joules) of the converged runs
    missing = []
    for path, run in zip(files, result.runs, strict=True):
        if not run.converged or run.minutes is None:
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                # Its result-name parsing splits on "/" and "." (training_results layout): a plain path keeps it.
                run.energy_j = official._compute_total_power(str(folder), str(path), run.minutes * 60_000,
                                                             result.ruleset)
            except (AssertionError, ValueError, OSError, KeyError, TypeError, ZeroDivisionError):
                missing.append(path.stem)
                continue
        counted.append((run.minutes, run.energy_j))
    if missing:
        return [f"no energy score: {', '.join(missing)} without a whole power log (power/<result>/node_*.txt)"]
    if not counted or result.score is None:
        return []
    order = [i for i, _ in sorted(enumerate(counted), key=lambda item: item[1][0])]
    non_converged = len(result.runs) - len(counted)
    result.energy_j = official._index_olympic_average([j for _, j in counted], order, non_converged, drop)
    return []


# The rounds whose results tables multiply the olympic mean by the RCP normalisation (scaling.json).
SCALING_FROM = (4, 0, 0)


def _version(ruleset: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in ruleset.split("."))
    except ValueError:
        return (0,)


def read_scaling(folder: Path) -> float | None:
    """The factor of a result folder's scaling.json (what the RCP checker writes with set_scaling and the
    official summarizer multiplies into the olympic mean); None without one."""
    import json

    path = folder / "scaling.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))["scaling_factor"]
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainperfError(f"{path}: expected JSON {{\"scaling_factor\": <number>}}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise TrainperfError(f"{path}: scaling_factor {value!r}, expected a positive number")
    return float(value)


def _busy_runs(folder: Path, result: BenchmarkScore) -> int:
    """Mark the runs whose trainperf record (OUT/trainperf/<system>/<benchmark>/run_N/result.json,
    beside OUT/results/…) says the machine was busy while they were timed; how many."""
    import json

    details = Path(os.path.abspath(folder)).parent.parent.parent / "trainperf" / result.system / result.benchmark
    for run in result.runs:
        index = Path(run.file).name.removeprefix("result_").removesuffix(".txt")
        try:
            load = json.loads((details / f"run_{index}" / "result.json").read_text(encoding="utf-8")).get(
                "machine_load")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(load, dict) and load.get("busy"):
            run.busy = str(load.get("why") or "busy")
    return sum(1 for run in result.runs if run.busy)


def rcp_check(folder: Path, ruleset: str, division: str | None, train_samples: bool = False
              ) -> tuple[str, float | None]:
    """(verdict, normalisation factor) of the official rcp_checker, as its package checker runs it but
    without writing scaling.json into the folder (set_scaling off); the factor is None where it cannot run."""
    if division != "closed":
        return "n/a (open division)", None
    from mlperf_logging.rcp_checker import rcp_checker

    try:
        with _quiet():
            # The pruned RCPs are what the official CLI checks by default.
            ok, message, norm = rcp_checker.check_directory(str(folder), "training", ruleset, False, train_samples,
                                                            rcp_pass="pruned_rcps", set_scaling=False)
    except Exception as exc:  # noqa: BLE001 - the checker fails in many ways when it has no RCPs
        return f"n/a (the rcp_checker could not run: {type(exc).__name__} {exc})", None
    return f"{'pass' if ok else 'fail'}: {message}", (float(norm) if ok else None)


@dataclass
class Comparison:
    """Two result roots, benchmark by benchmark: each time-to-train (olympic score, or the mean of
    converged runs when there are too few) and the ratio A / B (above 1: B trains faster)."""

    system_a: str
    system_b: str
    rows: list[tuple[str, float | None, float | None, float | None]]  # benchmark, A, B, A / B
    warnings: list[str]


def compare(root_a: Path, root_b: Path, ruleset: str | None = None) -> Comparison:
    def scores(root: Path) -> dict[str, BenchmarkScore]:
        found: dict[str, BenchmarkScore] = {}
        for folder in find_benchmark_folders(root):
            result = score_folder(folder, ruleset)
            if result.benchmark in found:
                raise TrainperfError(f"{root}: {result.benchmark} results of two systems "
                                     f"({found[result.benchmark].system}, {result.system}); "
                                     "compare one system's folder (results/<system>)")
            found[result.benchmark] = result
        return found

    def headline(result: BenchmarkScore) -> float | None:
        """The olympic score, or the mean of converged runs when there are too few; none when invalid."""
        if not result.valid:
            return None
        return result.score if result.score is not None else result.mean

    a, b = scores(root_a), scores(root_b)
    common = [k for k in a if k in b]
    if not common:
        raise TrainperfError(f"{root_a} and {root_b} have no benchmark in common "
                             f"({', '.join(a) or 'none'} vs {', '.join(b) or 'none'})")
    rows, warnings = [], []
    for key in common:
        sa, sb = headline(a[key]), headline(b[key])
        rows.append((key, sa, sb, sa / sb if sa is not None and sb is not None else None))
        for side, found in (("A", a[key]), ("B", b[key])):
            if found.required_runs is not None and len(found.runs) < found.required_runs:
                warnings.append(f"{key}: {side} holds {len(found.runs)} of the {found.required_runs} runs MLPerf "
                                "requires: the mean of its converged runs, not an olympic score")
        # A mini result and a full one are different datasets: their times say nothing of each other.
        if a[key].eval_samples != b[key].eval_samples:
            warnings.append(f"{key}: the two were evaluated on different datasets (eval_samples "
                            f"{a[key].eval_samples} vs {b[key].eval_samples}, e.g. full vs mini): not comparable")

    def systems(found: dict[str, BenchmarkScore]) -> str:
        return ", ".join(dict.fromkeys(found[key].system for key in common))

    return Comparison(systems(a), systems(b), rows, warnings)
