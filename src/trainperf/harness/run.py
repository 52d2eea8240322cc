"""THE time-to-train loop: MLPerf clock, event sequence, evaluation schedule and stop rules.

Sequence (MLPerf Training rules): cache_clear, submission_*, init_start, seed and hyperparameters,
init_stop, run_start (before any data is touched), then blocks of epochs between evaluations
(block_start / epoch_start / epoch_stop / eval_start / eval_stop / eval_accuracy / block_stop), and
run_stop with status `success` when the target is met or `aborted` otherwise (epoch budget spent,
SIGINT/SIGTERM, a non-finite loss, or an error while reading data).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from mlperf_logging.mllog import constants as C

from trainperf.errors import RunAborted, TrainperfError
from trainperf.harness.mlperf_log import MLPerfLog
from trainperf.harness.progress import NoProgress, PlainProgress
from trainperf.runtime import distributed, environment, speedups
from trainperf.runtime.context import RuntimeContext
from trainperf.runtime.step import TrainStep
from trainperf.spec import Evaluation, Recipe, RunResult, Workload, bare_model


@dataclass
class RunConfig:
    """What to run and how to label it in the log."""

    workload: Workload
    recipe: Recipe
    scale: str
    data_dir: Path
    seed: int
    log_path: Path | None
    division: str = "open"
    org: str = "trainperf"
    status: str = "onprem"
    clear_caches: bool = False
    extra_env: dict[str, Any] = field(default_factory=dict)


class Clock:
    """Wall-clock milliseconds, read only after the device has finished its queued work."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx

    def now_ms(self) -> int:
        self.ctx.synchronize()
        return int(time.time() * 1000)


def clear_page_cache() -> bool:
    """Drop the OS page cache (needs root), as MLPerf submissions do before a run."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def abort_on_signals() -> Iterator[Callable[[], None]]:
    """Turn SIGINT/SIGTERM into RunAborted inside the timed loop (main thread only).

    It yields `hold`: from then on a signal is held instead of raised, so that closing the log and
    saving the result cannot be cut short (a launcher stops the surviving ranks with SIGTERM as soon
    as one rank dies, which is exactly when rank 0 is writing its aborted result). A held signal is
    delivered again once the previous handlers are back.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    held: list[int] = []
    armed = [True]

    def handler(signum: int, _frame: Any) -> None:
        if armed[0]:
            raise RunAborted(f"received {signal.Signals(signum).name}")
        held.append(signum)

    def hold() -> None:
        armed[0] = False

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield hold
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if held:
            signal.raise_signal(held[0])


def run(config: RunConfig, ctx: RuntimeContext, progress: PlainProgress | None = None,
        on_result: Callable[[RunResult], None] | None = None) -> RunResult:
    """Train `config.workload` to its target under the MLPerf clock and return the result.

    Whatever happens after init_start, the MLPerf log ends with run_stop: `success` when the target
    was met, `aborted` (with a reason) otherwise. A TrainperfError (bad data, say) or a signal ends
    the run as aborted; any other exception is a bug and is re-raised once the log is closed.
    `on_result` (saving the result file, say) runs before a signal received after the loop ended
    is let through.
    """
    workload, recipe = config.workload, config.recipe
    progress = progress if (progress is not None and ctx.is_main) else NoProgress()
    log = MLPerfLog(config.log_path if ctx.is_main else None)
    clock = Clock(ctx)
    loop = _TimedLoop(config, ctx, log, clock, progress)
    status, reason, bug = "aborted", None, None
    with abort_on_signals() as hold_signals:
        try:
            try:
                reached = loop.execute()
                if reached:
                    status = "success"
                else:
                    reason = (f"target {workload.metric.name} {recipe.target} not reached within "
                              f"{recipe.max_epochs} epochs")
            except RunAborted as exc:
                reason = exc.reason
            except KeyboardInterrupt:
                reason = "interrupted"
            except TrainperfError as exc:
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 - the log must close whatever went wrong
                if ctx.distributed and _collective_failure(exc):
                    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    reason = f"rank {ctx.rank}: a collective failed, another rank died or hung ({first_line})"
                else:
                    reason = f"internal error: {type(exc).__name__}: {exc}"
                    bug = exc
        finally:
            hold_signals()
            try:
                loop.stop(status, reason)
            finally:
                progress.close()
                log.close()
        if bug is not None:
            raise bug
        result = loop.result(status, reason)
        if on_result is not None:
            on_result(result)
    return result


