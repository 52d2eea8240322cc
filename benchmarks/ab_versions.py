"""Two trainperf source trees on the same fixed work, alternately: time-to-train medians of each.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_versions.py /tmp/before/src src resnet --pairs 6 --set target=2 --set max_epochs=4

An unreachable target (`--set target=2`) makes both train the same epochs and evaluations. Which tree
goes first alternates from pair to pair: on a noisy machine the second of two back-to-back runs is
often the slower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(src: Path, workload: str, seed: int, sets: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    argv = [sys.executable, "-m", "trainperf", "run", workload, "--seed", str(seed), "--quiet", "--out", str(out)]
    for item in sets:
        argv += ["--set", item]
    subprocess.run(argv, env=env, capture_output=True, check=False)
    return json.loads((out / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="the src/ folder of the first tree")
    parser.add_argument("after", type=Path, help="the src/ folder of the second tree")
    parser.add_argument("workload")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for name in order:
                result = one_run(getattr(args, name), args.workload, i + 1, args.set, Path(tmp) / f"{name}-{i}")
                times[name].append(result["time_to_train_s"])
                print(f"pair {i + 1} {name:>6}: {result['time_to_train_s']:.3f} s, {result['epochs']} epochs, "
                      f"{result['train_samples_per_s']:.0f} samples/s", flush=True)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"{args.workload}: median before {before:.3f} s, after {after:.3f} s, after / before {after / before:.3f}")


if __name__ == "__main__":
    main()
