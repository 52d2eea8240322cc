"""The `trainperf` command line: parse, call the library, print. No logic of its own: the commands
are in runs.py and perf.py, what they share in options.py."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

from trainperf import __version__
from trainperf.cli import perf, runs
from trainperf.cli.options import switch_sets
from trainperf.errors import Interrupted, TrainperfError
from trainperf.jobs import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from trainperf.runtime.distributed import env_placement
from trainperf.signals import hung_up

__all__ = ["build_parser", "main"]

# Each command declares its options beside its cmd_* function (cli/runs.py, cli/perf.py), from the shared
# option helpers of cli/options.py; this is --help's order.
COMMANDS = (
    runs.add_list, runs.add_prepare, runs.add_run, runs.add_scale_study, perf.add_predict, perf.add_tune_batch,
    perf.add_allreduce, perf.add_bench, perf.add_ablate, runs.add_suite, perf.add_plan, perf.add_slurm,
    runs.add_score, runs.add_compare, runs.add_report, runs.add_makes, runs.add_check,
)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainperf", description="Time-to-train benchmarks by MLPerf rules.")
    parser.add_argument("--version", action="version", version=f"trainperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    for add in COMMANDS:
        add(sub)
    return parser


def _interrupt(signum: int, _frame: object) -> None:
    if signum == signal.SIGHUP:
        hung_up()
    raise Interrupted(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """SIGTERM (kill, a scheduler, a container stopping) and SIGHUP (a closed terminal) stop a command
    as Ctrl-C does: an `Interrupted` (a KeyboardInterrupt) unwinds it, so that atomic outputs remove
    their temporary files and a run closes its log, and `main` exits 130. A signal the caller ignores
    (nohup) stays ignored; the main thread only (where Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupt)


def _leave_quietly(code: int) -> None:
    """Once the command has returned, a stop has nothing left to unwind: Python is running its exit
    hooks (torch's compile-time report among them), and an `Interrupted` raised inside one prints a
    traceback. A launcher stopping the ranks that outlive a failed one sends SIGTERM just then. From
    here a signal ends the process at once, with the command's own exit code."""
    if threading.current_thread() is not threading.main_thread():
        return

    def leave(_signum: int, _frame: object) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            signal.signal(sig, leave)


def main(argv: Sequence[str] | None = None) -> int:
    code = EXIT_INTERNAL
    try:
        code = _main(argv)
        return code
    except SystemExit as exc:  # --help, --version, a usage error
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        raise
    finally:
        if argv is None:  # the command itself, not a caller in the same process (tests)
            _leave_quietly(code)


def _main(argv: Sequence[str] | None) -> int:
    stop_on_signals()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `trainperf slurm WORKLOAD ... -- RUN ARGS`: everything after -- is for `trainperf run`.
    run_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, run_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if run_args and not getattr(args, "takes_run_args", False):
        parser.error(f"unexpected arguments after --: {' '.join(run_args)}")
    args.run_args = run_args
    args.argv = argv + (["--", *run_args] if run_args else [])
    if hasattr(args, "set"):
        # Speedup flags are recipe overrides: recorded with the result, passed to every process.
        args.set = list(args.set) + switch_sets(args)
    try:
        return int(args.func(args))
    except TrainperfError as exc:
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`trainperf list | head`): not an error; keep Python quiet at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # A folder or file the user named cannot be written (read-only, full, a file where a folder
        # should be): the system's reason and the path, in one line.
        where = exc.filename if exc.filename is not None else ""
        print(f"trainperf: error: {where}{': ' if where else ''}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        how = f" ({exc.signal_name})" if isinstance(exc, Interrupted) else ""
        placement = env_placement(dict(os.environ))  # a launched rank: the launcher may be who stopped it
        who = f"rank {placement[0]}: " if placement is not None else ""
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print(f"trainperf: {who}interrupted{how}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - anything else is a bug: say so, with the traceback to report
        traceback.print_exc()
        print("trainperf: internal error (a bug in trainperf or a library below it; the traceback above "
              "helps a report)", file=sys.stderr)
        return EXIT_INTERNAL
