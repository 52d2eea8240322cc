"""The one error type users see: a single line naming the file, line or option at fault."""

from __future__ import annotations

_WORKER = "Original Traceback (most recent call last):"


class TrainperfError(Exception):
    """A problem with the user's input or environment, reported as one clear line (no traceback).

    Raised in a DataLoader worker, it reaches the main process rebuilt by torch from the worker's whole
    traceback ("Caught TrainperfError in DataLoader worker process 0. Original Traceback ..."): the one
    line it was raised with is taken back out of it, so the terminal, the log and result.json say that
    line, not 21."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and _WORKER in args[0]:
            args = (last_line(args[0]),)
        super().__init__(*args)


def last_line(text: str) -> str:
    """The message a traceback's text ends with ("module.Type: message" -> "message")."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    head, sep, rest = last.partition(": ")
    return rest if sep and " " not in head else last


def one_line(exc: BaseException) -> str:
    """An exception's message as one line: the first line of its own, or, for one rebuilt from a DataLoader
    worker's traceback, the line the worker raised."""
    text = str(exc)
    if _WORKER in text:
        return last_line(text)
    return next((line for line in text.splitlines() if line.strip()), "")


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
