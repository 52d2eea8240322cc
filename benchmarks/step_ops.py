"""What each workload's full-scale training step asks of the host: operators dispatched, kernels,
host-device synchronisations (and where they come from), tensors built from host data, and the host
time outside operators. Each workload at its CPU-sized probe settings (Workload.step_probe).

    python benchmarks/step_ops.py [--only bert,rnnt] [--markdown] [--json FILE] [--device cpu]

The counts are the device's too: on a GPU each kernel costs a few microseconds of host time to
launch, and each synchronisation drains the device's queue (see trainperf/bench/stepcount.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from trainperf import registry
from trainperf.bench import stepcount
from trainperf.runtime import distributed


def markdown(rows: list[stepcount.StepCounts]) -> str:
    lines = ["| workload | probe settings | ops / step | kernels / step | syncs / step (counted on a CPU) "
             "| host-to-device transfers / step "
             "| host ms / step | step ms (this CPU) | where the syncs are |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sites = "; ".join(f"{n:g} × {site}" for site, n in r.sites.items()) or "-"
        host = "-" if r.host_ms is None else f"{r.host_ms:.1f}"
        wall = "-" if r.step_ms is None else f"{r.step_ms:,.0f}"
        lines.append(f"| {r.workload} | {' '.join(r.overrides)} | {r.ops:,.0f} | {r.kernels:,.0f} | {r.sync_total:g} "
                     f"| {r.host_data:g} | {host} | {wall} | {sites} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated workloads (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=2, help="counted (and timed) steps per workload")
    parser.add_argument("--markdown", action="store_true", help="print the README's Markdown table too")
    parser.add_argument("--json", help="write every workload's counts here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else registry.names()
    rows = []
    for name in names:
        workload = registry.get(name)
        ctx = distributed.init_from_env(args.device)
        t0 = time.perf_counter()
        counts = stepcount.probe(workload, ctx, steps=args.steps, timed_steps=args.steps)
        print(f"{name}: counted in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        rows.append(counts)
        gc.collect()
    print(stepcount.table_text(rows))
    for r in rows:
        for site, n in r.sites.items():
            print(f"  {r.workload}: {n:g} x {site}")
    if args.markdown:
        print()
        print(markdown(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in rows], fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
