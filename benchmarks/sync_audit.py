"""The sync audit: each workload's full-scale step counted by trainperf's counter (trainperf.bench.stepcount) and,
on a CUDA GPU, as torch reports it (`torch.cuda.set_sync_debug_mode("warn")`, each warning's site), side by
side, in one process. Until a GPU's figure agrees, a sync count is a CPU's count.

    python benchmarks/sync_audit.py [--only retinanet,gnmt] [--device cuda] [--json FILE]

On a CPU only the counter's column is filled. The GPU round runs it (its "syncs" section).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from trainperf import registry
from trainperf.bench import stepcount
from trainperf.contract import RuntimeContext


def audit(name: str, ctx: RuntimeContext) -> dict[str, Any]:
    workload = registry.get(name)
    t0 = time.perf_counter()
    counted = stepcount.probe(workload, ctx, steps=2, timed_steps=0)
    row: dict[str, Any] = {"workload": name, "counted": counted.sync_total, "counted_sites": counted.sites}
    if ctx.device.type == "cuda":
        device = stepcount.device_syncs(workload, ctx)
        row.update(device=device["syncs"], device_sites=device["sites"], agree=device["syncs"] == counted.sync_total)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated workloads (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    ctx = RuntimeContext.create(args.device)
    rows = []
    for name in args.only.split(",") if args.only else registry.names():
        try:
            row = audit(name, ctx)
        except Exception as exc:  # noqa: BLE001 - one workload's failure must not lose the others' rows
            row = {"workload": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        device = row.get("device", "-")
        print(f"{name:<16} counted {row.get('counted', '-')!s:>5}  {args.device} reports {device!s:>5}  "
              f"{row.get('seconds', '-')} s{'  ' + row['error'] if 'error' in row else ''}", flush=True)
        if row.get("agree") is False:
            for site, n in row["device_sites"].items():
                print(f"    {n:g} x {site}", flush=True)
        gc.collect()
        if ctx.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all("error" not in r and r.get("agree", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
