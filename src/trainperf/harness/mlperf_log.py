"""One run's MLPerf log, written through the official `mlperf_logging.mllog` (never re-implemented).

Each record is flushed as it is written, so a run that is killed still leaves every record it
reached. The harness passes the clock reading (`time_ms`) so that the log and the time-to-train
agree to the millisecond.
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants, mllog

from trainperf.contract import Logged
from trainperf.errors import TrainperfError
from trainperf.rulesets import RULESET_KEY, WORKLOAD_KEY

_ids = itertools.count()


class _LogFile(logging.FileHandler):
    """A FileHandler that fails fast: the first record it cannot write (a full disk, a vanished
    folder) is remembered — MLPerfLog then raises one TrainperfError naming the file — instead of
    logging's "Logging error" block on stderr for every later record; later records are dropped,
    what was written stays. (mllog catches what a handler raises, hence no raise here.)"""

    failed: BaseException | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if self.failed is None:
            self.failed = sys.exc_info()[1]

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)


class MLPerfLog:
    """An mllog logger bound to one file (or to nothing, on ranks that do not write)."""

    def __init__(self, path: Path | None, append: bool = False) -> None:
        """`append`: go on with a log another process left (rank 0, killed): a last line cut by the kill
        is not a record and is dropped, so that the records appended are whole lines."""
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._reported = False  # a write failure is raised once; the records after it are dropped
        # A private logger per run: no shared global logger, several runs may live in one process.
        self._logger = logging.getLogger(f"trainperf.mllog.{next(_ids)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler: logging.Handler
        if path is not None:
            if append:
                _drop_cut_line(path)
            self._handler = _LogFile(path, mode="a" if append else "w", encoding="utf-8")
        else:
            self._handler = logging.NullHandler()
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger.addHandler(self._handler)
        self._ml = mllog.MLLogger(logger=self._logger, default_stack_offset=2)

    def _record(self, kind: str, key: str, value: Any, metadata: dict[str, Any] | None, time_ms: int) -> None:
        failed = getattr(self._handler, "failed", None)
        if failed is not None and not self._reported:
            self._reported = True
            reason = getattr(failed, "strerror", None) or str(failed)
            raise TrainperfError(f"{self.path}: cannot write the MLPerf log ({reason}); what was written before "
                                 "is kept")
        self.records.append({"event_type": kind, "key": key, "value": value, "metadata": metadata or {},
                             "time_ms": time_ms})

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, *,
              time_ms: int) -> None:
        self._ml.event(key=key, value=value, metadata=metadata, time_ms=time_ms)
        self._record(constants.POINT_IN_TIME, key, value, metadata, time_ms)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, *,
              time_ms: int) -> None:
        self._ml.start(key=key, value=value, metadata=metadata, time_ms=time_ms)
        self._record(constants.INTERVAL_START, key, value, metadata, time_ms)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, *,
            time_ms: int) -> None:
        self._ml.end(key=key, value=value, metadata=metadata, time_ms=time_ms)
        self._record(constants.INTERVAL_END, key, value, metadata, time_ms)

    def header(self, *, org: str, platform: str, division: str, status: str, benchmark: str, workload: str,
               ruleset: str, time_ms: int) -> None:
        """The untimed submission lines every log opens with, and which trainperf workload and ruleset wrote
        it (not MLPerf keys: two workloads share `ssd`, rulesets.py)."""
        for key, value in ((constants.SUBMISSION_ORG, org), (constants.SUBMISSION_PLATFORM, platform),
                           (constants.SUBMISSION_DIVISION, division), (constants.SUBMISSION_STATUS, status),
                           (constants.SUBMISSION_BENCHMARK, benchmark), (WORKLOAD_KEY, workload),
                           (RULESET_KEY, ruleset)):
            self.event(key, value, time_ms=time_ms)

    def hyperparameters(self, values: dict[str, Any], time_ms: int) -> None:
        """A recipe's logged hyperparameters: plain values, or a `Logged` value with its metadata."""
        for key, value in values.items():
            if isinstance(value, Logged):
                self.event(key, value.value, metadata=value.metadata, time_ms=time_ms)
            else:
                self.event(key, value, time_ms=time_ms)

    def keys(self) -> list[str]:
        return [r["key"] for r in self.records]

    def close(self) -> None:
        self._handler.close()
        self._logger.removeHandler(self._handler)


def _drop_cut_line(path: Path) -> None:
    """Truncate a log after its last complete line (mllog writes one record per line)."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)
