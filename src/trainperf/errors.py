"""The one error type users see: a single line naming the file, line or option at fault."""

from __future__ import annotations


class TrainperfError(Exception):
    """A problem with the user's input or environment, reported as one clear line (no traceback)."""


class Interrupted(KeyboardInterrupt):
    """A signal that stops a command (SIGINT, SIGTERM, SIGHUP), raised as Python raises Ctrl-C: a
    KeyboardInterrupt, so that no `except Exception` swallows it, every `finally` and atomic output
    unwinds (temporary files removed), and `main` exits 130."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class RunAborted(Exception):
    """Raised inside the timed loop to end a run early; the harness logs `run_stop` as aborted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def shown(text: str, limit: int = 80) -> str:
    """`text` for a one-line error: as it is when every character is visible, else as a Python
    literal, so that a byte-order mark, a tab or a stray control character is shown, not hidden;
    long text is cut."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return cut if cut.isprintable() else repr(cut)
