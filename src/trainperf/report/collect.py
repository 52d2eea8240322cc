"""Gather what a report shows from the paths it is given: run folders, result folders (trainperf's
submission layout or published MLPerf results) and scaling studies."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainperf import registry
from trainperf.contract import Quality, Workload
from trainperf.errors import TrainperfError
from trainperf.results import scoring
from trainperf.results.logs import read_records


def _shown(name: str) -> str:
    """A file or folder name as text: bytes that are not UTF-8 (which Python keeps as lone surrogates,
    unprintable and unencodable) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _json(path: Path, what: str) -> Any:
    """A JSON file a report reads, or one line saying why it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TrainperfError(f"{path}: cannot read {what} ({str(exc).splitlines()[0]})") from None


@contextlib.contextmanager
def _validating(path: Path, what: str) -> Iterator[None]:
    """Inside: a value of the wrong type or shape in the file at `path` is one line naming it."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TrainperfError(f"{path}: not a valid {what} ({type(exc).__name__}: {exc})") from None


def _num(value: Any, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}"[:120])
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}"[:120])
    return value


def _quality(value: Any) -> Quality:
    if isinstance(value, dict):
        return {_str(k): float(_num(v, optional=False)) for k, v in value.items()}
    return float(_num(value, optional=False))


def _dict(value: Any, optional: bool = False) -> dict | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


@dataclass
class RunView:
    """One run, whatever it came from."""

    system: str
    benchmark: str
    label: str
    status: str
    minutes: float | None
    evals: list[tuple[float, Quality]]  # (epoch or samples, quality: a number or named numbers)
    epochs_to_target: float | None = None
    samples_per_s: float | None = None
    seed: int | None = None
    recipe: dict[str, Any] | None = None
    command: str | None = None
    scale: str | None = None
    x_label: str = "epoch"  # what the evaluations' first coordinate counts
    target: Quality | None = None
    environment: dict[str, Any] | None = None
    power: dict[str, Any] | None = None  # result.json's `power` (a run with --power): energy and sources
    power_png: bytes | None = None  # its power/power_node_0.png: watts over the run, evaluations marked


@dataclass
class GroupView:
    """All runs of one benchmark on one system, with the MLPerf score where there is one."""

    system: str
    benchmark: str
    scale: str  # "mini", "full", or "?" for an open-division log from elsewhere
    runs: list[RunView] = field(default_factory=list)
    score: float | None = None
    score_note: str = ""
    target: Quality | None = None  # a number, or {name: target} for a composite metric
    metric: str = "quality"
    higher_is_better: bool = True
    valid: bool = True  # False: too many non-converged runs for an MLPerf score (no time shown, none compared)

    @property
    def minutes(self) -> list[float]:
        return [r.minutes for r in self.runs if r.status == "success" and r.minutes is not None]

    @property
    def headline(self) -> float | None:
        """The olympic score, or the mean of converged runs when there are too few for one; none when invalid."""
        if not self.valid:
            return None
        if self.score is not None:
            return self.score
        return statistics.fmean(self.minutes) if self.minutes else None


@dataclass
class ReportData:
    groups: list[GroupView] = field(default_factory=list)
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)
    scaling: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ablations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    seen: set[Path] = field(default_factory=set)  # what was added, resolved: a path given twice counts once

    def first_time(self, path: Path) -> bool:
        key = path.resolve()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def group(self, system: str, benchmark: str, scale: str) -> GroupView:
        for g in self.groups:
            if (g.system, g.benchmark, g.scale) == (system, benchmark, scale):
                return g
        g = GroupView(system=system, benchmark=benchmark, scale=scale)
        known = registry.by_benchmark(benchmark)
        if known is not None:
            g.metric, g.higher_is_better = known.metric.name, known.metric.higher_is_better
        self.groups.append(g)
        return g


