"""What several commands share: the options of a workload, the speedup switches, progress bars."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from trainperf import jobs
from trainperf.spec import SCALES


@contextlib.contextmanager
def progress_bar(title: str) -> Iterator[Callable[[int, int, int], None]]:
    """progress(done, total, bad): a live bar on a terminal, a line per tenth otherwise."""
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[bad]} bad"),
                       TimeRemainingColumn())
        task = bar.add_task(title, total=None, bad=0)
        with bar:
            yield lambda done, total, bad: bar.update(task, completed=done, total=total, bad=bad)
        return
    shown_tenth = [-1]

    def plain(done: int, total: int, bad: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth != shown_tenth[0]:
            shown_tenth[0] = tenth
            print(f"{title}: {done:,} / {total:,} ({bad} bad)", flush=True)

    yield plain


def run_request(args: argparse.Namespace) -> jobs.RunRequest:
    return jobs.RunRequest(
        workload=args.workload, scale=args.scale, data=args.data, recipe=args.recipe, sets=list(args.set),
        device=args.device, seed=args.seed, out=args.out, nproc=args.nproc, division=args.division, org=args.org,
        status=args.status, runs=args.runs, system=args.system, clear_caches=args.clear_caches, quiet=args.quiet,
        command=jobs.command_line(args.argv))


def warn(text: str) -> None:
    print(text, file=sys.stderr)


def add_switches(p: argparse.ArgumentParser) -> None:
    """The speedup switches (speedups.SWITCHES), each a recipe override recorded with every result."""
    from trainperf.runtime.speedups import SWITCHES

    g = p.add_argument_group("speedups (override the recipe; see README)")
    for switch in SWITCHES:
        if switch.choices:
            g.add_argument(switch.flag, dest=switch.name, choices=switch.choices, help=switch.help)
        else:
            g.add_argument(switch.flag, dest=switch.name, action=argparse.BooleanOptionalAction, default=None,
                           help=switch.help)


def switch_sets(args: argparse.Namespace) -> list[str]:
    from trainperf.runtime.speedups import SWITCHES

    sets = []
    for switch in SWITCHES:
        value = getattr(args, switch.name, None)
        if value is not None:
            sets.append(f"{switch.name}={str(value).lower()}")
    return sets


def add_workload_options(p: argparse.ArgumentParser, with_switches: bool = True) -> None:
    """What selects a workload's run: shared by run, scale, bench and ablate."""
    p.add_argument("workload")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--data", metavar="DIR", help="dataset root (default for mini: the cache folder)")
    p.add_argument("--recipe", metavar="NAME", help="a named recipe of the scale (default: the first)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field (repeatable)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present)")
    if with_switches:
        add_switches(p)


def add_link_options(p: Any) -> None:
    p.add_argument("--bandwidth", type=float, metavar="GB/S", help="all-reduce bus bandwidth per device "
                   "(default: measured between local processes)")
    p.add_argument("--latency", type=float, metavar="US", help="per-hop latency in microseconds")
    p.add_argument("--overlap", type=float, default=1.0,
                   help="fraction of backward that hides the all-reduce (default: 1, as DDP's buckets allow)")


def stamp() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
