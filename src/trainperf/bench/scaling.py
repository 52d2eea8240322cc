"""Scaling studies: time-to-train against the number of data-parallel processes.

Each point is K complete runs (same seeds at every size) started through torch's elastic launcher;
the table reports, per size: global batch, time per epoch, epochs to target, median time-to-train,
speedup against the first size and parallel efficiency (speedup / relative number of devices).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trainperf import plots, power
from trainperf.contract import batch_share
from trainperf.errors import TrainperfError
from trainperf.files import write_bytes_atomic, write_csv_atomic, write_json_atomic
from trainperf.power import PowerRequest
from trainperf.results import run_folder
from trainperf.runtime import distributed


@dataclass
class ScalingRow:
    devices: int
    global_batch: int
    runs: int
    converged: int
    time_per_epoch_s: float | None
    epochs_to_target: float | None
    time_to_train_s: float | None  # median over converged runs
    speedup: float | None
    efficiency: float | None
    energy_j: float | None = None  # median over converged runs measured with --power (node 0 and interconnect)


def parse_nprocs(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TrainperfError(f"--nproc {text!r}: expected a comma-separated list of integers, e.g. 1,2,4") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise TrainperfError(f"--nproc {text!r}: expected distinct process counts >= 1, e.g. 1,2,4")
    return sorted(values)


def run_study(workload: str, nprocs: Sequence[int], runs: int, base_batch: int, out_dir: Path,
              run_args: Sequence[str], fixed_global_batch: bool, first_seed: int = 0,
              say: Callable[[str], None] = print, power_request: PowerRequest | None = None) -> list[ScalingRow]:
    """Run the study and return one row per process count (results also kept per run in out_dir); with
    `power_request`, each run's energy measured beside it (this process samples: it launches the run)."""
    results: dict[int, list[dict]] = {}
    for n in nprocs:
        gbs = base_batch if fixed_global_batch else base_batch * n
        batch_share(gbs, n, where=f"--nproc {n}")
        results[n] = []
        for k in range(runs):
            run_dir = out_dir / f"nproc{n}" / f"run{k}"
            argv = ["run", workload, "--out", str(run_dir), "--seed", str(first_seed + k), "--quiet",
                    *run_args, "--set", f"global_batch_size={gbs}"]
            say(f"devices {n}, run {k + 1}/{runs}: global batch {gbs}, seed {first_seed + k}")
            with power.sampling(power_request, run_dir):
                code = distributed.launch_local(n, argv).code
            power.finish(power_request, run_dir, run_dir / run_folder.LOG_NAME, run_dir / run_folder.RESULT_NAME)
            results[n].append(run_folder.load_launched(run_dir, code))
    return summarize(results)


def summarize(results: dict[int, list[dict]]) -> list[ScalingRow]:
    rows: list[ScalingRow] = []
    base: tuple[int, float] | None = None
    for n in sorted(results):
        runs = results[n]
        ok = [r for r in runs if r["status"] == "success"]
        epoch_times = [statistics.mean(r["epoch_times_s"]) for r in runs if r["epoch_times_s"]]
        ttt = statistics.median(r["time_to_train_s"] for r in ok) if ok else None
        if base is None and ttt is not None:
            base = (n, ttt)
        speedup = base[1] / ttt if (base and ttt) else None
        rows.append(ScalingRow(
            devices=n,
            global_batch=runs[0]["recipe"]["global_batch_size"],
            runs=len(runs),
            converged=len(ok),
            time_per_epoch_s=statistics.median(epoch_times) if epoch_times else None,
            epochs_to_target=statistics.median(r["epochs_to_target"] for r in ok) if ok else None,
            time_to_train_s=ttt,
            speedup=speedup,
            efficiency=speedup / (n / base[0]) if (base and speedup) else None,
            energy_j=_median([r.get("energy_j") for r in ok]),
        ))
    return rows


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_text(rows: Sequence[ScalingRow]) -> str:
    header = (f"{'devices':>7} {'global batch':>12} {'s/epoch':>8} {'epochs':>7} {'time-to-train s':>15} "
              f"{'speedup':>8} {'efficiency':>10} {'converged':>9}")
    lines = [header]
    for r in rows:
        lines.append(f"{r.devices:>7} {r.global_batch:>12} {_fmt(r.time_per_epoch_s, '.2f'):>8} "
                     f"{_fmt(r.epochs_to_target, '.1f'):>7} {_fmt(r.time_to_train_s, '.2f'):>15} "
                     f"{_fmt(r.speedup, '.2f'):>8} {_fmt(r.efficiency, '.0%'):>10} {r.converged:>4}/{r.runs}")
    return "\n".join(lines)


def save(rows: Sequence[ScalingRow], out_dir: Path, title: str) -> list[Path]:
    """scaling.csv, scaling.json and scaling.png (time-to-train and speedup against devices)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "scaling.csv", out_dir / "scaling.json", out_dir / "scaling.png"]
    write_csv_atomic(paths[0], [asdict(row) for row in rows])
    write_json_atomic(paths[1], {"title": title, "rows": [asdict(r) for r in rows]})
    write_bytes_atomic(paths[2], plots.scaling_chart([asdict(r) for r in rows], title))
    return paths
