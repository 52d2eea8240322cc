"""The `trainperf` command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainperf import __version__, registry
from trainperf.errors import TrainperfError
from trainperf.spec import SCALES, Workload


def _data_dir(workload: Workload, scale: str, data: str | None) -> Path:
    if data:
        return Path(data).expanduser()
    default = workload.default_data_dir(scale)
    if default is None:
        raise TrainperfError(f"{workload.name} --scale {scale} needs --data DIR (the dataset's root folder)")
    return default


def cmd_list(args: argparse.Namespace) -> int:
    table = Table(title="trainperf workloads")
    for column in ("workload", "MLPerf key", "ruleset", "metric", "target mini", "target full", "mini data",
                   "what"):
        table.add_column(column, no_wrap=column != "what")
    for name in registry.names():
        w = registry.get(name)
        mini_dir = w.default_data_dir("mini")
        ready = "ready" if mini_dir is not None and not w.data_problems("mini", mini_dir) else "on first run"
        direction = ">=" if w.metric.higher_is_better else "<="
        table.add_row(name, w.benchmark, w.ruleset, w.metric.name,
                      f"{direction} {w.recipe('mini').target}", f"{direction} {w.recipe('full').target}",
                      ready, w.summary)
    # Wide enough for the table when the output is a pipe (rich would assume 80 columns).
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    workload = registry.get(args.workload)
    data_dir = _data_dir(workload, args.scale, args.data)
    workload.prepare(args.scale, data_dir, print)
    if args.scale == "full":
        print(f"{data_dir}: ready for trainperf run {workload.name} --scale full --data {data_dir}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from trainperf.harness import RunConfig, run
    from trainperf.harness.progress import make_progress
    from trainperf.paths import default_run_dir
    from trainperf.results import run_folder
    from trainperf.runtime.context import RuntimeContext

    workload = registry.get(args.workload)
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(args.set or [])
    data_dir = _data_dir(workload, args.scale, args.data)
    # Everything the user typed is checked before anything is written.
    problems = workload.data_problems(args.scale, data_dir)
    if problems and args.scale == "full":
        raise TrainperfError(problems[0])
    ctx = RuntimeContext.create(args.device)
    out_dir = Path(args.out) if args.out else default_run_dir(workload.name)
    run_folder.check_free(out_dir)
    if problems:
        workload.prepare(args.scale, data_dir, print)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % (2**31)
    log_path = run_folder.claim(out_dir)
    division = args.division or ("closed" if args.scale == "full" else "open")
    config = RunConfig(workload=workload, recipe=recipe, scale=args.scale, data_dir=data_dir, seed=seed,
                       log_path=log_path, division=division, org=args.org, clear_caches=args.clear_caches)
    result = run(config, ctx, make_progress(args.quiet))
    result_path = run_folder.save(out_dir, result)
    ttt = f"{result.time_to_train_s:.2f} s" if result.time_to_train_s is not None else "-"
    print(f"{workload.name} {args.scale}: {result.status} in {ttt}"
          + (f" ({result.epochs_to_target} epochs, {workload.metric.name} {result.final_metric:.4f})"
             if result.status == "success" else f" ({result.abort_reason})"))
    print(f"log: {log_path}\nresult: {result_path}")
    return 0 if result.status == "success" else 1


def cmd_check(args: argparse.Namespace) -> int:
    from trainperf.results.compliance import check

    log = Path(args.log)
    if not log.is_file():
        raise TrainperfError(f"{log}: no such log file")
    result = check(log, args.ruleset)
    if args.verbose:
        print(result.output)
    for line in result.problems():
        print(line)
    print(f"{log}: {result.verdict} (official mlperf_logging compliance checker, training ruleset "
          f"{result.ruleset}, {result.division} division, benchmark {result.benchmark})")
    return 0 if result.valid else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainperf", description="Time-to-train benchmarks by MLPerf rules.")
    parser.add_argument("--version", action="version", version=f"trainperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="workloads, their metric and targets, and whether data is ready")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("prepare", help="generate the mini dataset, or verify a full dataset")
    p.add_argument("workload")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--data", metavar="DIR", help="dataset root (default for mini: the cache folder)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("run", help="train a workload to its target under the MLPerf clock")
    p.add_argument("workload")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--data", metavar="DIR", help="dataset root (default for mini: the cache folder)")
    p.add_argument("--recipe", metavar="NAME", help="a named recipe of the scale (default: the first)")
    p.add_argument("--seed", type=int, help="random seed (default: drawn at random and recorded)")
    p.add_argument("--out", metavar="DIR", help="run folder (default: runs/<workload>-<UTC time>/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field (repeatable)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--division", choices=("closed", "open"),
                   help="submission_division (default: closed for full, open for mini)")
    p.add_argument("--org", default="trainperf", help="submission_org to log")
    p.add_argument("--clear-caches", action="store_true", help="drop the OS page cache first (needs root)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", help="run the official MLPerf compliance checker on a log")
    p.add_argument("log")
    p.add_argument("--ruleset", help="checker ruleset (default: the one that knows the log's benchmark)")
    p.add_argument("--verbose", action="store_true", help="print the checker's whole output")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TrainperfError as exc:
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainperf: interrupted", file=sys.stderr)
        return 130
