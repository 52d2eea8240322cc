"""An evaluation's metric scored on rank 0: inline, in a thread, or in a warmed-up worker process."""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from trainperf.errors import TrainperfError
from trainperf.spec import (
    Quality,
)


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
