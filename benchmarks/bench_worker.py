"""Many `trainperf` commands in one Python process, for the GPU round: one import of torch and the workloads, one
CUDA context, one memory probe, instead of one of each per command (each cost seconds of a lent GPU's minutes).

    python benchmarks/bench_worker.py JOBS.json [--cache DIR]

JOBS.json: a list of {"name": ..., "argv": [...]} (argv as for `trainperf`). Each job's output goes to
DIR_OF_JOBS/NAME.txt and its exit code and seconds to DIR_OF_JOBS/NAME.done.json, as soon as it ends (a round
that stops this process still has every finished job). --cache DIR: torch.compile's cache artifacts are loaded
from every DIR/*.bin at the start (the hits reported in DIR_OF_JOBS/cache.json) and this process's are saved to
DIR/NAME_OF_JOBS.bin at the end, so that the next round on the same GPU model and torch compiles less.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any


def load_caches(folder: Path) -> dict[str, Any]:
    """Load every compile-cache artifact file of `folder`; what each held."""
    import torch

    loaded: dict[str, Any] = {}
    for path in sorted(folder.glob("*.bin")):
        try:
            info = torch.compiler.load_cache_artifacts(path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a stale or foreign cache is skipped, never fatal
            loaded[path.name] = f"not loaded: {type(exc).__name__}: {exc}"[:200]
            continue
        loaded[path.name] = _described(info)
    return loaded


def save_cache(path: Path) -> dict[str, Any] | None:
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data, info = saved
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"bytes": len(data), **_described(info)}


def _described(info: Any) -> dict[str, Any]:
    """torch's CacheInfo: how many artifacts of each kind (inductor, autotune, AOTAutograd, ...)."""
    if info is None:
        return {}
    found = getattr(info, "artifacts", None)
    if isinstance(found, dict):
        return {str(kind): len(items) for kind, items in found.items()}
    return {"info": str(info)[:200]}


def run_jobs(jobs: list[dict[str, Any]], folder: Path) -> None:
    from trainperf.cli import main

    for job in jobs:
        out = io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code: Any = main(job["argv"])
            except SystemExit as exc:
                code = exc.code
            except Exception as exc:  # noqa: BLE001 - one job's failure must not lose the others
                code = f"{type(exc).__name__}: {exc}"
        (folder / f"{job['name']}.txt").write_text(out.getvalue())
        (folder / f"{job['name']}.done.json").write_text(json.dumps(
            {"exit": code, "seconds": round(time.monotonic() - t0, 1)}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", type=Path)
    parser.add_argument("--cache", type=Path, help="torch.compile cache artifacts: loaded from, saved to here")
    args = parser.parse_args(argv)
    jobs = json.loads(args.jobs.read_text())
    folder = args.jobs.parent
    if args.cache:
        (folder / "cache.json").write_text(json.dumps({"loaded": load_caches(args.cache)}))
    try:
        run_jobs(jobs, folder)
    finally:
        if args.cache:
            saved = save_cache(args.cache / f"{args.jobs.stem}.bin")
            report = json.loads((folder / "cache.json").read_text())
            (folder / "cache.json").write_text(json.dumps({**report, "saved": saved}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
