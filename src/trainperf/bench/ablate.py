"""Ablation: the throughput of each speedup switch, added one at a time (cumulative) and alone,
against a baseline with every switch off; optionally the mini time-to-train of each configuration."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainperf import plots
from trainperf.bench import throughput
from trainperf.contract import Recipe, RuntimeContext, Workload
from trainperf.files import write_bytes_atomic, write_csv_atomic, write_json_atomic
from trainperf.harness import RunConfig, run
from trainperf.runtime import speedups

# Every switch off (asynchronous evaluation included: throughput is measured without evaluations).
OFF = speedups.all_off()


@dataclass
class AblationRow:
    config: str
    mode: str  # baseline | cumulative | alone
    overrides: list[str]
    samples_per_s: float
    uplift: float  # vs baseline
    mfu: float | None
    epochs_to_target: int | None = None
    time_to_train_s: float | None = None
    reached: bool | None = None


def applicable(workload: Workload, recipe: Recipe, device: torch.device) -> list[tuple[str, str]]:
    """(label, assignment) of each switch of the ladder that this workload, recipe and device can use,
    in the ladder's order (see speedups.SWITCHES)."""
    keep = []
    for switch in speedups.SWITCHES:
        if not switch.ladder or switch.name not in workload.speedups:
            continue
        if switch.name == "cuda_graphs" and device.type != "cuda":
            continue
        if switch.name == "fused_optimizer" and getattr(recipe, "optimizer", None) == "lars":
            continue
        keep.append((switch.label, f"{switch.name}={str(switch.on).lower()}"))
    return keep


def configurations(switches: list[tuple[str, str]]) -> list[tuple[str, str, list[str]]]:
    configs = [("baseline (all off)", "baseline", list(OFF))]
    cumulative: list[str] = []
    names: list[str] = []
    for name, setting in switches:
        cumulative.append(setting)
        names.append(name)
        configs.append(("+".join(names), "cumulative", OFF + cumulative))
    for name, setting in switches:
        configs.append((f"{name} alone", "alone", OFF + [setting]))
    return configs


def run_ablation(workload: Workload, recipe: Recipe, scale: str, data_dir: Path | None, synthetic: bool,
                 steps: int, warmup: int, device: str | None, check_quality: bool, reps: int = 3,
                 say: Callable[[str], None] = print) -> list[AblationRow]:
    """Each distinct configuration is measured `reps` times, the repetitions interleaved so that machine
    drift hits all alike; rows report the median."""
    dev = RuntimeContext.create(device).device
    configs = configurations(applicable(workload, recipe, dev))
    distinct = list(dict.fromkeys(tuple(overrides) for _, _, overrides in configs))
    rates: dict[tuple[str, ...], list[float]] = {key: [] for key in distinct}
    mfus: dict[tuple[str, ...], list[float]] = {key: [] for key in distinct}
    for rep in range(reps):
        for key in distinct:
            result = throughput.run_bench(workload, recipe.with_overrides(key), scale, data_dir, synthetic, steps,
                                          warmup, device)
            rates[key].append(result.samples_per_s)
            if result.mfu is not None:
                mfus[key].append(result.mfu)
            say(f"rep {rep + 1}/{reps}  {' '.join(o for o in key if o not in OFF) or 'baseline':<60} "
                f"{result.samples_per_s:9.1f} samples/s")
    base_rate = statistics.median(rates[tuple(OFF)])
    quality: dict[tuple[str, ...], Any] = {}
    rows: list[AblationRow] = []
    for label, mode, overrides in configs:
        key = tuple(overrides)
        rate = statistics.median(rates[key])
        row = AblationRow(config=label, mode=mode, overrides=[o for o in overrides if o not in OFF],
                          samples_per_s=rate, uplift=rate / base_rate,
                          mfu=statistics.median(mfus[key]) if mfus[key] else None)
        if check_quality:
            if key not in quality:
                ctx = RuntimeContext.create(device)
                quality[key] = run(RunConfig(workload=workload, recipe=recipe.with_overrides(key), scale=scale,
                                             data_dir=data_dir, seed=0, log_path=None), ctx)
            outcome = quality[key]
            row.reached = outcome.status == "success"
            row.epochs_to_target = outcome.epochs_to_target
            row.time_to_train_s = outcome.time_to_train_s
        rows.append(row)
    return rows


def table_text(rows: list[AblationRow]) -> str:
    quality = any(r.reached is not None for r in rows)
    lines = [f"{'configuration':<45} {'mode':<10} {'samples/s':>10} {'uplift':>7} {'MFU':>7}"
             + (f" {'epochs':>7} {'ttt s':>7}" if quality else "")]
    for r in rows:
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "-"
        line = f"{r.config:<45} {r.mode:<10} {r.samples_per_s:>10.1f} {r.uplift:>6.2f}x {mfu:>7}"
        if quality:
            epochs = str(r.epochs_to_target) if r.reached else "missed"
            ttt = f"{r.time_to_train_s:.2f}" if r.time_to_train_s is not None else "-"
            line += f" {epochs:>7} {ttt:>7}"
        lines.append(line)
    return "\n".join(lines)


def save(rows: list[AblationRow], out_dir: Path, title: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "ablation.csv", out_dir / "ablation.json", out_dir / "ablation.png"]
    write_csv_atomic(paths[0], [{**asdict(row), "overrides": " ".join(row.overrides)} for row in rows])
    write_json_atomic(paths[1], {"title": title, "rows": [asdict(r) for r in rows]})
    write_bytes_atomic(paths[2], plots.ablation_chart([asdict(r) for r in rows], title))
    return paths
