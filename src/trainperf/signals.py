"""The signals that stop a command, and what a closed terminal leaves behind."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys

# Ctrl-C, `kill` (and every launcher, scheduler or container runtime), a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def hung_up() -> None:
    """After SIGHUP the terminal is gone: writing to it fails (EIO). Point stdout and stderr that were
    on a terminal at /dev/null, so that closing a run (the live display, the summary) cannot fail.
    (A hung-up terminal no longer says it is one, `isatty` is False: any character device but
    /dev/null is taken for the terminal.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        null = os.fstat(devnull).st_rdev
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                st = os.fstat(stream.fileno())
                if stat.S_ISCHR(st.st_mode) and st.st_rdev != null:
                    os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)
