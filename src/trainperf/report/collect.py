"""Gather what a report shows from the paths it is given: run folders, result folders (trainperf's
submission layout or published MLPerf results) and scaling studies."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainperf import registry
from trainperf.errors import TrainperfError
from trainperf.results import scoring
from trainperf.results.logs import read_records
from trainperf.spec import Quality, Workload


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

    @property
    def minutes(self) -> list[float]:
        return [r.minutes for r in self.runs if r.status == "success" and r.minutes is not None]

    @property
    def headline(self) -> float | None:
        """The olympic score, or the mean of converged runs when there are too few for one."""
        if self.score is not None:
            return self.score
        return statistics.fmean(self.minutes) if self.minutes else None


@dataclass
class ReportData:
    groups: list[GroupView] = field(default_factory=list)
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)
    scaling: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ablations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

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


def _from_result_json(result: dict[str, Any], system: str, label: str) -> RunView:
    # A sample cadence (BERT) is plotted against the samples its log counts; others against epochs.
    by_samples = (result.get("recipe") or {}).get("log_epoch_num") == "samples"
    return RunView(
        system=system, benchmark=result["benchmark"], label=label, status=result["status"],
        minutes=result["time_to_train_s"] / 60 if result.get("time_to_train_s") is not None else None,
        evals=[(e.get("epoch_num", e["epoch"]) if by_samples else e["epoch"], e["value"])
               for e in result.get("evaluations", [])],
        x_label="samples" if by_samples else "epoch", target=result.get("target"),
        epochs_to_target=result.get("epochs_to_target"), samples_per_s=result.get("train_samples_per_s"),
        seed=result.get("seed"), recipe=result.get("recipe"), command=result.get("environment", {}).get("command"),
        scale=result.get("scale"),
    )


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


def _add_run_folder(data: ReportData, folder: Path) -> None:
    result = json.loads((folder / "result.json").read_text())
    system = result.get("environment", {}).get("platform", "this machine")
    group = data.group(system, result["benchmark"], result.get("scale", "?"))
    group.target = result.get("target", group.target)
    group.runs.append(_from_result_json(result, system, folder.name))


def _add_results_tree(data: ReportData, root: Path) -> None:
    for folder in scoring.find_benchmark_folders(root):
        scored = scoring.score_folder(folder, rcp=False)
        # trainperf's own series keep each run's result.json beside the submission layout.
        details = folder.parents[2] / "trainperf" / scored.system / scored.benchmark
        first_detail = details / "run_0" / "result.json"
        if first_detail.is_file():
            scale = json.loads(first_detail.read_text()).get("scale", "?")
        else:  # a closed-division log is a full-scale MLPerf run by definition
            scale = "full" if scored.runs[0].division == "closed" else "?"
        group = data.group(scored.system, scored.benchmark, scale)
        group.score = scored.score
        group.score_note = scored.note
        known = registry.by_benchmark(scored.benchmark)
        for run in scored.runs:
            name = Path(run.file).name
            index = name.removeprefix("result_").removesuffix(".txt")
            detail = details / f"run_{index}" / "result.json"
            if detail.is_file():
                view = _from_result_json(json.loads(detail.read_text()), scored.system, name)
                group.target = view.target if view.target is not None else group.target
                view.status = "success" if run.converged else "aborted"
            else:
                view = RunView(system=scored.system, benchmark=scored.benchmark, label=name,
                               status="success" if run.converged else "aborted", minutes=run.minutes,
                               evals=_evals_from_log(Path(run.file)),
                               epochs_to_target=run.converge_point if run.converged else None)
                # A closed-division log is a full-scale run: the benchmark's MLPerf target applies.
                if group.target is None and known is not None and run.division == "closed":
                    group.target = _full_target(known)
                if known is not None and known.recipe("full").log_epoch_num == "samples":
                    view.x_label = "samples"
            group.runs.append(view)
        system_json = folder.parents[2] / "systems" / f"{scored.system}.json"
        if system_json.is_file():
            data.systems[scored.system] = json.loads(system_json.read_text())


def collect(paths: list[Path]) -> ReportData:
    data = ReportData()
    for path in paths:
        if not path.exists():
            raise TrainperfError(f"{path}: no such file or folder")
        if (path / "result.json").is_file():
            _add_run_folder(data, path)
        elif (path / "scaling.json").is_file():
            data.scaling.append((str(path), json.loads((path / "scaling.json").read_text())))
        elif (path / "ablation.json").is_file():
            data.ablations.append((str(path), json.loads((path / "ablation.json").read_text())))
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
