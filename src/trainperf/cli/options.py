"""What several commands share: the options of a workload, the speedup switches, progress bars."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainperf import jobs, power
from trainperf.contract import SCALES
from trainperf.errors import shown
from trainperf.power import PowerRequest


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


def add_power(p: argparse.ArgumentParser) -> None:
    """--power and its companions (trainperf/power; docs/power.md)."""
    from trainperf.power.sources import SPEC_HELP

    g = p.add_argument_group("energy to train (MLPerf's power rules; docs/power.md)")
    g.add_argument("--power", metavar="SOURCE[,SOURCE]",
                   help=f"sample the power beside the run and log its energy: {SPEC_HELP}")
    g.add_argument("--power-interval", type=positive_float, metavar="S",
                   help="seconds between samples (default 1; the rules ask for at least one a second)")
    g.add_argument("--power-optional", action="store_true",
                   help="a source this machine cannot read is left out (said so) instead of refusing the run")
    g.add_argument("--power-interconnect", type=non_negative_float, metavar="W",
                   help="the interconnect's estimated watts, logged as interconnect_power_est (sw_0.txt)")


def power_request(args: argparse.Namespace) -> PowerRequest | None:
    return power.request_from(getattr(args, "power", None), getattr(args, "power_interval", None),
                              getattr(args, "power_optional", False), getattr(args, "power_interconnect", None))


def run_request(args: argparse.Namespace) -> jobs.RunRequest:
    return jobs.RunRequest(power=power_request(args),
        workload=args.workload, scale=args.scale, data=args.data, recipe=args.recipe, sets=list(args.set),
        device=args.device, seed=args.seed, out=args.out, nproc=args.nproc, division=args.division, org=args.org,
        status=args.status, runs=args.runs, system=args.system, clear_caches=args.clear_caches, quiet=args.quiet,
        resume=getattr(args, "resume", False),
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


# -- values checked where they are typed: argparse then refuses them in one line (exit 2) ----------
def _number(kind: type, low: float | None, high: float | None, what: str,
            above: float | None = None) -> Callable[[str], Any]:
    """A typed value in [low, high] (and > `above`): NaN and infinities are never numbers here."""
    def parse(raw: str) -> Any:
        try:
            value = kind(raw)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{raw[:40]!r}: expected {what}") from None
        if (isinstance(value, float) and not math.isfinite(value)) or (low is not None and value < low) or \
                (above is not None and value <= above) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{raw[:40]!r}: expected {what}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _number(int, 1, None, "a whole number >= 1")
non_negative_int = _number(int, 0, None, "a whole number >= 0")
non_negative_float = _number(float, 0, None, "a finite number >= 0")
positive_float = _number(float, None, None, "a finite number > 0", above=0)
fraction = _number(float, 0, 1, "a number from 0 to 1")
share = _number(float, None, 1, "a number above 0 and at most 1", above=0)
seed_int = _number(int, 0, 2**32 - 1, "a seed from 0 to 4294967295")
SYSTEM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def system_name(raw: str) -> str:
    """A system name is a folder name in the submission layout: never a path."""
    if not SYSTEM_NAME.fullmatch(raw) or ".." in raw:
        raise argparse.ArgumentTypeError(f"{raw[:40]!r}: expected a name of letters, digits, '.', '_' and '-' "
                                          "(at most 80, starting with a letter or digit)")
    return raw


def _blocking_file(path: Path) -> Path | None:
    """The first existing non-folder among the parents a path would be created under."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


NAME_MAX = 255  # bytes in one file or folder name (ext4, xfs, btrfs, APFS)
# AtomicOutput writes `.NAME.<pid>.<id>.partial` beside a file first: that name must fit too.
PARTIAL_EXTRA = len(f"..{2**22}.{'0' * 8}.partial")


def _writable(raw: str, folder: bool) -> str:
    """A file (or folder) to write: refused before any work when something of the other kind is in
    its place, a file stands where one of its parent folders goes, or a name in it is longer than a
    file system takes (the temporary sibling of a file included)."""
    path = Path(raw)
    for i, part in enumerate(path.parts):
        room = NAME_MAX - (PARTIAL_EXTRA if i == len(path.parts) - 1 and not folder else 0)
        size = len(os.fsencode(part))
        if size > room:
            raise argparse.ArgumentTypeError(f"{shown(part, 40)}: a name of {size} bytes; expected at most {room}")
    try:
        if path.exists() and path.is_dir() != folder:
            raise argparse.ArgumentTypeError(f"{raw}: exists and is not a folder" if folder
                                             else f"{raw}: is a folder; name a file")
        blocking = _blocking_file(path)
    except OSError as exc:  # the whole path too long, or a folder on it that cannot be searched
        raise argparse.ArgumentTypeError(f"{shown(raw, 60)}: {exc.strerror or exc}") from None
    if blocking is not None:
        raise argparse.ArgumentTypeError(f"{raw}: {blocking} is a file, not a folder")
    return raw


