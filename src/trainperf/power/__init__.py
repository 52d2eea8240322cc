"""Energy to train, as MLPerf's power rules define it (training_policies `power_measurement.adoc`; the keys and
the arithmetic of the official `mlperf_logging`): a run's power sampled beside it, its log in the official
layout, the joules of the timed region.

A run with `--power SOURCE[,SOURCE]` starts a sampler process (power/sampler.py) before the run and stops it
after `run_stop`; its raw readings stay in `power/readings.csv` of the run folder. Afterwards:

- `power/node_<k>.txt`: the node's power log as the official package writes and the summarizer reads it —
  `power_measurement_start` at `run_start`, `conversion_eff`, one `power_reading` (watts, `host` node_<k>) per
  sample, `power_measurement_stop` at the first sample at or after `run_stop` (so that the readings cover the
  whole timed region). Its source is the first node-level one given (ipmi, file); without one, the sum of the
  indicative ones (nvml + rapl, tick by tick), said so in result.json. `power/sw_0.txt` holds the
  interconnect's estimate when `--power-interconnect W` is given. A series copies them to
  `<benchmark>/power/result_<i>/`, the layout the official package checker and summarizer read.
- result.json `power`: per source, `energy_j` and `average_w` of the timed region (computed as the summarizer
  computes a node's energy: each reading times the interval before it, over the measurement window, scaled to
  run_stop - run_start), its samples, the longest gap, whether the sampling meets the rules (≥ 60 samples and
  ≥ 1 a second over the timed region), and what the rules accept of it; `energy_j` of the run (node file plus
  interconnect), as the summarizer would count it for this node.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic, write_text_atomic
from trainperf.power.sources import ACCEPTANCE, SourceSpec, Unavailable, open_live, parse_specs, read_meter_log

FOLDER = "power"
MIN_SAMPLES = 60  # the rules: at least 60 samples over the timed run
MAX_INTERVAL_S = 1.0  # the rules: at least one sample a second
Say = Callable[[str], None]


@dataclass(frozen=True)
class PowerRequest:
    """What `--power`, `--power-interval`, `--power-optional` and `--power-interconnect` asked for."""

    specs: tuple[SourceSpec, ...]
    interval_s: float = MAX_INTERVAL_S
    optional: bool = False  # an unavailable source is left out (said so) instead of refusing the run
    interconnect_w: float | None = None


def request_from(power: str | None, interval_s: float | None = None, optional: bool = False,
                 interconnect_w: float | None = None) -> PowerRequest | None:
    """The request the options make, refused in one line where an option is wrong."""
    if power is None:
        if interval_s is not None or optional or interconnect_w is not None:
            raise TrainperfError("--power-interval/--power-optional/--power-interconnect: they go with --power SOURCE")
        return None
    interval = MAX_INTERVAL_S if interval_s is None else interval_s
    if not (0.05 <= interval <= MAX_INTERVAL_S):
        raise TrainperfError(f"--power-interval {interval_s}: expected 0.05 to {MAX_INTERVAL_S} seconds (the rules ask "
                             "for at least one sample a second)")
    if interconnect_w is not None and not (interconnect_w >= 0 and math.isfinite(interconnect_w)):
        raise TrainperfError(f"--power-interconnect {interconnect_w}: expected watts >= 0")
    return PowerRequest(tuple(parse_specs(power)), interval, optional, interconnect_w)


def check(request: PowerRequest | None, warn: Say = print) -> PowerRequest | None:
    """Every source opened once before anything is written: one that cannot be read refuses the run in one line,
    or, with --power-optional, is left out with that line as a warning."""
    if request is None:
        return None
    kept = []
    for spec in request.specs:
        try:
            if spec.kind == "file":
                folder = Path(spec.target).parent
                if not folder.is_dir():
                    raise Unavailable(f"file: {folder} is not a folder (the meter's log is read after the run)")
            else:
                open_live(spec).close()
        except Unavailable as exc:
            if not request.optional:
                raise TrainperfError(f"--power {spec.name}: {exc}; add --power-optional to run without it") from None
            warn(f"power: {spec.name} left out: {exc}")
            continue
        kept.append(spec)
    if not kept:
        warn("power: no source is available; the run goes on without a power measurement")
        return None
    return PowerRequest(tuple(kept), request.interval_s, request.optional, request.interconnect_w)


def _placement() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when torchrun or srun started this process (their variables), else None."""
    from trainperf.runtime.distributed import env_placement

    return env_placement(dict(os.environ))  # a copy: it fills in MASTER_ADDR for srun