def _from_result_json(result: Any, system: str, label: str) -> RunView:
    """A result.json's run, every field checked for its type (called inside `_validating`)."""
    result = _dict(result)
    recipe = _dict(result.get("recipe"), optional=True)
    # A sample cadence (BERT) is plotted against the samples its log counts; others against epochs.
    by_samples = (recipe or {}).get("log_epoch_num") == "samples"
    evals = []
    for e in result.get("evaluations", []):
        e = _dict(e)
        x = _num(e.get("epoch_num", e["epoch"]) if by_samples else e["epoch"], optional=False)
        evals.append((x, _quality(e["value"])))
    ttt = _num(result.get("time_to_train_s"))
    target = result.get("target")
    environment = _dict(result.get("environment", {}))
    command = environment.get("command")
    return RunView(
        system=system, benchmark=_str(result["benchmark"]), label=label, status=_str(result["status"]),
        minutes=ttt / 60 if ttt is not None else None, evals=evals, x_label="samples" if by_samples else "epoch",
        target=_quality(target) if target is not None else None,
        epochs_to_target=_num(result.get("epochs_to_target")), samples_per_s=_num(result.get("train_samples_per_s")),
        seed=int(_num(result["seed"])) if result.get("seed") is not None else None, recipe=recipe,
        command=_str(command) if command is not None else None,
        scale=_str(result["scale"]) if result.get("scale") is not None else None, environment=environment,
        power=_power(result.get("power")),
    )


def _power(value: Any) -> dict[str, Any] | None:
    """result.json's `power`, its numbers checked where the report reads them."""
    if value is None:
        return None
    power = _dict(value)
    _num(power.get("energy_j"))
    _num(power.get("average_w"))
    for entry in _dict(power.get("sources", {})).values():
        _num(_dict(entry).get("energy_j"))
    return power


def _power_chart(run_dir: Path) -> bytes | None:
    chart = run_dir / "power" / "power_node_0.png"
    return chart.read_bytes() if chart.is_file() else None


def _evals_from_log(path: Path) -> list[tuple[float, Quality]]:
    """(epoch_num or samples_count, quality) of every evaluation; a quality is a number or, for a
    composite metric (Mask R-CNN), a dict of named numbers."""
    points: list[tuple[float, Quality]] = []
    for record in read_records(path):
        value = record.get("value")
        if record["key"] != "eval_accuracy":
            continue
        if isinstance(value, dict):
            value = {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}
        elif isinstance(value, (int, float)):
            value = float(value)
        else:
            continue
        meta = record.get("metadata") or {}
        x = meta.get("samples_count", meta.get("epoch_num"))
        if x is not None and value != {}:
            points.append((float(x), value))
    return points


def _full_target(workload: Workload) -> Quality:
    """The MLPerf target of a workload, as results hold it (a number, or {name: target})."""
    targets = workload.metric.targets(workload.recipe("full").target)
    return targets if workload.metric.composite else targets[workload.metric.name]


def workload_group(label: str, scale: str, run_dirs: list[Path]) -> GroupView:
    """The runs in `run_dirs` as one group named `label` (a suite's workload), target and metric from
    their results."""
    group = GroupView(system=label, benchmark=label, scale=scale)
    for folder in run_dirs:
        path = folder / "result.json"
        result = _json(path, "run result")
        with _validating(path, "trainperf run result"):
            view = _from_result_json(result, label, folder.name)
            known = registry.get(_str(result["workload"])) if result.get("workload") in registry.names() else None
        if known is not None:
            group.metric, group.higher_is_better = known.metric.name, known.metric.higher_is_better
        group.target = view.target if view.target is not None else group.target
        group.runs.append(view)
    return group


def _add_run_folder(data: ReportData, folder: Path) -> None:
    if not data.first_time(folder):
        return
    path = folder / "result.json"
    result = _json(path, "run result")
    with _validating(path, "trainperf run result"):
        env = _dict(_dict(result).get("environment", {}))
        # The machine's system name, as a series names it (results before it was recorded: the platform).
        system = _shown(_str(env.get("system") or env.get("platform", "this machine")))
        view = _from_result_json(result, system, _shown(folder.name))
        view.power_png = _power_chart(folder) if view.power is not None else None
        group = data.group(system, view.benchmark, view.scale or "?")
        group.target = view.target if view.target is not None else group.target
        group.runs.append(view)


