"""An evaluation's metric scored on rank 0: inline, in a thread, or in a warmed-up worker process."""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from trainperf.contract import (
    Quality,
)
from trainperf.errors import TrainperfError


# -- scoring on rank 0: inline, or in the background ---------------------------------------------
def _import(module: str) -> None:
    importlib.import_module(module)


def _score(metric: Callable[[dict[str, Any]], Quality], combined: dict[str, Any]) -> Quality:
    return metric(combined)


class Done:
    """A finished result, shaped like a future."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _PoolResult:
    """multiprocessing's AsyncResult, shaped like a future."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def done(self) -> bool:
        return self._result.ready()

    def result(self) -> Any:
        return self._result.get()


class Scorer:
    """Runs an evaluation's metric on rank 0, in the background: in a thread, or, for Python-heavy
    host scoring (COCO AP, BLEU, WER), in a worker process started and warmed up (torch and the
    workload's module imported) before run_start, and terminated with the run."""

    def __init__(self, mode: str, warm_module: str) -> None:
        self.mode, self.warm_module = mode, warm_module
        self._threads: ThreadPoolExecutor | None = None
        self._pool: Any = None

    def start(self) -> None:
        if self.mode == "process":
            self._pool = multiprocessing.get_context("spawn").Pool(1)
            self._pool.apply(_import, (self.warm_module,))
        else:
            self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainperf-score")

    def submit(self, metric: Callable[[dict[str, Any]], Quality], combined: dict[str, Any]) -> Any:
        if self._pool is not None:
            # The worker gets host copies; device tensors would travel through CUDA IPC.
            host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in combined.items()}
            try:
                pickle.dumps(metric)
            except Exception as exc:  # noqa: BLE001 - what cannot be pickled varies
                raise TrainperfError(f"host_scoring='process' needs a module-level metric function, got "
                                     f"{metric!r} ({type(exc).__name__})") from None
            return _PoolResult(self._pool.apply_async(_score, (metric, host)))
        assert self._threads is not None
        return self._threads.submit(_score, metric, combined)

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()


class PendingEvaluations:
    """Evaluations launched and not yet logged, oldest first. Rank 0 scores them (inline, or in the
    background with a Scorer); every rank learns each score at the same step, through one broadcast,
    so that every rank takes the same stop decision. A scoring error stops every rank alike."""

    def __init__(self, ctx: Any, scorer: Scorer | None) -> None:
        self.ctx, self.scorer = ctx, scorer
        self._pending: list[tuple[Any, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def launch(self, point: Any, metric: Callable[[dict[str, Any]], Quality], combined: dict[str, Any],
               background: bool) -> list[tuple[Any, Quality]]:
        """Score an evaluation's combined sums: now (returning it, scored) or in the background."""
        if background:
            future = self.scorer.submit(metric, combined) if self.scorer is not None else None
            self._pending.append((point, future))
            return []
        self._pending.append((point, None))  # nothing else is pending: inline scoring has no queue
        outcomes = []
        if self.ctx.is_main:
            try:
                outcomes.append(Done(metric(combined)))
            except Exception as exc:  # noqa: BLE001 - every rank must learn that scoring failed
                outcomes.append(Done(error=exc))
        return self._share(outcomes)

    def ready(self, wait: bool) -> list[tuple[Any, Quality]]:
        """The background scores known now (all of them with `wait`), in order, with their points."""
        if not self._pending:
            return []
        outcomes: list[Done] = []
        if self.ctx.is_main:
            for _point, future in self._pending:
                if not (wait or future.done()):
                    break
                try:
                    outcomes.append(Done(future.result()))
                except Exception as exc:  # noqa: BLE001 - handed to every rank below
                    outcomes.append(Done(error=exc))
        return self._share(outcomes)

    def _share(self, outcomes: list[Done]) -> list[tuple[Any, Quality]]:
        shared: list[tuple[str, Any]] = []
        for outcome in outcomes:
            if outcome.error is None:
                shared.append(("ok", outcome.value))
            elif isinstance(outcome.error, TrainperfError):
                shared.append(("error", str(outcome.error)))
            else:
                shared.append(("bug", f"{type(outcome.error).__name__}: {outcome.error}"))
        shared = self.ctx.broadcast_object(shared)
        scored = []
        for (kind, value), outcome in zip(shared, outcomes or [None] * len(shared), strict=True):
            point, _future = self._pending.pop(0)
            if kind == "bug" and outcome is not None:
                raise outcome.error  # rank 0 keeps the original exception (and its traceback)
            if kind != "ok":
                raise TrainperfError(value if kind == "error" else f"evaluation failed on rank 0: {value}")
            scored.append((point, value))
        return scored
