"""How a run ends: its status and reason from what stopped the loop (the target, the budget, a signal, an error,
a peer's death), and the RunResult its loop and log support."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainperf.contract import RunResult
from trainperf.errors import RunAborted, TrainperfError, one_line
from trainperf.runtime import environment


def outcome(loop: Any, reached: bool, failure: BaseException | None, signal_name: str | None
             ) -> tuple[str, str | None, BaseException | None]:
    """(status, reason, bug to re-raise once the log is closed) of a finished loop. A signal is the
    reason whatever it surfaced as: a workload's `except Exception` may have turned it into another
    error, a peer stopped by the same signal into a failed collective."""
    workload, recipe, ctx = loop.workload, loop.recipe, loop.ctx
    if failure is None and reached:
        return "success", None, None  # a signal that came after the target was met is held
    if signal_name is not None:
        return "aborted", f"received {signal_name}", None
    if failure is None:
        return "aborted", (f"target {workload.metric.name} {workload.metric.describe_target(recipe.target)} "
                           f"not reached within {loop.cadence.describe_budget()}"), None
    if isinstance(failure, RunAborted):
        return "aborted", failure.reason, None
    if isinstance(failure, KeyboardInterrupt):
        return "aborted", "interrupted", None
    if isinstance(failure, TrainperfError):
        return "aborted", str(failure), None
    if isinstance(failure, Exception) and ctx.distributed and collective_failure(failure):
        first_line = one_line(failure) or type(failure).__name__
        return "aborted", f"rank {ctx.rank}: a collective failed, another rank died or hung ({first_line})", None
    # A bug (or SystemExit): one line in the log and the result; the traceback goes to the terminal.
    return "aborted", f"internal error: {type(failure).__name__}: {one_line(failure)}", failure


_COLLECTIVE_MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset", "processgroup", "c10d",
                       "timed out")


def collective_failure(exc: BaseException) -> bool:
    """A failed collective (a peer died or hung), as opposed to a bug in trainperf or a workload."""
    if isinstance(exc, torch.distributed.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _COLLECTIVE_MARKERS)


def tidy(epochs: float) -> float | int:
    """Whole epoch counts stay integers (as every ruleset's logs have them); fractions get 6 digits."""
    return int(epochs) if float(epochs).is_integer() else round(float(epochs), 6)


def run_result(loop: Any, status: str, reason: str | None) -> RunResult:
    """The RunResult of a closed run: what its loop counted and the log says (`loop`: run._TimedLoop)."""
    config, ctx = loop.config, loop.ctx
    workload, recipe = loop.workload, loop.recipe
    evals = loop.evaluations
    success = status == "success"
    timed = loop.run_start_ms is not None and loop.run_stop_ms is not None
    initialised = loop.init_start_ms is not None and loop.init_stop_ms is not None
    targets = workload.metric.targets(recipe.target)
    return RunResult(
        workload=workload.name,
        benchmark=workload.benchmark,
        scale=config.scale,
        recipe_name=recipe.name,
        seed=config.seed,
        status=status,
        abort_reason=reason,
        metric=workload.metric.name,
        target=targets if workload.metric.composite else targets[workload.metric.name],
        time_to_train_s=(loop.run_stop_ms - loop.run_start_ms) / 1000.0 if timed else None,
        init_time_s=(loop.init_stop_ms - loop.init_start_ms) / 1000.0 if initialised else 0.0,
        epochs=loop.epochs_done,
        samples=loop.samples,
        epochs_to_target=evals[-1].epoch if success else None,
        samples_to_target=evals[-1].samples if success else None,
        final_metric=evals[-1].value if evals else None,
        evaluations=evals,
        train_samples_per_s=(loop.samples / loop.train_time_s) if loop.train_time_s > 0 else None,
        epoch_times_s=loop.epoch_times_s,
        train_samples=loop.train_samples,
        eval_samples=loop.eval_samples,
        division=config.division,
        recipe=recipe.to_dict(),
        environment={**environment.describe(ctx.device, ctx.world_size), **config.extra_env},
        log_file=str(config.log_path) if config.log_path else None,
        steps=loop.steps,
        cadence=dataclasses.asdict(loop.cadence),
        layout=loop._layout,
        shape_buckets=workload.shape_buckets(recipe),
        counters=loop._data.counters() if loop._data is not None and loop._data.counters is not None else None,
    )
