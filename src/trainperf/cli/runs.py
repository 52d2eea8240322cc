"""Commands around a run: list, prepare, run, check, scale, suite, score, compare, report, make-*."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainperf import jobs, power, registry
from trainperf.cli.options import (
    add_batch_size,
    add_bench_batch,
    add_data,
    add_device,
    add_epochs,
    add_link_options,
    add_nproc,
    add_out,
    add_power,
    add_resume,
    add_ruleset,
    add_runs,
    add_scale,
    add_seed,
    add_steps,
    add_system,
    add_workload,
    add_workload_options,
    output_file,
    positive_float,
    positive_int,
    power_request,
    progress_bar,
    run_request,
    share,
    stamp,
    warn,
)
from trainperf.cli.perf import project_scaling
from trainperf.errors import TrainperfError
from trainperf.files import folder_lock, remove_old_lock_files, remove_stale_partials_around


def add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="workloads, their metric and targets, and whether data is ready")
    p.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    """One entry per workload, its name first and never cut, the rest wrapped to the terminal (80
    columns when piped): what a user types must stay readable at any width."""
    width = max(60, min(shutil.get_terminal_size((80, 24)).columns, 120))
    names = registry.names()
    indent = max(len(n) for n in names) + 2
    wrap = textwrap.TextWrapper(width=width, initial_indent="", subsequent_indent=" " * indent)
    broken = 0
    for name in names:
        try:
            w = registry.get(name)
        except TrainperfError as exc:  # an installed workload that does not load: said, the others still listed
            broken += 1
            print(wrap.fill(f"{name:<{indent - 2}}  cannot be loaded: {exc}"))
            continue
        if "mini" in w.scales:
            mini_dir = w.default_data_dir("mini")
            ready = "mini data " + ("ready" if mini_dir is not None and not jobs.data_problems(w, "mini", mini_dir)
                                    else "made on first run")
        else:
            ready = "full scale only"
        source = f" (installed from {registry.origin(name)})" if registry.origin(name) else ""
        print(wrap.fill(f"{name:<{indent - 2}}  {w.summary}{source}"))
        targets = [f"{scale} {w.metric.describe_target(w.recipe(scale).target)}" for scale in w.scales]
        facts = (f"MLPerf key {w.benchmark} (ruleset {w.mlperf.ruleset}); {w.metric.name}: {', '.join(targets)}; "
                 f"{ready}")
        print(textwrap.fill(facts, width=width, initial_indent=" " * indent, subsequent_indent=" " * indent))
    unusable = f" ({broken} cannot be loaded)" if broken else ""
    print(f"\n{len(names)} workloads{unusable}. Run one: trainperf run {names[0]}   Details: docs/workloads/<name>.md")
    return 0


def add_prepare(sub: Any) -> None:
    p = sub.add_parser("prepare", help="generate the mini dataset, or verify a full dataset")
    add_workload(p)
    add_scale(p)
    add_data(p)
    p.add_argument("--verify", action="store_true",
                   help="read every sample once in parallel processes; list the unreadable ones (then skipped)")
    p.add_argument("--workers", type=positive_int, help="processes for --verify (default: one per CPU)")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    workload = registry.get(args.workload)
    data_dir = jobs.data_dir(workload, args.scale, args.data)
    if args.verify:
        workers = args.workers or os.cpu_count() or 1
        with progress_bar(f"verifying {workload.name} {args.scale}") as progress:
            bad = workload.verify(args.scale, data_dir, workers, progress)
        for line in bad:
            print(line)
        if bad and not workload.skips_unreadable(args.scale):
            raise TrainperfError(f"--verify: {len(bad)} unreadable sample(s) in {data_dir} (listed above); "
                                 f"{workload.name}'s loaders read every sample, as the reference's do, so a run would "
                                 "stop at the first: replace the damaged files")
        print(f"{len(bad)} unreadable sample(s); the loaders skip them ({data_dir})" if bad else "every sample reads")
    if args.scale == "mini":
        problems = jobs.data_problems(workload, "mini", data_dir)
        if not problems:
            # Generated data is deterministic: a complete copy is never rewritten (its files are checked).
            print(f"{workload.name} mini: already present and complete in {data_dir}")
            return 0
        jobs.generate(workload, data_dir, problems, print)
        return 0
    if not data_dir.is_dir():
        raise TrainperfError(f"--data {data_dir}: no such folder")
    with folder_lock(data_dir):
        remove_old_lock_files(data_dir)
        for stale in remove_stale_partials_around(data_dir):
            print(f"removed {stale}, left by a prepare that was killed")
        workload.prepare(args.scale, data_dir, print)
    problems = jobs.eval_set_problems(workload, data_dir)  # the check `run` makes: refused here already
    if problems:
        raise TrainperfError(problems[0])
    if args.scale == "full":
        print(f"{data_dir}: ready for trainperf run {workload.name} --scale full --data {data_dir}")
    return 0


def add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="train a workload to its target under the MLPerf clock")
    add_workload_options(p)
    add_seed(p, help="random seed (default: drawn at random and recorded)")
    add_out(p, "run folder (default: runs/<workload>-<UTC time>/)")
    add_nproc(p, "data-parallel processes to start on this machine (torch elastic launcher)")
    p.add_argument("--division", choices=("closed", "open"),
                   help="submission_division (default: closed for full, open for mini)")
    p.add_argument("--org", default="trainperf", help="submission_org to log")
    p.add_argument("--status", default="onprem", choices=("onprem", "cloud", "preview", "research"),
                   help="submission_status to log (default: onprem)")
    add_runs(p, "N runs (seeds SEED..SEED+N-1) in the MLPerf submission layout; without N: the benchmark's MLPerf "
                "run count", nargs="?", const=0, metavar="N")
    add_system(p)
    add_resume(p, "with --runs, into a folder that holds an interrupted series: keep its finished runs and redo the "
                  "others (same seeds)")
    p.add_argument("--clear-caches", action="store_true", help="drop the OS page cache first (needs root)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    add_power(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    outcome = jobs.start(run_request(args), say=print, warn=warn)
    result = outcome.result
    if result is not None and outcome.out_dir is not None:
        if not outcome.in_group:
            print(jobs.summary(registry.get(args.workload), args.scale, result, outcome.out_dir))
        elif result["status"] != "success":
            warn(f"trainperf: run aborted: {result['abort_reason']}")
    return outcome.code


def make_asset(command: str, out: str | None, default: str, write: Callable[[Path, Callable[[str], None]], Any]
               ) -> Path:
    """A `make-*` command's folder: --out, else ./DEFAULT, never inside the installed package (the shipped
    asset is checked by its SHA-256 where it is used). Written whole, only into a new or empty folder or
    one this command wrote before (prepared.write_owned)."""
    from trainperf import prepared

    folder = Path(out).expanduser().absolute() if out else Path(default).absolute()

    def unowned(foreign: list[str], shown: str) -> str:
        return (f"holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} trainperf did not write ({shown}); "
                f"{command} writes only into a new or empty folder, or one it wrote before")

    def check() -> prepared.GeneratedRecord | None:
        return prepared.owned_target(folder, command, "--out", unowned, what=f"{command} output")

    prepared.write_owned(folder, command, write, lambda line: print(line, flush=True), check=check)
    print(f"{command}: wrote {folder}", flush=True)
    return folder


def add_makes(sub: Any) -> None:
    """One `make-*` command per asset a workload declares (its package's MAKES literal): the CLI names none."""
    for command, (name, spec) in registry.makes().items():
        p = sub.add_parser(command, help=spec["help"])
        if "steps" in spec:
            add_steps(p, steps=spec["steps"], warmup=None, what=f"{spec.get('what', name)} ")
        if "generations" in spec:
            p.add_argument("--generations", type=positive_int, default=spec["generations"],
                           help="self-play generations (default: " + (f"{spec['generations']})" if spec["generations"]
                                                                      else "the shipped asset's)"))
        if "seed" in spec:
            add_seed(p, default=spec["seed"], help="random seed (default: " + (
                f"{spec['seed']}, the shipped asset's)" if spec["seed"] is not None else "the shipped asset's)"))
        add_out(p, f"a new folder for {spec['files']} (default: ./{spec['out']}; the shipped one is never replaced)")
        p.set_defaults(func=cmd_make, make=(command, name, spec))


def cmd_make(args: argparse.Namespace) -> int:
    command, name, spec = args.make
    workload = registry.get(name)
    options = {key: getattr(args, key) for key in ("steps", "seed", "generations") if key in spec}
    make_asset(command, args.out, spec["out"], lambda out, say: workload.make(command, out, say, options))
    return 0


def add_check(sub: Any) -> None:
    p = sub.add_parser("check", help="run the official MLPerf compliance checker on a log")
    p.add_argument("log", help="an MLPerf log (mlperf_log.txt, result_N.txt)")
    add_ruleset(p)
    p.add_argument("--verbose", action="store_true", help="print the checker's whole output")
    p.set_defaults(func=cmd_check)


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
    rules = f" with trainperf's rules {result.config}" if result.config else ""
    print(f"{log}: {result.verdict} (official mlperf_logging compliance checker, training ruleset "
          f"{result.ruleset}{rules}, {result.division} division, benchmark {result.benchmark})")
    return 0 if result.valid else 1


def add_scale_study(sub: Any) -> None:
    p = sub.add_parser("scale", help="scaling study: time-to-train, speedup and efficiency from 1 to N processes")
    add_workload_options(p)
    add_nproc(p, "process counts (default: 1,2)", default="1,2", counts=True)
    add_runs(p, "runs per process count; the median is reported", default=1)
    p.add_argument("--fixed-global-batch", action="store_true",
                   help="keep the recipe's global batch at every size (default: keep the per-device batch)")
    add_out(p, "study folder (default: runs/scale-<workload>-<UTC time>/)")
    add_power(p)
    g = p.add_argument_group("projection (no runs: one device's bench and a ring all-reduce model)")
    g.add_argument("--project", metavar="N,N,...", help="project time-to-train on these device counts")
    add_batch_size(g, "per-device batch (default: the recipe's global batch)")
    add_bench_batch(g, "batch of the one-device bench (default: the per-device batch)")
    add_link_options(g)
    g.add_argument("--peak-tflops", type=positive_float, help="project another device: its peak TFLOP/s (with --mfu)")
    g.add_argument("--mfu", type=share, help="the fraction of --peak-tflops the model reaches")
    add_epochs(g, "epochs to converge where the ruleset has no RCP")
    add_steps(g, steps=10, warmup=3, what="bench ")
    p.set_defaults(func=cmd_scale)


def cmd_scale(args: argparse.Namespace) -> int:
    from trainperf.bench import scaling

    if args.project:
        return project_scaling(args)
    workload = registry.get(args.workload)
    nprocs = scaling.parse_nprocs(args.nproc)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    if args.runs < 1:
        raise TrainperfError(f"--runs {args.runs}: expected >= 1")
    for n in nprocs:  # every leg of the study must hold the recipe's parallelism
        jobs.check_switches(workload, recipe, args.device, n)
    measured = power.check(power_request(args), warn)
    jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"scale-{workload.name}-{stamp()}"
    if (out_dir / "scaling.json").exists():
        raise TrainperfError(f"--out {out_dir}: already holds a scaling study; choose another folder")
    run_args = jobs.RunRequest(workload=workload.name, scale=args.scale, data=args.data, recipe=args.recipe,
                               sets=list(args.set), device=args.device).common_argv()
    rows = scaling.run_study(workload.name, nprocs, args.runs, recipe.global_batch_size, out_dir, run_args,
                             fixed_global_batch=args.fixed_global_batch, power_request=measured)
    mode = "fixed global batch" if args.fixed_global_batch else "fixed per-device batch"
    title = f"{workload.name} {args.scale}: {mode}, {args.runs} run(s) per point"
    paths = scaling.save(rows, out_dir, title)
    print(title)
    print(scaling.table_text(rows))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def add_suite(sub: Any) -> None:
    p = sub.add_parser("suite", help="a whole round: every workload's runs, one results folder, one report")
    p.add_argument("--only", metavar="A,B", help="these workloads only (default: every registered one)")
    add_scale(p)
    add_runs(p, "runs per workload (default: 1)", default=1)
    add_seed(p, help="first seed of each series (default: drawn at random and recorded)")
    add_data(p, metavar="ROOT", help="datasets as ROOT/<workload> (default for mini: the cache)")
    add_device(p)
    add_system(p)
    add_out(p, "suite folder (default: runs/suite-<scale>-<UTC time>/)")
    add_resume(p, "go on with the interrupted suite in --out: finished workloads kept, each series resumed")
    add_power(p)
    p.set_defaults(func=cmd_suite)


def cmd_suite(args: argparse.Namespace) -> int:
    from trainperf import suite

    names = suite.parse_only(args.only, args.scale)
    if args.resume and not args.out:
        raise TrainperfError("--resume: name the suite folder to go on with (--out DIR)")
    out_dir = Path(args.out) if args.out else Path("runs") / f"suite-{args.scale}-{stamp()}"
    measured = power.check(power_request(args), warn)
    seed, done = args.seed, None
    if args.resume:
        kept = suite.resumable(out_dir, names, args.scale, args.runs, args.seed, system=args.system,
                               data_root=Path(args.data) if args.data else None, device=args.device)
        seed, done = kept["seed"], kept["rows"]
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") % (2**31)
    print(f"suite: {len(names)} workload(s) at {args.scale} scale, {args.runs} run(s) each, first seed {seed}, "
          f"into {out_dir}" + (f" ({len(done)} finished workload(s) kept)" if done else ""), flush=True)
    rows = suite.run_suite(names, args.scale, args.runs, out_dir, seed, device=args.device,
                           data_root=Path(args.data) if args.data else None, system=args.system,
                           say=lambda line: print(line, flush=True), warn=warn, done=done, power=measured)
    for path in suite.write_report(out_dir, markdown=True):
        print(f"wrote {path}")
    print(suite.table_text(rows))
    if any(r.reason == suite.INTERRUPTED for r in rows):
        return 130
    return 0 if all(r.status == "ok" for r in rows) else 1


def add_score(sub: Any) -> None:
    p = sub.add_parser("score", help="olympic score of MLPerf result folders (trainperf's or published ones)")
    p.add_argument("folder", help="a results folder in the submission layout (trainperf run --runs --out FOLDER)")
    add_ruleset(p)
    p.set_defaults(func=cmd_score)


def cmd_score(args: argparse.Namespace) -> int:
    from trainperf.results import scoring

    folders = scoring.find_benchmark_folders(Path(args.folder))
    all_valid = True
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.glob("result_*.txt"))
        if size > 16 << 20:  # large logs take a while to check: show it
            print(f"scoring {folder} ({size / 2**20:,.0f} MiB of logs)", flush=True)
            with progress_bar(f"scoring {folder.name}") as bar:
                result = scoring.score_folder(folder, args.ruleset, progress=lambda done, total: bar(done, total, 0))
        else:
            result = scoring.score_folder(folder, args.ruleset)
        all_valid &= result.valid
        # Names and reasons come from folders and logs: shown as text, never read as rich markup.
        table = Table(title=escape(f"{result.system} / {result.benchmark}  (ruleset {result.ruleset})"),
                      title_justify="left")
        energies = any(run.energy_j is not None for run in result.runs)
        for column in ("run", "minutes", "converged", "epochs/samples to converge", "last quality") + (
                ("energy kJ",) if energies else ()):
            table.add_column(column)
        for run in result.runs:
            table.add_row(Path(run.file).name, f"{run.minutes:.3f}" if run.minutes is not None else "-",
                          "yes" if run.converged else escape(f"no ({run.reason})"),
                          "-" if run.converge_point is None else f"{run.converge_point:g}",
                          scoring.quality_text(run.quality),
                          *((("-" if run.energy_j is None else f"{run.energy_j / 1000:,.3f}"),) if energies else ()))
        console = Console(width=None if sys.stdout.isatty() else 120)
        console.print(table)
        if result.score is not None:
            score = f"{result.score:.3f} minutes"
        else:  # valid: every run counts, but fewer than the olympic rule needs (the note gives the mean)
            score = "none (too few runs)" if result.valid else "none (invalid)"
        console.print(f"runs found {len(result.runs)}, converged {result.converged}; olympic score: {score}"
                      + (f"  [{result.note}]" if result.note else ""), highlight=False, markup=False)
        if result.energy_j is not None:
            console.print(f"energy score: {result.energy_j / 1000:,.3f} kJ ({result.benchmark}:Energy, the official "
                          "summarizer's olympic mean of the runs' energies)", highlight=False, markup=False)
        console.print(f"RCP check: {result.rcp}\n", highlight=False, markup=False)
    return 0 if all_valid else 1