def output_file(raw: str) -> str:
    return _writable(raw, folder=False)


def output_dir(raw: str) -> str:
    return _writable(raw, folder=True)


def ruleset_name(raw: str) -> str:
    from trainperf import rulesets

    if raw not in rulesets.known():
        raise argparse.ArgumentTypeError(f"{raw[:40]!r}: expected one of the official checker's rulesets: "
                                         + ", ".join(rulesets.known()))
    return raw


def add_workload(p: argparse.ArgumentParser, help: str | None = None) -> None:
    from trainperf import registry

    p.add_argument("workload", metavar="WORKLOAD", help=help or "one of: " + ", ".join(registry.names()))


def add_scale(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", choices=SCALES, default="mini",
                   help="mini: the small generated dataset and calibrated target (default); full: the MLPerf "
                        "reference recipe, target and dataset (--data)")


def add_workload_options(p: argparse.ArgumentParser, with_switches: bool = True) -> None:
    """What selects a workload's run: shared by run, scale, predict, tune-batch, bench and ablate."""
    add_workload(p)
    add_scale(p)
    add_data(p)
    add_recipe(p)
    add_sets(p)
    add_device(p)
    if with_switches:
        add_switches(p)


# -- options several commands take: each defined once, here (the help may say what it means there) ----
Group = Any  # an ArgumentParser or one of its argument groups


def add_data(p: Group, help: str = "dataset root (default for mini: the cache folder)", metavar: str = "DIR") -> None:
    p.add_argument("--data", metavar=metavar, help=help)


def add_recipe(p: Group, help: str = "a named recipe of the scale (default: the first)") -> None:
    p.add_argument("--recipe", metavar="NAME", help=help)


def add_sets(p: Group, help: str = "override a recipe field (repeatable)") -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_device(p: Group, help: str = "cpu, cuda or cuda:N (default: cuda when present)") -> None:
    p.add_argument("--device", help=help)


def add_out(p: Group, help: str) -> None:
    p.add_argument("--out", metavar="DIR", type=output_dir, help=help)


def add_json(p: Group, help: str) -> None:
    p.add_argument("--json", metavar="FILE", type=output_file, help=help)


def add_seed(p: Group, help: str, default: int | None = None) -> None:
    p.add_argument("--seed", type=seed_int, default=default, help=help)


def add_runs(p: Group, help: str, **kwargs: Any) -> None:
    p.add_argument("--runs", type=positive_int, help=help, **kwargs)


def add_resume(p: Group, help: str) -> None:
    p.add_argument("--resume", action="store_true", help=help)


def add_nproc(p: Group, help: str, default: int | str = 1, counts: bool = False) -> None:
    """Processes on this machine; `counts`: a comma-separated list of them (a scaling study's sizes)."""
    kind = {"metavar": "N,N,..."} if counts else {"type": positive_int}
    p.add_argument("--nproc", default=default, help=help, **kind)


def add_system(p: Group) -> None:
    p.add_argument("--system", type=system_name, help="system name for the results layout (default: from the machine)")


def add_ruleset(p: Group) -> None:
    p.add_argument("--ruleset", type=ruleset_name,
                   help="checker ruleset (default: the one that knows the log's benchmark)")


def add_batch_size(p: Group, help: str) -> None:
    p.add_argument("--batch-size", type=positive_int, help=help)


def add_bench_batch(p: Group, help: str) -> None:
    p.add_argument("--bench-batch", type=positive_int, help=help)


def add_epochs(p: Group, help: str) -> None:
    p.add_argument("--epochs", type=positive_float, help=help)


def add_steps(p: Group, steps: int, warmup: int | None, what: str = "") -> None:
    """Timed and untimed steps of a measurement (`what`: whose, e.g. "bench "); warmup None: no untimed ones."""
    timed = "timed " if warmup is not None else ""
    p.add_argument("--steps", type=positive_int, default=steps, help=f"{timed}{what}steps (default: {steps})")
    if warmup is not None:
        p.add_argument("--warmup", type=non_negative_int, default=warmup,
                       help=f"untimed {what}steps before them (default: {warmup})")


def add_link_options(p: Any) -> None:
    p.add_argument("--bandwidth", type=positive_float, metavar="GB/S", help="all-reduce bus bandwidth per device "
                   "(default: measured between local processes)")
    p.add_argument("--latency", type=non_negative_float, metavar="US", help="per-hop latency in microseconds")
    p.add_argument("--overlap", type=fraction, default=1.0,
                   help="fraction of backward that hides the all-reduce (default: 1, as DDP's buckets allow)")


def stamp() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
