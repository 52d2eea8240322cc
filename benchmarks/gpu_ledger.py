"""The GPU rounds' ledger (docs/gpu/ledger.json): for every measurement a round makes (a workload's eager bench,
a rung of its compile ladder, its sync audit, a rung of the ResNet ladder), the last figure, the commit, the
code it measured (a fingerprint), the GPU, torch, the date and the seconds it took. A round reads it to put
first what was never measured on its kind of GPU, then what is oldest, to skip what has not changed since
(the same code, GPU and torch), and to cap a compile by the time it took before.

    python benchmarks/gpu_ledger.py --seed docs/gpu/*.json     # (re)build the ledger from rounds' summaries
    python benchmarks/gpu_ledger.py --merge DIR/ledger.json    # take a round's ledger into docs/gpu/ledger.json
    python benchmarks/gpu_ledger.py                            # what the next round would measure first
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEDGER = REPO / "docs" / "gpu" / "ledger.json"
PACKAGE = REPO / "src" / "trainperf"
# A compile whose time is unknown gets this long before the round moves on; a known one twice its last time.
UNKNOWN_COMPILE_S = 150.0
FIGURES = ("samples_per_s", "units_per_s", "step_time_p50_ms", "mfu", "peak_memory_mb", "device", "counted")


def key(section: str, workload: str | None = None, rung: str | None = None) -> str:
    return "/".join(part for part in (section, workload, rung) if part)


def fingerprint(workload: str | None, package: Path = PACKAGE) -> str:
    """A hash of the code a workload's figure depends on: the package without the other workloads' folders
    (another workload's change does not move this one's figure; the harness's, the runtime's or the
    shared families' does). None: the whole package (the ResNet ladder names its workload too)."""
    others = {p.name for p in (package / "workloads").iterdir() if p.is_dir() and p.name not in ("common", workload)}
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
        parts = path.relative_to(package).parts
        if len(parts) > 1 and parts[0] == "workloads" and parts[1] in others:
            continue
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def load(path: Path = LEDGER) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"about": __doc__.splitlines()[0], "entries": {}}