def add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="scores of two result folders side by side, with the ratio")
    p.add_argument("a", metavar="A", help="the baseline results folder")
    p.add_argument("b", metavar="B", help="the results folder compared with A")
    add_ruleset(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from trainperf.results import scoring

    comparison = scoring.compare(Path(args.a), Path(args.b), args.ruleset)
    table = Table(title="time-to-train (minutes; olympic score, or the mean when there are too few runs)")
    for column in ("benchmark", f"A: {comparison.system_a}", f"B: {comparison.system_b}", "A / B"):
        table.add_column(escape(column))
    for key, sa, sb, ratio in comparison.rows:
        table.add_row(key, f"{sa:.3f}" if sa is not None else "invalid", f"{sb:.3f}" if sb is not None else "invalid",
                      f"{ratio:.2f}x" if ratio is not None else "-")
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    print("A / B above 1 means B trains faster.")
    for warning in comparison.warnings:
        print(f"warning: {warning}")
    return 0


def add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="HTML (and Markdown) report over runs, result folders and scaling studies")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run folders, submission folders, scaling or ablation studies, suites")
    p.add_argument("-o", "--output", default="report.html", type=output_file,
                   help="HTML file to write (default: report.html)")
    p.add_argument("--markdown", action="store_true", help="also write a Markdown version and its PNGs beside it")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from trainperf.report import collect, render

    data = collect.collect([Path(p) for p in args.paths])
    out = Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise TrainperfError(f"-o {out}: expected an .html file name")
    for path in render.write(data, out, args.markdown):
        print(f"wrote {path}")
    return 0
