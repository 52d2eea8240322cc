"""Intra-op threads when several trainperf processes share a machine's cores.

`trainperf run W --nproc N` on a CPU gives each process cores/N OpenMP threads (OMP_NUM_THREADS,
unless the user set it). This script measures why: the same two-process mini with that default and
with every process taking all the cores (torch's own default, which oversubscribes them), side by
side, several runs each; it prints the median time-to-train and wall time of each and their ratio.

    python benchmarks/nproc_threads.py [--workload dlrm] [--nproc 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(workload: str, nproc: int, threads: int, seed: int, out: Path) -> tuple[float, float, bool]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainperf", "run", workload, "--nproc", str(nproc), "--seed", str(seed),
                    "--out", str(out), "--quiet"], env=env, check=False, capture_output=True)
    wall = time.perf_counter() - start
    result = json.loads((out / "result.json").read_text())
    busy = bool((result.get("machine_load") or {}).get("busy"))
    return float(result["time_to_train_s"] or "nan"), wall, busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="dlrm")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    settings = {"cores/N (trainperf's default)": max(1, cores // args.nproc), "all cores each": cores}
    found: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):  # alternated, so that a change in the machine's load hits both alike
            for name, threads in settings.items():
                found[name].append(one_run(args.workload, args.nproc, threads, k, Path(tmp) / f"{name[:3]}-{k}"))
    print(f"{args.workload} mini, --nproc {args.nproc}, {cores} cores, {args.runs} runs each (medians)")
    medians = {}
    for name, runs in found.items():
        ttt, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        medians[name] = ttt
        busy = sum(r[2] for r in runs)
        print(f"  OMP threads {settings[name]:>2} ({name}): time-to-train {ttt:7.2f} s, wall {wall:7.2f} s"
              + (f"  [{busy} run(s) on a busy machine]" if busy else ""))
    base, other = medians.values()
    print(f"  all cores each / cores/N: {other / base:.2f}x the time-to-train")


if __name__ == "__main__":
    main()