def _add_results_tree(data: ReportData, root: Path) -> None:
    for folder in scoring.find_benchmark_folders(root):
        if not data.first_time(folder):
            continue
        scored = scoring.score_folder(folder)
        system = _shown(scored.system)
        # OUT/results/<system>/<benchmark>: OUT (or "/" for a shallower folder) may hold trainperf/ and systems/.
        out = Path(os.path.abspath(folder)).parent.parent.parent
        # trainperf's own series keep each run's result.json beside the submission layout.
        details = out / "trainperf" / scored.system / scored.benchmark
        first_detail = details / "run_0" / "result.json"
        if first_detail.is_file():
            with _validating(first_detail, "trainperf run result"):
                scale = _str(_dict(_json(first_detail, "run result")).get("scale", "?"))
        else:  # a closed-division log is a full-scale MLPerf run by definition
            scale = "full" if scored.runs[0].division == "closed" else "?"
        group = data.group(system, scored.benchmark, scale)
        group.score, group.valid = scored.score, scored.valid
        group.score_note = scored.note
        known = registry.by_benchmark(scored.benchmark)
        for run in scored.runs:
            name = Path(run.file).name
            index = name.removeprefix("result_").removesuffix(".txt")
            detail = details / f"run_{index}" / "result.json"
            if not data.first_time(detail.parent if detail.is_file() else Path(run.file)):
                continue  # also given as a run folder
            name = _shown(name)
            if detail.is_file():
                with _validating(detail, "trainperf run result"):
                    view = _from_result_json(_json(detail, "run result"), system, name)
                view.power_png = _power_chart(detail.parent) if view.power is not None else None
                group.target = view.target if view.target is not None else group.target
                view.status = "success" if run.converged else "aborted"
            else:
                view = RunView(system=system, benchmark=scored.benchmark, label=name,
                               status="success" if run.converged else "aborted", minutes=run.minutes,
                               evals=_evals_from_log(Path(run.file)),
                               epochs_to_target=run.converge_point if run.converged else None)
                # A closed-division log is a full-scale run: the benchmark's MLPerf target applies.
                if group.target is None and known is not None and run.division == "closed":
                    group.target = _full_target(known)
                if known is not None and known.recipe("full").log_epoch_num == "samples":
                    view.x_label = "samples"
            group.runs.append(view)
        system_json = out / "systems" / f"{scored.system}.json"
        if system_json.is_file():
            with _validating(system_json, "system description"):
                data.systems[system] = _dict(_json(system_json, "system description"))


# The fields of a study's rows and their kinds: "n" number, "n?" number or null, "s" text, "b?" bool or null.
SCALING_FIELDS = {"devices": "n", "global_batch": "n", "runs": "n", "converged": "n", "time_per_epoch_s": "n?",
                  "epochs_to_target": "n?", "time_to_train_s": "n?", "speedup": "n?", "efficiency": "n?"}
ABLATION_FIELDS = {"config": "s", "mode": "s", "samples_per_s": "n", "uplift": "n", "mfu": "n?",
                   "epochs_to_target": "n?", "reached": "b?"}
ABLATION_MODES = ("baseline", "cumulative", "alone")


def _study(path: Path, fields: dict[str, str]) -> dict:
    """A scaling study's or an ablation's JSON, every row checked for its fields' types."""
    study = _json(path, "study")
    with _validating(path, "trainperf study"):
        study = _dict(study)
        title = study.get("title", "")
        _str(title)
        rows = study["rows"]
        if not isinstance(rows, list) or not rows:
            raise ValueError("no rows")
        for row in rows:
            row = _dict(row)
            for name, kind in fields.items():
                value = row[name]
                if kind == "s":
                    _str(value)
                elif kind == "b?":
                    if value is not None and not isinstance(value, bool):
                        raise TypeError(f"{name}: expected true, false or null, got {value!r}")
                else:
                    _num(value, optional=kind == "n?")
            if "mode" in fields and row["mode"] not in ABLATION_MODES:
                raise ValueError(f"mode {row['mode']!r} is not one of {', '.join(ABLATION_MODES)}")
    return study


def collect(paths: list[Path]) -> ReportData:
    data = ReportData()
    for path in paths:
        if not path.exists():
            raise TrainperfError(f"{path}: no such file or folder")
        if (path / "result.json").is_file():
            _add_run_folder(data, path)
        elif (path / "scaling.json").is_file():
            if data.first_time(path):
                data.scaling.append((_shown(str(path)), _study(path / "scaling.json", SCALING_FIELDS)))
        elif (path / "ablation.json").is_file():
            if data.first_time(path):
                data.ablations.append((_shown(str(path)), _study(path / "ablation.json", ABLATION_FIELDS)))
        elif path.is_dir() and any(path.rglob("result_*.txt")):
            _add_results_tree(data, path)
        elif path.is_dir() and any(path.rglob("result.json")):
            for result in sorted(path.rglob("result.json")):
                _add_run_folder(data, result.parent)
        else:
            raise TrainperfError(f"{path}: not a run folder (result.json), results folder (result_*.txt) "
                                 "scaling study (scaling.json) or ablation (ablation.json)")
    if not (data.groups or data.scaling or data.ablations):
        raise TrainperfError("nothing to report")
    return data
