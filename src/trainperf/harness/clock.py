"""The MLPerf clock (read after the device's queued work, with untimed sections), the signals that
abort a run, and the page-cache clearing submissions do before one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from trainperf.contract import (
    RuntimeContext,
)
from trainperf.errors import Interrupted
from trainperf.signals import STOP_SIGNALS, hung_up


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




class SignalGuard:
    """What `abort_on_signals` yields. `received`: the signal that stopped the run, whatever exception
    it surfaced as (a workload's `except Exception` may turn it into another, a peer's exit into a
    failed collective); `hold()`: from now on signals wait until the guard is left."""

    def __init__(self) -> None:
        self.armed = True
        self.received: str | None = None
        self.held: list[int] = []

    def hold(self) -> None:
        self.armed = False

    __call__ = hold  # `with abort_on_signals() as hold_signals: ... hold_signals()`


@contextlib.contextmanager
def abort_on_signals() -> Iterator[SignalGuard]:
    """Turn SIGINT/SIGTERM/SIGHUP into `Interrupted` inside the timed loop (main thread only).

    At most one exception comes from a signal: the first one disarms the guard, so a second Ctrl-C (or
    the launcher's SIGTERM after the user's SIGINT) cannot cut short the closing of the log and the
    saving of the result. `hold()` disarms it too (the loop has ended: a launcher stops the surviving
    ranks with SIGTERM as soon as one rank dies, which is exactly when rank 0 is writing its result).
    A signal held without one having stopped the run is delivered again once the previous handlers
    are back. A signal the caller ignores (`nohup`, a background job's SIGINT) stays ignored.
    """
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            hung_up()
        if guard.armed:
            guard.armed = False
            guard.received = signal.Signals(signum).name
            raise Interrupted(guard.received)
        guard.held.append(signum)

    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        old = signal.getsignal(sig)
        if old is signal.SIG_IGN:
            continue
        signal.signal(sig, handler)
        previous[sig] = signal.SIG_DFL if old is None else old
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if guard.held and guard.received is None:
            signal.raise_signal(guard.held[0])