def node_index() -> int:
    """This node's number in a multi-node group (its node_<k>.txt): the launcher's, Slurm's; 0 outside a group
    (a single-node run on the fourth node of an allocation is still node 0 of its own run)."""
    placement = _placement()
    if placement is None or placement[2] <= 1:
        return 0
    for name in ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def samples_here() -> bool:
    """One sampler a node: a process no launcher started (it may launch the others), or local rank 0 of a group
    torchrun (LOCAL_RANK) or srun (SLURM_LOCALID) started."""
    placement = _placement()
    return placement is None or placement[1] == 0


def holds_result() -> bool:
    """Whether this process writes result.json: global rank 0, or a process no launcher started."""
    placement = _placement()
    return placement is None or placement[0] == 0


def readings_path(run_dir: Path) -> Path:
    """The sampler's raw readings, one file a node (nodes may share the run folder)."""
    return run_dir / FOLDER / f"readings_node_{node_index()}.csv"


@contextlib.contextmanager
def sampling(request: PowerRequest | None, run_dir: Path) -> Iterator[None]:
    """The sampler running beside the block: started (and its first readings written) before it, stopped a
    sampling interval after it, so that the readings cover run_start to run_stop."""
    if request is None or not samples_here():
        yield
        return
    live = [s.name for s in request.specs if s.kind != "file"]
    if not live:
        yield
        return
    readings = readings_path(run_dir)
    readings.parent.mkdir(parents=True, exist_ok=True)
    readings.unlink(missing_ok=True)  # an attempt cut short before its run left readings of another time
    process = subprocess.Popen(
        [sys.executable, "-m", "trainperf.power.sampler", "--out", str(readings), "--interval",
         repr(request.interval_s), "--parent", str(os.getpid()), *live],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        ready = process.stdout.readline() if process.stdout else ""
        if ready.strip() != "ready":
            raise TrainperfError(f"--power: the sampler did not start (exit code {process.wait()}; "
                                 f"{_sampler_lines(readings) or 'no source could be opened'})")
        yield
        _await_reading_after(readings, time.time() * 1000, 1.5 * request.interval_s + 5.0)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout:
            process.stdout.close()


def _await_reading_after(readings: Path, after_ms: float, limit_s: float) -> None:
    """Wait (at most limit_s) until a reading later than `after_ms` is written: the window's last sample, which
    a slow BMC may take a second to answer."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for _tick, t, _name, _w in _raw_lines(readings, tail=4096):
            if t >= after_ms:
                return
        time.sleep(0.1)


def _sampler_lines(readings: Path) -> str:
    """What the sampler said of its sources (`# unavailable,…`, `# failed,…`), the first few, for one line."""
    if not readings.is_file():
        return ""
    said = [line[2:] for line in readings.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.startswith("# ")]
    return "; ".join(dict.fromkeys(said[:20]))[:500]


# -- after the run ---------------------------------------------------------------------------------------------

def _raw_lines(path: Path, tail: int | None = None) -> list[tuple[int, int, str, float]]:
    """The sampler's reading lines (tick, time_ms, source, watts); comments and a line cut by a kill skipped."""
    if not path.is_file():
        return []
    with open(path, "rb") as f:
        if tail is not None:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
        text = f.read().decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if line.startswith("#") or len(parts) < 4:
            continue
        try:
            # The source's name may hold commas (a URL): it is everything between time and watts.
            out.append((int(parts[0]), int(parts[1]), ",".join(parts[2:-1]), float(parts[-1])))
        except ValueError:
            continue
    return out


def read_readings(path: Path) -> dict[str, list[tuple[int, int, float]]]:
    """The sampler's raw readings, per source: (tick, time_ms, watts), in order."""
    out: dict[str, list[tuple[int, int, float]]] = {}
    for tick, t, name, watts in _raw_lines(path):
        out.setdefault(name, []).append((tick, t, watts))
    return out


def _window(readings: list[tuple[int, float]], start_ms: float, stop_ms: float
            ) -> tuple[list[tuple[int, float]], list[tuple[int, float]], list[tuple[int, float]]]:
    """(the measurement window: the readings after start up to and including the first after stop; those
    inside the timed region; those after it)."""
    inside = [(t, w) for t, w in readings if start_ms < t <= stop_ms]
    after = [(t, w) for t, w in readings if t > stop_ms]
    return inside + after[:1], inside, after


def window_energy(readings: list[tuple[int, float]], start_ms: float, stop_ms: float,
                  conversion_eff: float = 1.0) -> dict[str, Any]:
    """A source's energy over the timed region [start, stop] as the official summarizer computes a node's
    (`result_summarizer._compute_power_node`): the measurement window runs from `start` to the first reading at
    or after `stop`; each reading in it counts its watts times the time since the one before (the first, since
    `start`); the sum is scaled by (stop - start) / window, times the log's conversion efficiency. With the
    sampling facts the rules ask about (a gap counts up to `stop` when no reading follows it)."""
    window, inside, after = _window(readings, start_ms, stop_ms)
    if not window:
        return {"energy_j": None, "average_w": None, "samples": 0, "max_gap_s": None, "meets_sampling_rules": False,
                "window_ms": None}
    end = window[-1][0]
    agg, prev = 0.0, start_ms
    for t, w in window:
        agg += w * (t - prev)
        prev = t
    duration = stop_ms - start_ms
    energy = conversion_eff * agg * duration / (end - start_ms) / 1000.0 if end > start_ms else 0.0
    times = [start_ms] + [t for t, _ in window] + ([] if after else [stop_ms])
    gap = max(b - a for a, b in zip(times, times[1:], strict=False)) / 1000.0
    samples = len(inside)
    meets = samples >= MIN_SAMPLES and samples >= math.floor(duration / 1000.0 / MAX_INTERVAL_S) and gap <= 2.0
    return {"energy_j": energy, "average_w": energy / (duration / 1000.0) if duration > 0 else None,
            "samples": samples, "max_gap_s": gap, "meets_sampling_rules": meets, "window_ms": [start_ms, end]}


def _timed_region(log: Path) -> tuple[float, float] | None:
    from trainperf.results.logs import first, read_records

    if not log.is_file():
        return None
    records = read_records(log)
    start, stop = first(records, "run_start"), first(records, "run_stop")
    if start is None or stop is None:
        return None
    return float(start["time_ms"]), float(stop["time_ms"])


@contextlib.contextmanager
def _power_log(host: str) -> Iterator[tuple[Any, io.StringIO]]:
    """The official package's logger (mllog) writing into a string: (its MLLogger, the text)."""
    from mlperf_logging.mllog import mllog

    text = io.StringIO()
    logger = logging.getLogger(f"trainperf.power.{host}.{id(text)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(text)
    logger.addHandler(handler)
    try:
        yield mllog.MLLogger(logger=logger), text
    finally:
        logger.removeHandler(handler)


def official_log(readings: list[tuple[int, float]], start_ms: float, stop_ms: float, host: str,
                 measurement_type: str = "AC", conversion_eff: float = 1.0) -> str:
    """A node's power log, written by the official package's logger (mllog): what the summarizer reads."""
    from mlperf_logging.mllog import constants

    window = _window(readings, start_ms, stop_ms)[0]
    end = window[-1][0] if window else stop_ms
    with _power_log(host) as (out, text):
        out.start(key=constants.POWER_MEASUREMENT_START, time_ms=round(start_ms), metadata={"host": host})
        out.event(key=constants.CONVERTION_EFF, value=conversion_eff, time_ms=round(start_ms),
                  metadata={"host": host, "measurement_type": measurement_type})
        for t, w in window:
            out.event(key=constants.POWER_READING, value=w, time_ms=t, metadata={"host": host})
        out.end(key=constants.POWER_MEASUREMENT_STOP, time_ms=round(end), metadata={"host": host})
    return text.getvalue()


def interconnect_log(watts: float, start_ms: float, stop_ms: float, host: str = "sw_0") -> str:
    """The interconnect's estimate (`interconnect_power_est`, watts), which the summarizer multiplies by the
    time to train."""
    from mlperf_logging.mllog import constants

    with _power_log(host) as (out, text):
        out.start(key=constants.POWER_MEASUREMENT_START, time_ms=round(start_ms), metadata={"host": host})
        out.event(key=constants.CONVERTION_EFF, value=1.0, time_ms=round(start_ms), metadata={"host": host})
        out.event(key=constants.INTERCONNECT_POWER_EST, value=watts, time_ms=round(start_ms),
                  metadata={"host": host})
        out.end(key=constants.POWER_MEASUREMENT_STOP, time_ms=round(stop_ms), metadata={"host": host})
    return text.getvalue()


def _per_tick_sum(series: list[list[tuple[int, int, float]]]) -> list[tuple[int, float]]:
    """The indicative sources added up tick by tick (ticks where every one of them read), at the tick's last time."""
    by_tick: dict[int, list[tuple[int, float]]] = {}
    for readings in series:
        for tick, t, w in readings:
            by_tick.setdefault(tick, []).append((t, w))
    return [(max(t for t, _ in got), sum(w for _, w in got)) for tick, got in sorted(by_tick.items())
            if len(got) == len(series)]


def finish(request: PowerRequest | None, run_dir: Path, log: Path, result_path: Path | None,
           warn: Say = print) -> dict[str, Any] | None:
    """After a run: this node's official power files, and the energy in result.json when `result_path` is given
    (the process holding rank 0's result). Nothing to do without a request or on a process that did not sample.
    Never raises: a run that finished stays finished whatever its power measurement met (said in one line)."""
    if request is None or not samples_here():
        return None
    try:
        return _finish(request, run_dir, log, result_path, warn)
    except Exception as exc:  # noqa: BLE001 - the run's own result matters more than its energy
        warn(f"power: the measurement could not be completed ({type(exc).__name__}: {exc})")
        return None


def _finish(request: PowerRequest, run_dir: Path, log: Path, result_path: Path | None,
            warn: Say) -> dict[str, Any]:
    from trainperf.power.sources import NODE_LEVEL

    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    readings_file = readings_path(run_dir)
    region = _timed_region(log)
    raw = read_readings(readings_file)
    node = node_index()
    summary: dict[str, Any] = {"interval_s": request.interval_s, "node": node, "sources": {}, "energy_j": None,
                               "official_source": None, "readings": str(readings_file.relative_to(run_dir))}
    said = _sampler_lines(readings_file)
    if said:
        summary["sampler"] = said
        warn(f"power: the sampler said: {said}")
    series: dict[str, list[tuple[int, float]]] = {}
    efficiency: dict[str, float] = {}
    ticks: dict[str, list[tuple[int, int, float]]] = {}
    for spec in request.specs:
        entry: dict[str, Any] = {"accepted": ACCEPTANCE[spec.kind]}
        if spec.kind == "file":
            try:
                series[spec.name], efficiency[spec.name] = read_meter_log(Path(spec.target))
            except TrainperfError as exc:
                entry["error"] = str(exc)
                warn(f"power: {exc}")
        else:
            ticks[spec.name] = raw.get(spec.name, [])
            series[spec.name] = [(t, w) for _, t, w in ticks[spec.name]]
            counter = [w for _, _, w in raw.get(spec.name + "#counter_j", [])]
            if len(counter) >= 2:
                entry["energy_counter_j"] = counter[-1] - counter[0]  # the whole sampling, not the timed region
        summary["sources"][spec.name] = entry
    if region is None:
        summary["note"] = "the run has no run_start/run_stop: no timed region to measure"
    else:
        start, stop = region
        for name, readings in series.items():
            if "error" not in summary["sources"][name]:
                summary["sources"][name].update(window_energy(readings, start, stop, efficiency.get(name, 1.0)))
        covers = {name for name, entry in summary["sources"].items() if entry.get("samples")}
        node_level = [s.name for s in request.specs if s.kind in NODE_LEVEL and s.name in covers]
        indicative = [s.name for s in request.specs if s.kind not in NODE_LEVEL and s.name in covers]
        if node_level:
            chosen, official, eff = node_level[0], series[node_level[0]], efficiency.get(node_level[0], 1.0)
        else:
            chosen, official, eff = " + ".join(indicative), _per_tick_sum([ticks[n] for n in indicative]), 1.0
            if not indicative:
                official = []
        measured = window_energy(official, start, stop, eff) if official else None
        if measured is not None and measured["samples"]:
            host = f"node_{node}"
            kind = "AC" if node_level else "DC"  # a PSU's or PDU's input; the GPUs' and CPUs' own DC rails
            write_text_atomic(folder / f"{host}.txt", official_log(official, start, stop, host, kind, eff))
            summary.update(official_source=chosen, node_energy_j=measured["energy_j"],
                           meets_sampling_rules=measured["meets_sampling_rules"], energy_j=measured["energy_j"],
                           closed_accepted=bool(node_level))
            if request.interconnect_w is not None and node == 0:
                write_text_atomic(folder / "sw_0.txt", interconnect_log(request.interconnect_w, start, stop))
                summary["interconnect_j"] = request.interconnect_w * (stop - start) / 1000.0
                summary["energy_j"] += summary["interconnect_j"]
            summary["average_w"] = summary["energy_j"] / ((stop - start) / 1000.0) if stop > start else None
        else:
            summary["note"] = "no source has a reading inside the timed region: no power log written"
            warn(f"power: {summary['note']} ({', '.join(s.name for s in request.specs)})")
    if result_path is not None and result_path.is_file():
        import json

        result = json.loads(result_path.read_text(encoding="utf-8"))
        result["power"] = summary
        result["energy_j"] = summary["energy_j"]
        write_json_atomic(result_path, result)
    _plot(folder / f"power_node_{node}.png", series, log)
    return summary


def _plot(path: Path, series: dict[str, list[tuple[int, float]]], log: Path) -> None:
    """power_node_<k>.png: each source's watts over the run, the timed region shaded, every evaluation marked."""
    from trainperf.results.logs import read_records

    if not any(series.values()):
        return
    from trainperf.files import write_bytes_atomic
    from trainperf.plots import png, pyplot

    records = read_records(log) if log.is_file() else []
    origin = min(t for s in series.values() for t, _ in s)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for name, readings in series.items():
        if readings:
            ax.plot([(t - origin) / 1000 for t, _ in readings], [w for _, w in readings], label=name, lw=1)
    times = {r["key"]: float(r["time_ms"]) for r in records if r["key"] in ("run_start", "run_stop")}
    if len(times) == 2:
        ax.axvspan((times["run_start"] - origin) / 1000, (times["run_stop"] - origin) / 1000, color="0.9",
                   label="timed region")
    evals = [(float(r["time_ms"]) - origin) / 1000 for r in records if r["key"] == "eval_stop"]
    for i, x in enumerate(evals):
        ax.axvline(x, color="tab:red", lw=0.8, ls="--", label="evaluation" if i == 0 else None)
    ax.set_xlabel("seconds")
    ax.set_ylabel("watts")
    ax.legend(loc="best", fontsize=8)
    write_bytes_atomic(path, png(fig))


def copy_to_series(run_dir: Path, logs_dir: Path, index: int) -> None:
    """A series' run i: its node and interconnect files under <benchmark>/power/result_<i>/ (the official layout)."""
    from trainperf.files import copy_atomic

    files = sorted((run_dir / FOLDER).glob("node_*.txt")) + sorted((run_dir / FOLDER).glob("sw_*.txt"))
    for path in files:
        copy_atomic(path, logs_dir / FOLDER / f"result_{index}" / path.name)
