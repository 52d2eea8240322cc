"""What the harness costs: the same model, data, steps and evaluations through `trainperf`'s harness
(MLPerf log, clock reads, progress bookkeeping, LR schedule, finite-loss checks) and through a
minimal hand-written loop, alternated in one process. Prints medians and the ratio (bar: <= 1.05).

    python benchmarks/harness_overhead.py --reps 5 --epochs 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainperf import jobs, registry
from trainperf.contract import Assets, EpochView, RuntimeContext
from trainperf.harness import RunConfig, run
from trainperf.runtime import speedups


def harness_time(workload, recipe, data_dir: Path, seed: int, log_dir: Path) -> float:
    ctx = RuntimeContext.create("cpu")
    config = RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=data_dir, seed=seed,
                       log_path=log_dir / f"log_{seed}_{time.monotonic_ns()}.txt")
    result = run(config, ctx)
    assert result.epochs == recipe.max_epochs, result.abort_reason
    return result.time_to_train_s


def minimal_loop_time(workload, recipe, data_dir: Path, seed: int) -> float:
    ctx = RuntimeContext.create("cpu", seed=seed)
    torch.manual_seed(seed)
    # The same model in the same memory layout as the harness runs it (speedups of the recipe applied).
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, data_dir)))
    start = time.perf_counter()
    data = workload.load_data(recipe, data_dir, ctx)
    sched = torch.optim.lr_scheduler.LambdaLR(parts.optimizer, parts.lr_schedule(data.steps_per_epoch))
    forward = speedups.evaluate_with(parts, recipe, ctx.device)
    for epoch in range(1, recipe.max_epochs + 1):
        parts.model.train()
        for batch in data.train_batches(EpochView(epoch=epoch, model=parts.model, log=lambda *a, **k: None)):
            parts.optimizer.zero_grad(set_to_none=True)
            parts.loss_fn(parts.model, batch).backward()
            parts.optimizer.step()
            sched.step()
        parts.model.eval()
        partial = data.evaluate(forward)
        partial.metric(ctx.combine(partial))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="resnet")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    workload = registry.get(args.workload)
    # An unreachable target so both sides train exactly the same number of epochs and evaluations.
    recipe = workload.recipe("mini").with_overrides([f"max_epochs={args.epochs}", "target=2.0"])
    data_dir = jobs.prepared_data(workload, "mini", None)  # generated and recorded on first use
    harness, minimal = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            # Alternate the order so drift on a noisy machine hits both sides alike.
            if rep % 2 == 0:
                harness.append(harness_time(workload, recipe, data_dir, rep, Path(tmp)))
                minimal.append(minimal_loop_time(workload, recipe, data_dir, rep))
            else:
                minimal.append(minimal_loop_time(workload, recipe, data_dir, rep))
                harness.append(harness_time(workload, recipe, data_dir, rep, Path(tmp)))
            print(f"rep {rep}: harness {harness[-1]:.3f} s   minimal loop {minimal[-1]:.3f} s", flush=True)
    h, m = statistics.median(harness), statistics.median(minimal)
    print(f"{args.workload} mini, {args.epochs} epochs + evals, {args.reps} reps: "
          f"harness median {h:.3f} s, minimal loop median {m:.3f} s")
    print(f"harness / minimal loop: {h / m:.3f}")


if __name__ == "__main__":
    main()
