"""The batch-size tuner: time-to-train is iterations to converge x time per iteration, and the global
batch moves both the wrong way at once. For each batch: a short `bench` (data loading included) gives
the time per iteration, K runs to the target give the epochs to converge, with the recipe's learning
rates scaled by a stated rule (`Recipe.for_batch`). The table is the one MLPerf write-ups show (batch,
iterations per epoch, epochs to converge, total iterations, time per iteration, predicted and measured
time-to-train); the fastest batch is recommended.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainperf import jobs
from trainperf.bench import throughput
from trainperf.contract import Recipe, Workload
from trainperf.errors import TrainperfError

Say = Callable[[str], None]


@dataclass
class BatchRow:
    batch: int
    changes: list[str]  # what the rule changed in the recipe
    samples_per_s: float  # bench, data loading included
    time_per_iteration_ms: float
    runs: int
    converged: int
    iterations_per_epoch: float | None
    epochs_to_converge: float | None  # median over converged runs (samples for a sample cadence)
    epochs_each: list[float | None] = field(default_factory=list)  # None: missed the target
    total_iterations: float | None = None  # median
    predicted_s: float | None = None  # total iterations x time per iteration (training only)
    measured_s: float | None = None  # median time-to-train of converged runs (evaluations included)


def parse_batches(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TrainperfError(f"--batch-sizes {text!r}: expected a comma-separated list of integers, "
                             "e.g. 64,128,256") from None
    if len(values) < 2 or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise TrainperfError(f"--batch-sizes {text!r}: expected at least two distinct batch sizes >= 1")
    return sorted(values)


def tune(workload: Workload, recipe: Recipe, scale: str, data_dir: Path, batches: Sequence[int], runs: int,
         rule: str, out_dir: Path, seed: int, steps: int, warmup: int, device: str | None = None,
         say: Say = print, warmup_rule: str = "steps") -> list[BatchRow]:
    if runs < 1:
        raise TrainperfError(f"--runs {runs}: expected >= 1")
    sized = [(b, *recipe.for_batch(b, rule, warmup_rule)) for b in batches]  # every batch checked before anything runs
    rows = []
    for batch, variant, changes in sized:
        say(f"batch {batch}: {', '.join(changes) or 'the recipe as it is'}")
        bench = throughput.run_bench(workload, variant, scale, data_dir, False, steps, warmup, device)
        results = []
        for k in range(runs):
            request = jobs.RunRequest(workload=workload.name, scale=scale, device=device, quiet=True,
                                      command=f"trainperf tune-batch {workload.name} (batch {batch}, run {k})")
            run_dir = out_dir / f"batch{batch}" / f"run{k}"
            result = jobs.run_once(request, workload, variant, data_dir, run_dir, seed + k)
            assert result is not None  # one process: rank 0
            if jobs.interrupted(result):
                raise KeyboardInterrupt  # the study stops; every finished run keeps its folder
            results.append(result)
            ttt = f"{result['time_to_train_s']:.1f} s" if result["status"] == "success" else result["abort_reason"]
            say(f"  run {k} (seed {seed + k}): {result['status']}, {ttt}")
        rows.append(_row(batch, changes, bench, results, variant))
    return rows


def _row(batch: int, changes: list[str], bench: throughput.BenchResult, results: list[dict[str, Any]],
         recipe: Recipe) -> BatchRow:
    by_samples = recipe.log_epoch_num == "samples"
    ok = [r for r in results if r["status"] == "success"]
    point = "samples_to_target" if by_samples else "epochs_to_target"
    per_iteration = batch / bench.samples_per_s
    per_epoch = [r["steps"] / r["epochs"] for r in results if r.get("epochs") and not by_samples]
    total = [float(r["steps"]) for r in ok]
    row = BatchRow(
        batch=batch, changes=changes, samples_per_s=bench.samples_per_s, time_per_iteration_ms=per_iteration * 1e3,
        runs=len(results), converged=len(ok), iterations_per_epoch=statistics.median(per_epoch) if per_epoch else None,
        epochs_to_converge=statistics.median(float(r[point]) for r in ok) if ok else None,
        epochs_each=[float(r[point]) if r["status"] == "success" else None for r in results],
        total_iterations=statistics.median(total) if total else None,
        measured_s=statistics.median(float(r["time_to_train_s"]) for r in ok) if ok else None)
    if row.total_iterations is not None:
        row.predicted_s = row.total_iterations * per_iteration
    return row


def recommend(rows: Sequence[BatchRow]) -> tuple[BatchRow | None, str]:
    """The batch with the shortest measured time-to-train among those whose every run converged."""
    complete = [r for r in rows if r.converged == r.runs and r.measured_s is not None]
    if not complete:
        return None, "no batch size reached the target in every run"
    best = min(complete, key=lambda r: r.measured_s or 0.0)
    predicted = min((r for r in complete if r.predicted_s is not None), key=lambda r: r.predicted_s or 0.0,
                    default=None)
    agree = "" if predicted is None or predicted.batch == best.batch else \
        f"; by the prediction it would be {predicted.batch}"
    larger = [r for r in rows if r.batch > best.batch]
    missed = [str(r.batch) for r in larger if r.converged < r.runs]
    why = ""
    if larger:
        why = " (larger batches run faster per sample but need more epochs"
        why += f"; {', '.join(missed)} missed the target in some runs)" if missed else ")"
    return best, f"fastest to train: batch {best.batch}, {best.measured_s:.1f} s measured{why}{agree}"


def table_text(rows: Sequence[BatchRow], unit: str = "epochs") -> str:
    lines = [f"{'batch':>6} {'it/epoch':>9} {unit + ' to converge':>18} {'total it':>9} {'ms/it':>8} "
             f"{'samples/s':>10} {'predicted s':>11} {'measured s':>10} {'converged':>9}"]
    for r in rows:
        lines.append(f"{r.batch:>6} {_fmt(r.iterations_per_epoch, '.1f'):>9} {_fmt(r.epochs_to_converge, 'g'):>18} "
                     f"{_fmt(r.total_iterations, '.0f'):>9} {r.time_per_iteration_ms:>8.1f} {r.samples_per_s:>10.1f} "
                     f"{_fmt(r.predicted_s, '.1f'):>11} {_fmt(r.measured_s, '.1f'):>10} {r.converged:>5}/{r.runs}")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def save(rows: Sequence[BatchRow], out_dir: Path, title: str, details: dict[str, Any], unit: str) -> list[Path]:
    """tune.csv, tune.json and tune.png (epochs to converge and time-to-train against the batch)."""
    from trainperf import plots
    from trainperf.files import write_bytes_atomic, write_csv_atomic, write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "tune.csv", out_dir / "tune.json", out_dir / "tune.png"]
    flat = [{k: v for k, v in asdict(r).items() if k not in ("changes", "epochs_each")} for r in rows]
    write_csv_atomic(paths[0], flat)
    write_json_atomic(paths[1], {"title": title, **details, "rows": [asdict(r) for r in rows]})
    write_bytes_atomic(paths[2], plots.batch_chart([asdict(r) for r in rows], title, unit))
    return paths
