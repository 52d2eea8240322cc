"""Time-to-train prediction: epochs to converge (the reference convergence points at the run's global
batch) x time per epoch (a throughput) + evaluations x time per evaluation. Initialization is left out,
as the rules leave it out of the clock.

Two sources of throughput: a short `bench` on this machine (`predict`), or a published MLPerf log's own
records (`predict --from-log`, which also checks the prediction against the time that log measured).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainperf.contract import Cadence, Recipe, Workload
from trainperf.errors import TrainperfError
from trainperf.results.logs import read_records
from trainperf.science.project import duration
from trainperf.science.rcp import Convergence, epochs_to_converge


@dataclass
class Prediction:
    workload: str
    benchmark: str
    ruleset: str
    global_batch: int
    devices: int
    converge_point: float  # in the log's epoch_num convention (epochs, 1+epochs or samples)
    converge_stdev: float
    converge_source: str
    samples_to_train: float
    samples_per_s: float  # the whole system's training throughput
    throughput_source: str
    train_s: float
    evaluations: int
    eval_s: float  # one evaluation
    eval_source: str
    time_to_train_s: float
    low_s: float  # the band: epochs one reference standard deviation either way, throughput p90/p50 spread
    high_s: float
    notes: list[str] = field(default_factory=list)
    samples_unit: bool = False  # the converge point counts training samples (BERT), not epochs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def samples_at(point: float, style: str, epoch_samples: int | None) -> float:
    """Training samples behind a convergence point written in a log's epoch_num convention."""
    if style == "samples":
        return point
    if not epoch_samples:
        raise TrainperfError("the full dataset's training samples per epoch are unknown (the workload declares no "
                             "full_epoch_samples)")
    return (point - 1.0 if style == "1+epochs" else point) * epoch_samples


def evaluations_until(cadence: Cadence, samples: float, epoch_samples: int | None) -> int:
    """How many evaluations a run that converges after `samples` training samples goes through (the
    passing one included)."""
    if cadence.by_samples:
        count = 0
        for point in cadence.sample_evals():
            count += 1
            if point >= samples - 1e-6:
                break
        return count
    if not epoch_samples:
        return 1
    resolved = cadence.resolve(epoch_samples)
    epochs = samples / epoch_samples
    if resolved.per_epoch > 1:
        return max(1, round(epochs * resolved.per_epoch))
    due = [e for e in range(1, math.ceil(epochs - 1e-6) + 1) if resolved.due_after_epoch(e)]
    return max(1, len(due))


def convergence(workload: Workload, recipe: Recipe, batch: int, epochs: float | None = None) -> Convergence:
    """From the RCPs of the recipe's ruleset, or `epochs` (the user's) where the ruleset has none."""
    ruleset = recipe.ruleset or workload.mlperf.ruleset
    if epochs is not None:
        return Convergence(workload.benchmark, ruleset, batch, epochs, 0.0, "given with --epochs", [])
    try:
        return epochs_to_converge(workload.benchmark, ruleset, batch, workload.mlperf.runs)
    except TrainperfError as exc:
        raise TrainperfError(f"{exc}; give the epochs to converge with --epochs N") from None


def predict(workload: Workload, recipe: Recipe, devices: int, samples_per_s: float, throughput_source: str,
            spread: float = 0.0, epochs: float | None = None, eval_s: float | None = None) -> Prediction:
    """`samples_per_s`: the whole system's training throughput; `spread`: its relative uncertainty."""
    batch = recipe.global_batch_size
    conv = convergence(workload, recipe, batch, epochs)
    style = "samples" if workload.mlperf.rcp_in_samples else recipe.log_epoch_num
    epoch_samples = workload.mlperf.full_epoch_samples
    samples = samples_at(conv.mean, style, epoch_samples)
    notes = []
    if conv.how not in ("reference point", "given with --epochs"):
        notes.append(f"epochs {conv.how} (reference batches {', '.join(str(b) for b, _ in conv.points)})")
    evals = evaluations_until(recipe.cadence, samples, epoch_samples)
    if eval_s is None:
        forwards = workload.mlperf.full_eval_forwards
        if forwards is None:
            eval_s, eval_source = 0.0, "unknown (the workload does not declare its evaluation's size)"
            notes.append("evaluation time left out")
        else:
            eval_s = forwards / (3.0 * samples_per_s)
            eval_source = f"{forwards:,} forwards at a third of a training sample's time"
    else:
        eval_source = "given"
    train_s = samples / samples_per_s
    total = train_s + evals * eval_s
    rel = conv.relative_stdev
    low = samples * (1 - rel) / (samples_per_s * (1 + spread)) + evals * eval_s
    high = samples * (1 + rel) / (samples_per_s * (1 - min(spread, 0.5))) + evals * eval_s
    return Prediction(
        workload=workload.name, benchmark=workload.benchmark, ruleset=conv.ruleset, global_batch=batch,
        devices=devices, converge_point=conv.mean, converge_stdev=conv.stdev, converge_source=conv.how,
        samples_to_train=samples, samples_per_s=samples_per_s, throughput_source=throughput_source,
        train_s=train_s, evaluations=evals, eval_s=eval_s, eval_source=eval_source, time_to_train_s=total,
        low_s=low, high_s=high, notes=notes, samples_unit=workload.mlperf.rcp_in_samples)


