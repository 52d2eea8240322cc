"""The MLPerf clock (read after the device's queued work, with untimed sections), the signals that
abort a run, and the page-cache clearing submissions do before one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainperf.errors import RunAborted
from trainperf.spec import (
    RuntimeContext,
)


class Clock:
    """Wall-clock milliseconds, read only after the device has finished its queued work, less the
    time spent in `untimed` sections (evaluations the rules time outside the run: MiniGo's)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx
        self._untimed_ms = 0
        self._stopped_at: int | None = None

    def now_ms(self) -> int:
        if self._stopped_at is not None:
            return self._stopped_at
        self.ctx.synchronize()
        return int(time.time() * 1000) - self._untimed_ms

    @contextlib.contextmanager
    def untimed(self, active: bool = True) -> Iterator[None]:
        """While inside, the clock stands still (when `active`); it then goes on from where it stopped."""
        if not active or self._stopped_at is not None:
            yield
            return
        stopped = self._stopped_at = self.now_ms()
        try:
            yield
        finally:
            self._stopped_at = None
            self.ctx.synchronize()
            self._untimed_ms = int(time.time() * 1000) - stopped  # now_ms() goes on from `stopped`



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
