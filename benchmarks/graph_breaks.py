"""Whether each workload's full-scale training step is what `--cuda-graphs` needs, measured without a GPU at
the workload's CPU-sized probe settings (Workload.step_probe): its model compiled with fullgraph and static
shapes, forward and backward (trainperf/bench/graphcheck.py: the first break, recompiles over steps of each
shape bucket), where a break is, every break of the forward and loss and why (torch._dynamo.explain), the
step's synchronisations and whether two steps of one batch replay the same work (trainperf/bench/stepcount.py).

    python benchmarks/graph_breaks.py [--only bert,rnnt] [--steps 3] [--markdown]

Tracing uses AOTAutograd without code generation (and dynamo's eager backend for the list of breaks): the
figures are the graphs' structure, not a compile time.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

import torch

from trainperf import registry
from trainperf.bench import graphcheck, stepcount
from trainperf.contract import Assets, RuntimeContext
from trainperf.runtime import speedups


def breaks(name: str) -> dict[str, Any]:
    """Graph breaks of `name`'s loss (forward and loss function) at its probe settings."""
    workload = registry.get(name)
    recipe = workload.recipe("full").with_overrides([*workload.step_probe, "compile=false", "cuda_graphs=false",
                                                      "async_eval=false"])
    ctx = RuntimeContext(device=torch.device("cpu"))
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    parts.model.train()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda b: parts.loss_fn(parts.model, b))(batch)
    reasons: dict[str, int] = {}
    for reason in explained.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame is not None else "?"
        key = f"{where}: {reason.reason.splitlines()[0][:90]}"
        reasons[key] = reasons.get(key, 0) + 1
    return {"workload": name, "graphs": explained.graph_count, "breaks": explained.graph_break_count,
            "reasons": reasons}


def markdown(rows: list[dict[str, Any]], steps: int) -> str:
    """The table of docs/gpus.md from the rows (each as printed to stderr while the script runs)."""
    lines = [f"| workload | graphs | first break (fullgraph, forward or backward) | forward breaks (where: why) "
             f"| recompiles over {steps} steps | buckets | syncs / step (counted on a CPU) | two steps replay "
             "| --cuda-graphs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | - | {r['error']} | - | - | - | - | - | - |")
            continue
        why = "; ".join(f"{n} × {k}" for k, n in r["reasons"].items()) or "-"
        forward = f"{r['breaks']}: {why}" if r["broken"] else "0"
        lines.append(f"| {r['workload']} | {r['graphs']} | {r['broken'] or '-'} | {forward} | {r['recompiles']} | "
                     f"{r['buckets']} | {r['syncs']:g} | {r['replays']} | {'yes' if r['graphs_supported'] else 'no'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated workloads (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="training steps of each bucket (default 3)")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/gpus.md)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else registry.names()
    rows = []
    for name in names:
        start = time.perf_counter()
        try:
            ctx = RuntimeContext(device=torch.device("cpu"))
            with stepcount.quiet_native_stderr():
                workload = registry.get(name)
                sets = ["static_shapes=true"] if "static_shapes" in workload.speedups else []
                found = graphcheck.check(workload, ctx, steps=args.steps, sets=sets)
                row = breaks(name) if found.broken else {"workload": name, "reasons": {}}
                row.update(graphs=found.graphs if not found.broken else row["graphs"], broken=found.broken,
                           recompiles=found.recompiles, buckets=found.buckets,
                           graphs_supported="cuda_graphs" in registry.get(name).speedups)
                counts = stepcount.probe(registry.get(name), RuntimeContext(device=torch.device("cpu")), steps=2,
                                         timed_steps=0)
            row.update(syncs=counts.sync_total, replays="same" if counts.unstable is None else counts.unstable)
        except Exception as exc:  # noqa: BLE001 - one workload's failure is a row of the table, not the end
            row = {"workload": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
        gc.collect()
    if args.markdown:
        print(markdown(rows, args.steps))
    else:
        for r in rows:
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