def describe(p: Prediction) -> str:
    unit = "samples" if p.samples_unit else "epochs"
    lines = [
        f"{p.workload} full: predicted time-to-train {duration(p.time_to_train_s)} "
        f"(band {duration(p.low_s)} - {duration(p.high_s)}) on {p.devices} device(s), global batch {p.global_batch}",
        f"  converges at: {p.converge_point:,.3f} {unit} (stdev {p.converge_stdev:,.3f}; reference convergence "
        f"points of ruleset {p.ruleset}, {p.converge_source})",
        f"  samples to train: {p.samples_to_train:,.0f}",
        f"  throughput: {p.samples_per_s:,.1f} samples/s ({p.throughput_source})",
        f"  training: {duration(p.train_s)}; evaluations: {p.evaluations} x {p.eval_s:.2f} s ({p.eval_source})",
        "  initialization: excluded (not on the MLPerf clock)",
    ]
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# predicting a published run from its own log
# ---------------------------------------------------------------------------------------------
@dataclass
class LogCheck:
    file: str
    workload: str
    global_batch: int
    measured_s: float  # run_start -> run_stop
    converged_at: float | None  # the log's passing epoch_num
    log_samples_per_s: float  # its steady training throughput (training intervals after the first)
    log_eval_s: float  # its median evaluation
    predicted_s: float  # RCP epochs x the log's throughput + evaluations
    predicted_own_epochs_s: float | None  # the log's own epochs instead of the RCP's: the throughput model alone
    error: float  # predicted / measured - 1
    error_own_epochs: float | None
    converged: bool  # run_stop success: only then is the measured time a time-to-train


def _segments(records: list[dict], style: str, epoch_samples: int | None) -> tuple[list[float], list[float]]:
    """(training rates of the intervals between evaluations, evaluation durations) from a log."""
    start = next((r["time_ms"] for r in records if r["key"] == "run_start"), None)
    if start is None:
        raise TrainperfError("no run_start record")
    origin = 1.0 if style == "1+epochs" else 0.0
    rates, evals = [], []
    last_t, last_point, eval_start = float(start), origin, None
    for r in records:
        meta = r.get("metadata") or {}
        if r["key"] == "eval_start":
            eval_start = float(r["time_ms"])
            point = meta.get("samples_count", meta.get("epoch_num"))
            if point is not None and eval_start > last_t:
                done = samples_at(float(point), style, epoch_samples) - samples_at(last_point, style, epoch_samples)
                if done > 0:
                    rates.append(done / ((eval_start - last_t) / 1000.0))
                last_point = float(point)
        elif r["key"] == "eval_stop" and eval_start is not None:
            evals.append((float(r["time_ms"]) - eval_start) / 1000.0)
            last_t, eval_start = float(r["time_ms"]), None
    return rates, evals


def check_log(path: Path, workload: Workload) -> LogCheck:
    """Predict a published run from its log's throughput and the RCPs; compare with its measured time."""
    records = read_records(path)
    try:
        return _check_records(path, records, workload)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise TrainperfError(f"{path}: not a log to predict from ({type(exc).__name__}: {exc})"[:300]) from None


def _check_records(path: Path, records: list[dict], workload: Workload) -> LogCheck:
    values = {r["key"]: r.get("value") for r in records}
    batch = values.get("global_batch_size")
    if not isinstance(batch, int):
        raise TrainperfError(f"{path}: no global_batch_size record")
    recipe = workload.recipe("full")
    style = "samples" if workload.mlperf.rcp_in_samples else recipe.log_epoch_num
    times = {r["key"]: float(r["time_ms"]) for r in records if r["key"] in ("run_start", "run_stop")}
    stop = next((r for r in records if r["key"] == "run_stop"), None)
    converged = stop is not None and (stop.get("metadata") or {}).get("status") == "success"
    if len(times) < 2:
        raise TrainperfError(f"{path}: no run_start/run_stop records")
    measured = (times["run_stop"] - times["run_start"]) / 1000.0
    rates, evals = _segments(records, style, workload.mlperf.full_epoch_samples)
    if len(rates) < 2 or not evals:
        raise TrainperfError(f"{path}: too few evaluations to read a throughput from")
    rate = statistics.median(rates[1:])  # the first interval holds the warm-up
    eval_s = statistics.median(evals)
    passing = [r for r in records if r["key"] == "eval_accuracy"]
    point = None
    if passing:
        meta = passing[-1].get("metadata") or {}
        point = meta.get("samples_count", meta.get("epoch_num"))
    sized = dataclasses.replace(recipe, global_batch_size=batch)
    rcp = predict(workload, sized, 1, rate, "the log's training intervals", eval_s=eval_s)
    own = None
    if point is not None:
        own = predict(workload, sized, 1, rate, "the log's training intervals", eval_s=eval_s,
                      epochs=float(point)).time_to_train_s
    return LogCheck(file=str(path), workload=workload.name, global_batch=batch, measured_s=measured,
                    converged_at=float(point) if point is not None else None, log_samples_per_s=rate,
                    log_eval_s=eval_s, predicted_s=rcp.time_to_train_s, predicted_own_epochs_s=own,
                    error=rcp.time_to_train_s / measured - 1,
                    error_own_epochs=own / measured - 1 if own is not None else None, converged=converged)