def save(ledger: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def gpu_kind(name: str | None) -> str:
    """The GPU model a figure belongs to ('NVIDIA H100 80GB HBM3' -> 'h100'): figures of one model compare."""
    lowered = (name or "unknown").lower()
    for model in ("b300", "gb300", "b200", "gb200", "h200", "h100", "a100", "l40s", "l4"):
        if model in lowered.replace(" ", "").replace("-", ""):
            return model
    return lowered.replace(" ", "-")


def record(ledger: dict[str, Any], entry_key: str, row: dict[str, Any], *, commit: str, gpu: str, torch: str,
           date: str, code: str | None, seconds: float | None) -> None:
    """Write one measurement (a row of the round's summary) into the ledger, under its GPU model."""
    figures = {k: row[k] for k in FIGURES if row.get(k) is not None}
    if not figures:
        return
    ledger["entries"].setdefault(entry_key, {})[gpu_kind(gpu)] = {
        "figures": figures, "commit": commit[:10], "gpu": gpu, "torch": torch, "date": date, "code": code,
        "seconds": None if seconds is None else round(seconds, 1)}


def last(ledger: dict[str, Any], entry_key: str, gpu: str) -> dict[str, Any] | None:
    return ledger["entries"].get(entry_key, {}).get(gpu_kind(gpu))


@dataclass(frozen=True)
class Planned:
    key: str
    reason: str  # "never measured on this GPU", "code changed since DATE", "torch changed", "unchanged since DATE"
    age: str  # the last date ("" when never)
    unchanged: bool
    seconds: float | None  # what it took the last time


def plan(keys: list[str], ledger: dict[str, Any], gpu: str, torch: str, codes: dict[str, str]) -> list[Planned]:
    """`keys` in the order a round should measure them: never measured on this GPU model first, then the
    oldest first; each says why. Unchanged ones (the same code fingerprint and torch) come last, marked so
    that a round skips them. `codes`: each key's code fingerprint now."""
    found = []
    for k in keys:
        entry = last(ledger, k, gpu)
        if entry is None:
            found.append(Planned(k, f"never measured on {gpu_kind(gpu)}", "", False, None))
            continue
        if entry.get("torch") != torch:
            reason = f"torch {entry.get('torch')} then"
        elif entry.get("code") != codes.get(k):
            reason = f"code changed since {entry['date']} ({entry['commit']})"
        else:
            found.append(Planned(k, f"unchanged since {entry['date']} ({entry['commit']})", entry["date"], True,
                                 entry.get("seconds")))
            continue
        found.append(Planned(k, reason, entry["date"], False, entry.get("seconds")))
    # Stable sorts: never measured, then by age (oldest first), the unchanged at the end.
    return sorted(found, key=lambda p: (p.unchanged, p.age != "", p.age))


def compile_cap(planned: Planned) -> float:
    """How long a compile rung may take: twice what it took last time, or UNKNOWN_COMPILE_S."""
    return UNKNOWN_COMPILE_S if planned.seconds is None else max(60.0, 2 * planned.seconds)


def seed_from_round(ledger: dict[str, Any], summary: dict[str, Any]) -> int:
    """Take a round's summary (round.json) into the ledger (code fingerprints unknown: its measurements count as
    stale until measured again). Returns how many measurements it held."""
    env = summary.get("environment", {})
    gpu = (env.get("gpus") or ["unknown"])[0]
    commit, torch = env.get("git_sha") or "unknown", env.get("versions", {}).get("torch") or "unknown"
    date = summary.get("started", "")[:10]
    n = 0
    for section in summary.get("sections", []):
        seconds = {c["name"]: c.get("seconds") for c in section.get("commands", [])}
        results = section.get("results") or []
        if not isinstance(results, list):
            continue
        for i, row in enumerate(results):
            if not isinstance(row, dict):
                continue
            name = section["name"]
            if name == "bench":
                entry_key, took = key("bench", row.get("workload")), seconds.get(f"bench-{row.get('workload')}")
            elif name == "graphs":
                entry_key = key("graphs", row.get("workload"), row.get("rung"))
                took = seconds.get(f"graphs-{row.get('workload')}-{i}")
            elif name == "ladder":
                entry_key, took = key("ladder", "resnet", row.get("rung")), seconds.get(f"ladder-{i}")
            elif name == "syncs":
                entry_key, took = key("syncs", row.get("workload")), row.get("seconds")
            else:
                continue
            before = last(ledger, entry_key, gpu)
            if before is not None and before["date"] > date:
                continue  # a later round's figure stays
            record(ledger, entry_key, row, commit=commit, gpu=gpu, torch=torch, date=date,
                   code=row.get("code"), seconds=took)
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", nargs="*", type=Path, help="rounds' round.json files to build the ledger from")
    parser.add_argument("--merge", type=Path, help="a round's ledger.json to take into docs/gpu/ledger.json")
    parser.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="plan for this GPU (default: an H100)")
    parser.add_argument("--torch", help="plan for this torch version (default: the installed one)")
    args = parser.parse_args(argv)
    ledger = load()
    if args.seed:
        for path in sorted(args.seed):
            print(f"{path}: {seed_from_round(ledger, json.loads(path.read_text()))} measurements")
        save(ledger, LEDGER)
        return 0
    if args.merge:
        theirs = load(args.merge)
        for entry_key, by_gpu in theirs["entries"].items():
            for model, entry in by_gpu.items():
                mine = ledger["entries"].setdefault(entry_key, {}).get(model)
                if mine is None or mine["date"] <= entry["date"]:
                    ledger["entries"][entry_key][model] = entry
        save(ledger, LEDGER)
        return 0
    import torch

    sys.path.insert(0, str(REPO / "src"))
    from trainperf import registry

    keys = [key("bench", w) for w in registry.names()]
    codes = {k: fingerprint(k.split("/")[1]) for k in keys}
    for planned in plan(keys, ledger, args.gpu, args.torch or torch.__version__, codes):
        print(f"{planned.key:<28} {planned.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