def _tidy(epochs: float) -> float | int:
    """Whole epoch counts stay integers (as every ruleset's logs have them); fractions get 6 digits."""
    return int(epochs) if float(epochs).is_integer() else round(float(epochs), 6)


class _TargetReached(Exception):
    """An asynchronous evaluation met the target in the middle of an epoch."""


_COLLECTIVE_MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset", "processgroup", "c10d",
                       "timed out")


def _collective_failure(exc: BaseException) -> bool:
    """A failed collective (a peer died or hung), as opposed to a bug in trainperf or a workload."""
    if isinstance(exc, torch.distributed.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _COLLECTIVE_MARKERS)


class _TimedLoop:
    """One run's event sequence: initialisation, the timed blocks, and the closing run_stop."""

    def __init__(self, config: RunConfig, ctx: RuntimeContext, log: MLPerfLog, clock: Clock,
                 progress: PlainProgress) -> None:
        self.config, self.ctx, self.log, self.clock, self.progress = config, ctx, log, clock, progress
        self.init_start_ms: int | None = None
        self.init_stop_ms: int | None = None
        self.run_start_ms: int | None = None
        self.run_stop_ms: int | None = None
        self.evaluations: list[Evaluation] = []
        self.epochs_done = 0
        self.samples = 0
        self.train_time_s = 0.0
        self.epoch_times_s: list[float] = []
        self.train_samples: int | None = None
        self.eval_samples: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[tuple[float, int, Future]] = []
        self._model: torch.nn.Module | None = None  # set when training starts
        self._data: Any = None

    # -- the sequence ---------------------------------------------------------------------------
    def execute(self) -> bool:
        """Log the untimed header and initialisation, then train; True when the target is met."""
        config, log, clock, ctx = self.config, self.log, self.clock, self.ctx
        workload, recipe = config.workload, config.recipe
        cleared = clear_page_cache() if config.clear_caches else False
        log.event(C.CACHE_CLEAR, cleared, time_ms=clock.now_ms())
        now = clock.now_ms()
        log.event(C.SUBMISSION_ORG, config.org, time_ms=now)
        log.event(C.SUBMISSION_PLATFORM, environment.platform_name(ctx.device, ctx.world_size), time_ms=now)
        log.event(C.SUBMISSION_DIVISION, config.division, time_ms=now)
        log.event(C.SUBMISSION_STATUS, config.status, time_ms=now)
        log.event(C.SUBMISSION_BENCHMARK, workload.benchmark, time_ms=now)
        self.init_start_ms = clock.now_ms()
        log.start(C.INIT_START, time_ms=self.init_start_ms)

        log.event(C.SEED, config.seed, time_ms=clock.now_ms())
        torch.manual_seed(config.seed)
        parts = speedups.apply(workload, recipe, workload.build(recipe, ctx, config.data_dir), ctx.device,
                                 ctx.world_size)
        parts = speedups.compile_model(recipe, distributed.wrap_data_parallel(parts, ctx))
        if recipe.compile or recipe.cuda_graphs:
            # Compilation (and graph capture) happen here, on synthetic batches, before run_start as
            # the rules allow; the model and optimizer state are restored afterwards.
            speedups.warm_up(parts, lambda: TrainStep(parts, 1, recipe.grad_accum_steps, recipe, ctx.device),
                             workload.synthetic_batch(recipe, ctx, parts.model), steps=3)
        now = clock.now_ms()
        log.event(C.GLOBAL_BATCH_SIZE, recipe.global_batch_size, time_ms=now)
        log.event(C.GRADIENT_ACCUMULATION_STEPS, recipe.grad_accum_steps, time_ms=now)
        for key, value in workload.mlperf_hyperparameters(recipe, ctx).items():
            log.event(key, value, time_ms=now)
        # Not an MLPerf key (the checker ignores it): which speedups produced this log.
        log.event("trainperf_speedups", speedups.enabled(recipe), time_ms=now)
        if ctx.distributed:
            distributed.preflight(ctx)
        self._end_init()
        ctx.barrier()
        self.run_start_ms = clock.now_ms()
        log.start(C.RUN_START, time_ms=self.run_start_ms)
        return self._train(parts)

    def _end_init(self) -> None:
        self.ctx.barrier()
        self.init_stop_ms = self.clock.now_ms()
        self.log.end(C.INIT_STOP, time_ms=self.init_stop_ms)

    def stop(self, status: str, reason: str | None) -> None:
        """Close the log with run_stop; an abort during initialisation still yields a valid log."""
        if self.init_start_ms is None:
            return  # nothing was logged beyond the header: there is no run to stop
        if self.run_start_ms is None:
            if self.init_stop_ms is None:
                self._end_init()
            self.run_start_ms = self.clock.now_ms()
            self.log.start(C.RUN_START, time_ms=self.run_start_ms)
            reason = f"{reason} (during initialisation)"
        if status == "success":
            # The time is the slowest rank's. An aborted run skips this: a peer may be gone.
            self.ctx.barrier()
        self.run_stop_ms = self.clock.now_ms()
        metadata = {"status": status}
        if reason:
            metadata["reason"] = reason
        self.log.end(C.RUN_STOP, metadata=metadata, time_ms=self.run_stop_ms)

    def result(self, status: str, reason: str | None) -> RunResult:
        config, ctx = self.config, self.ctx
        workload, recipe = config.workload, config.recipe
        evals = self.evaluations
        success = status == "success"
        timed = self.run_start_ms is not None and self.run_stop_ms is not None
        initialised = self.init_start_ms is not None and self.init_stop_ms is not None
        return RunResult(
            workload=workload.name,
            benchmark=workload.benchmark,
            scale=config.scale,
            recipe_name=recipe.name,
            seed=config.seed,
            status=status,
            abort_reason=reason,
            metric=workload.metric.name,
            target=recipe.target,
            time_to_train_s=(self.run_stop_ms - self.run_start_ms) / 1000.0 if timed else None,
            init_time_s=(self.init_stop_ms - self.init_start_ms) / 1000.0 if initialised else 0.0,
            epochs=self.epochs_done,
            samples=self.samples,
            epochs_to_target=evals[-1].epoch if success else None,
            samples_to_target=evals[-1].samples if success else None,
            final_metric=evals[-1].value if evals else None,
            evaluations=evals,
            train_samples_per_s=(self.samples / self.train_time_s) if self.train_time_s > 0 else None,
            epoch_times_s=self.epoch_times_s,
            train_samples=self.train_samples,
            eval_samples=self.eval_samples,
            division=config.division,
            recipe=recipe.to_dict(),
            environment={**environment.describe(ctx.device, ctx.world_size), **config.extra_env},
            log_file=str(config.log_path) if config.log_path else None,
        )

    # -- the timed part -------------------------------------------------------------------------
    def _train(self, parts: Any) -> bool:
        config, log, clock = self.config, self.log, self.clock
        recipe, workload = config.recipe, config.workload
        if recipe.global_batch_size % self.ctx.world_size:
            # Every workload deals each global batch out across the processes.
            raise TrainperfError(f"global_batch_size {recipe.global_batch_size} is not divisible by "
                                 f"{self.ctx.world_size} processes")
        data = workload.load_data(recipe, config.data_dir, self.ctx)
        now = clock.now_ms()
        self.train_samples, self.eval_samples = data.train_samples, data.eval_samples
        log.event(C.TRAIN_SAMPLES, data.train_samples, time_ms=now)
        log.event(C.EVAL_SAMPLES, data.eval_samples, time_ms=now)
        step = TrainStep(parts, data.steps_per_epoch, recipe.grad_accum_steps, recipe, self.ctx.device)
        self.progress.start(workload.name, recipe.max_epochs, data.steps_per_epoch)
        self._data = data
        self._model = parts.model
        block_first = 1
        try:
            for first, count in recipe.eval_schedule.blocks(recipe.max_epochs):
                block_first = first
                log.start(C.BLOCK_START, metadata={"first_epoch_num": first, "epoch_count": count},
                          time_ms=clock.now_ms())
                for epoch in range(first, first + count):
                    self._train_epoch(epoch, step, data)
                last = first + count - 1
                reached = False
                if recipe.eval_schedule.due(last):
                    reached = self._eval_now(float(last))
                log.end(C.BLOCK_STOP, metadata={"first_epoch_num": first}, time_ms=clock.now_ms())
                if reached or self._collect(wait=False):
                    return True
            # The epoch budget is spent: results still being scored can meet the target.
            return self._collect(wait=True)
        except _TargetReached:
            # Met in the middle of a block (MLPerf lets the run end there): close the open block.
            log.end(C.BLOCK_STOP, metadata={"first_epoch_num": block_first}, time_ms=clock.now_ms())
            return True
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    def _eval_now(self, epochs: float, samples: int | None = None) -> bool:
        """Evaluate after `epochs` epochs (synchronously, or launched in the background)."""
        samples = self.samples if samples is None else samples
        if self.config.recipe.async_eval:
            self._launch_eval(epochs, samples)
            return False
        return self._evaluate(epochs, samples)

    # -- asynchronous evaluation ------------------------------------------------------------------
    def _launch_eval(self, epoch: float, samples: int) -> None:
        """Score a snapshot of the weights in a background thread while training goes on. The
        result is logged (with this epoch_num) when it is known, and the clock runs until then."""
        data = self._data
        snapshot = copy.deepcopy(bare_model(self._model)).eval()
        self.log.start(C.EVAL_START, metadata={"epoch_num": self._epoch_num(epoch)}, time_ms=self.clock.now_ms())
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainperf-eval")

        def score() -> float:
            with torch.no_grad():
                partial = data.evaluate(snapshot)
                return float(partial.metric(self.ctx.combine(partial)))

        self._pending.append((epoch, samples, self._executor.submit(score)))

    def _collect(self, wait: bool) -> bool:
        """Log every finished asynchronous evaluation, in order; True once one meets the target."""
        while self._pending and (wait or self._pending[0][2].done()):
            epoch, samples, future = self._pending.pop(0)
            value = future.result()
            if self._record_eval(epoch, value, samples):
                return True
        return False

    def _epoch_num(self, epochs: float) -> float | int:
        """The logged epoch_num, as the workload's rules define it."""
        return _tidy(self.config.workload.eval_epoch_num(epochs))

    def _record_eval(self, epoch: float, value: float, samples: int) -> bool:
        log, clock = self.log, self.clock
        recipe, metric = self.config.recipe, self.config.workload.metric
        now = clock.now_ms()
        epoch_num = self._epoch_num(epoch)
        log.end(C.EVAL_STOP, metadata={"epoch_num": epoch_num}, time_ms=now)
        log.event(C.EVAL_ACCURACY, value, metadata={"epoch_num": epoch_num}, time_ms=now)
        epoch = _tidy(epoch)
        elapsed = (now - self.run_start_ms) / 1000.0 if self.run_start_ms is not None else 0.0
        self.evaluations.append(Evaluation(epoch=epoch, value=value, samples=samples, time_s=elapsed))
        self.progress.evaluation(epoch, metric.name, value, recipe.target)
        if not math.isfinite(value):
            raise RunAborted(f"non-finite {metric.name} at epoch {epoch}")
        return metric.reached(value, recipe.target)

    def _train_epoch(self, epoch: int, step: TrainStep, data: Any) -> None:
        log, clock, progress = self.log, self.clock, self.progress
        recipe = self.config.recipe
        t0 = clock.now_ms()
        log.start(C.EPOCH_START, metadata={"epoch_num": epoch}, time_ms=t0)
        progress.epoch_start(epoch)
        step.model.train()
        # Evaluations inside the epoch (evals_per_epoch > 1): after these step counts, evenly spaced.
        n = recipe.evals_per_epoch
        # (Never at step 0 nor at the epoch's end, which the schedule covers; short epochs get fewer.)
        marks = {s for k in range(1, n) if 0 < (s := round(k * data.steps_per_epoch / n)) < data.steps_per_epoch}
        # Losses stay on the device; the host reads them once per epoch (or when the display asks).
        loss_sum = torch.zeros((), device=self.ctx.device)
        steps = samples = 0
        eval_s = 0.0
        wall0 = time.perf_counter()
        for batch in data.train_batches(epoch):
            loss = step(batch)
            loss_sum += loss
            steps += 1
            samples += data.batch_samples(batch)
            rate = samples / max(time.perf_counter() - wall0 - eval_s, 1e-9)
            progress.step(epoch, steps, rate * self.ctx.world_size, float(loss) if progress.wants_loss() else None)
            reached = False
            if steps in marks:
                e0 = time.perf_counter()
                # Every rank has taken the same number of steps of equal shares of each global batch.
                reached = self._eval_now(epoch - 1 + steps / data.steps_per_epoch,
                                         self.samples + samples * self.ctx.world_size)
                eval_s += time.perf_counter() - e0
                step.model.train()
            if reached or (self._pending and self._pending[0][2].done() and self._collect(wait=False)):
                # The target is known met: stop now (MLPerf lets the run end mid-epoch).
                self.samples += samples * self.ctx.world_size
                self.epochs_done = epoch - 1
                log.end(C.EPOCH_STOP, metadata={"epoch_num": epoch}, time_ms=clock.now_ms())
                self.train_time_s += (clock.now_ms() - t0) / 1000.0 - eval_s
                raise _TargetReached()
        # One reduction per epoch: every rank sees the same loss and sample count, so all ranks take
        # the same stop decision.
        counts = torch.tensor([float(steps), float(samples)], device=self.ctx.device)
        totals = self.ctx.all_reduce_sum(torch.cat([loss_sum.float().reshape(1), counts]))
        mean_loss = float(totals[0]) / max(float(totals[1]), 1.0)
        samples = int(totals[2])
        if not math.isfinite(mean_loss):
            raise RunAborted(f"non-finite training loss in epoch {epoch}")
        t1 = clock.now_ms()
        log.end(C.EPOCH_STOP, metadata={"epoch_num": epoch}, time_ms=t1)
        seconds = (t1 - t0) / 1000.0 - eval_s
        self.epochs_done = epoch
        self.samples += samples
        self.train_time_s += seconds
        self.epoch_times_s.append(seconds)
        progress.epoch_end(epoch, samples / max(seconds, 1e-9), mean_loss)

    def _evaluate(self, epoch: float, samples: int) -> bool:
        self.log.start(C.EVAL_START, metadata={"epoch_num": self._epoch_num(epoch)}, time_ms=self.clock.now_ms())
        # Evaluate without DDP's wrapper: it would sync buffers on every forward, and shards differ in
        # size (a compiled model stays compiled).
        model = getattr(self._model, "module", self._model)
        model.eval()
        with torch.no_grad():
            partial = self._data.evaluate(model)
            value = float(partial.metric(self.ctx.combine(partial)))
        return self._record_eval(epoch, value, samples)
