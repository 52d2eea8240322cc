"""The `trainperf` command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trainperf import __version__, jobs, registry
from trainperf.errors import TrainperfError
from trainperf.spec import SCALES


def cmd_list(args: argparse.Namespace) -> int:
    table = Table(title="trainperf workloads")
    for column in ("workload", "MLPerf key", "ruleset", "metric", "target mini", "target full", "mini data",
                   "what"):
        table.add_column(column, no_wrap=column != "what")
    for name in registry.names():
        w = registry.get(name)
        mini_dir = w.default_data_dir("mini")
        ready = "ready" if mini_dir is not None and not w.data_problems("mini", mini_dir) else "on first run"
        table.add_row(name, w.benchmark, w.ruleset, w.metric.name, w.metric.describe_target(w.recipe("mini").target),
                      w.metric.describe_target(w.recipe("full").target), ready, w.summary)
    # Wide enough for the table when the output is a pipe (rich would assume 80 columns).
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    workload = registry.get(args.workload)
    data_dir = jobs.data_dir(workload, args.scale, args.data)
    if args.verify:
        workers = args.workers or os.cpu_count() or 1
        with _progress_bar(f"verifying {workload.name} {args.scale}") as progress:
            bad = workload.verify(args.scale, data_dir, workers, progress)
        for line in bad:
            print(line)
        print(f"{len(bad)} unreadable sample(s); the loaders skip them" if bad else "every sample reads")
    if args.scale == "mini" and not workload.data_problems("mini", data_dir):
        # Generated data is deterministic: a complete copy is never rewritten (its fingerprint is checked).
        print(f"{workload.name} mini: already present and complete in {data_dir}")
        return 0
    workload.prepare(args.scale, data_dir, print)
    if args.scale == "full":
        print(f"{data_dir}: ready for trainperf run {workload.name} --scale full --data {data_dir}")
    return 0


@contextlib.contextmanager
def _progress_bar(title: str) -> Iterator[Callable[[int, int, int], None]]:
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


def _request(args: argparse.Namespace) -> jobs.RunRequest:
    return jobs.RunRequest(
        workload=args.workload, scale=args.scale, data=args.data, recipe=args.recipe, sets=list(args.set),
        device=args.device, seed=args.seed, out=args.out, nproc=args.nproc, division=args.division, org=args.org,
        status=args.status, runs=args.runs, system=args.system, clear_caches=args.clear_caches, quiet=args.quiet,
        command=jobs.command_line(args.argv))


def cmd_run(args: argparse.Namespace) -> int:
    outcome = jobs.start(_request(args), say=print, warn=_warn)
    result = outcome.result
    if result is not None and outcome.out_dir is not None:
        if not outcome.in_group:
            print(jobs.summary(registry.get(args.workload), args.scale, result, outcome.out_dir))
        elif result["status"] != "success":
            _warn(f"trainperf: run aborted: {result['abort_reason']}")
    return outcome.code


def cmd_make_minigo_target(args: argparse.Namespace) -> int:
    workload = registry.get("minigo")
    out = Path(args.out) if args.out else Path(sys.modules[type(workload).__module__].__file__).parent / "mini"
    workload.make_target(out, lambda line: print(line, flush=True), args.generations, args.seed)
    return 0


def cmd_make_phase1(args: argparse.Namespace) -> int:
    workload = registry.get("bert")
    out = Path(args.out) if args.out else Path(sys.modules[type(workload).__module__].__file__).parent / "mini"
    workload.make_phase1(out, args.steps, lambda line: print(line, flush=True), seed=args.seed)
    return 0


def _warn(text: str) -> None:
    print(text, file=sys.stderr)


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


def cmd_scale(args: argparse.Namespace) -> int:
    from trainperf.bench import scaling

    if args.project:
        return _project(args)
    workload = registry.get(args.workload)
    nprocs = scaling.parse_nprocs(args.nproc)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    if args.runs < 1:
        raise TrainperfError(f"--runs {args.runs}: expected >= 1")
    jobs.check_switches(workload, recipe, args.device)
    jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"scale-{workload.name}-{_stamp()}"
    if (out_dir / "scaling.json").exists():
        raise TrainperfError(f"--out {out_dir}: already holds a scaling study; choose another folder")
    run_args = jobs.RunRequest(workload=workload.name, scale=args.scale, data=args.data, recipe=args.recipe,
                               sets=list(args.set), device=args.device).common_argv()
    rows = scaling.run_study(workload.name, nprocs, args.runs, recipe.global_batch_size, out_dir, run_args,
                             fixed_global_batch=args.fixed_global_batch)
    mode = "fixed global batch" if args.fixed_global_batch else "fixed per-device batch"
    title = f"{workload.name} {args.scale}: {mode}, {args.runs} run(s) per point"
    paths = scaling.save(rows, out_dir, title)
    print(title)
    print(scaling.table_text(rows))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    from trainperf import suite

    names = suite.parse_only(args.only)
    out_dir = Path(args.out) if args.out else Path("runs") / f"suite-{args.scale}-{_stamp()}"
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % (2**31)
    print(f"suite: {len(names)} workload(s) at {args.scale} scale, {args.runs} run(s) each, first seed {seed}, "
          f"into {out_dir}", flush=True)
    rows = suite.run_suite(names, args.scale, args.runs, out_dir, seed, device=args.device,
                           data_root=Path(args.data) if args.data else None, system=args.system,
                           say=lambda line: print(line, flush=True), warn=_warn)
    for path in suite.write_report(out_dir, markdown=True):
        print(f"wrote {path}")
    print(suite.table_text(rows))
    if any(r.reason == suite.INTERRUPTED for r in rows):
        return 130
    return 0 if all(r.status == "ok" for r in rows) else 1


def cmd_predict(args: argparse.Namespace) -> int:
    from trainperf.files import write_json_atomic
    from trainperf.science import measure, predict

    workload = registry.get(args.workload)
    if args.scale != "full":
        raise TrainperfError("predict --scale mini: the reference convergence points are the full benchmark's; "
                             "use --scale full")
    if args.from_log:
        return _predict_logs(workload, Path(args.from_log), args.json)
    recipe = jobs.resolve_recipe(workload, "full", args.recipe, args.set)
    out_dir = Path(args.out or "runs") / f"predict-{workload.name}-{_stamp()}"
    result = measure.predict_here(workload, recipe, args.nproc, args.data, args.bench_batch, args.steps, args.warmup,
                                  args.device, args.samples_per_s, args.epochs, args.eval_s, args.bandwidth,
                                  args.latency, args.overlap, out_dir)
    print(predict.describe(result))
    if args.json:
        write_json_atomic(Path(args.json), result.to_dict())
        print(f"wrote {args.json}")
    return 0


def _predict_logs(workload: Any, path: Path, json_path: str | None) -> int:
    from dataclasses import asdict

    from trainperf.files import write_json_atomic
    from trainperf.science import predict

    files = sorted(path.glob("result_*.txt")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise TrainperfError(f"--from-log {path}: expected an MLPerf log or a folder of result_*.txt")
    checks = [predict.check_log(f, workload) for f in files]
    print(f"{'log':<14} {'batch':>6} {'measured':>10} {'predicted':>10} {'error':>7} {'own epochs':>10} "
          f"{'error':>7} {'samples/s':>12} {'eval s':>7} {'converged at':>12}")
    for c in checks:
        own = "-" if c.predicted_own_epochs_s is None else f"{c.predicted_own_epochs_s:.1f}"
        own_err = "-" if c.error_own_epochs is None else f"{c.error_own_epochs:+.1%}"
        print(f"{Path(c.file).name:<14} {c.global_batch:>6} {c.measured_s:>10.1f} {c.predicted_s:>10.1f} "
              f"{c.error:>+7.1%} {own:>10} {own_err:>7} {c.log_samples_per_s:>12,.0f} {c.log_eval_s:>7.2f} "
              f"{c.converged_at if c.converged_at is not None else '-':>12}"
              + ("" if c.converged else "  not converged: left out"))
    errors = [abs(c.error) for c in checks if c.converged]
    if not errors:
        raise TrainperfError(f"--from-log {path}: no converged run to compare with")
    print(f"{workload.name}: prediction from the RCP epochs and each log's own throughput; mean absolute error "
          f"{statistics.fmean(errors):.1%} over {len(errors)} converged run(s), largest {max(errors):.1%}")
    if json_path:
        write_json_atomic(Path(json_path), {"workload": workload.name, "checks": [asdict(c) for c in checks]})
        print(f"wrote {json_path}")
    return 0


def cmd_tune_batch(args: argparse.Namespace) -> int:
    from trainperf.science import tune

    workload = registry.get(args.workload)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    batches = tune.parse_batches(args.batch_sizes)
    jobs.check_switches(workload, recipe, args.device)
    data_dir = jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"tune-{workload.name}-{_stamp()}"
    if (out_dir / "tune.json").exists():
        raise TrainperfError(f"--out {out_dir}: already holds a batch-size study; choose another folder")
    rows = tune.tune(workload, recipe, args.scale, data_dir, batches, args.runs, args.lr_rule, out_dir, args.seed,
                     args.steps, args.warmup, args.device, say=lambda line: print(line, flush=True),
                     warmup_rule=args.warmup_rule)
    unit = "samples" if recipe.log_epoch_num == "samples" else "epochs"
    title = (f"{workload.name} {args.scale}: {args.lr_rule} LR rule, warmup kept in {args.warmup_rule}, from batch "
             f"{recipe.global_batch_size}; {args.runs} run(s) per batch")
    best, verdict = tune.recommend(rows)
    print(title)
    print(tune.table_text(rows, unit))
    print(verdict)
    details = {"workload": workload.name, "scale": args.scale, "lr_rule": args.lr_rule,
               "warmup_rule": args.warmup_rule, "base_batch":
               recipe.global_batch_size, "first_seed": args.seed, "recommended": best.batch if best else None,
               "verdict": verdict}
    print("wrote " + ", ".join(str(p) for p in tune.save(rows, out_dir, title, details, unit)))
    return 0


def cmd_allreduce(args: argparse.Namespace) -> int:
    from trainperf.runtime import distributed
    from trainperf.science import project

    placement = distributed.env_placement()
    if placement is not None and placement[2] > 1:  # one process of the probe's group
        project.probe_in_group(Path(args.json), device=args.device)
        return 0
    if args.nproc < 2:
        raise TrainperfError(f"--nproc {args.nproc}: the all-reduce probe needs at least 2 processes")
    out_dir = Path(args.json).parent if args.json else Path("runs") / f"allreduce-{_stamp()}"
    link = project.measure_link(args.nproc, out_dir, args.device)
    print(f"all-reduce between {args.nproc} local processes: bandwidth {link.bandwidth_gbs:.3f} GB/s, "
          f"latency {link.latency_us:.1f} µs (ring model fitted to 4 KiB-16 MiB; {out_dir / 'allreduce.json'})")
    return 0


def _project(args: argparse.Namespace) -> int:
    from trainperf.bench import scaling
    from trainperf.science import measure, project

    workload = registry.get(args.workload)
    devices = scaling.parse_nprocs(args.project)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    jobs.check_switches(workload, recipe, args.device)
    per_device = args.batch_size or recipe.global_batch_size
    out_dir = Path(args.out) if args.out else Path("runs") / f"project-{workload.name}-{_stamp()}"
    inputs, bench = measure.projection_inputs(workload, recipe, args.scale, args.data, per_device, args.bench_batch,
                                              args.steps, args.warmup, args.device, args.peak_tflops, args.mfu,
                                              args.epochs)
    link = measure.link(args.bandwidth, args.latency, max(devices), out_dir, args.device)
    rows = project.project(inputs, devices, link, args.overlap)
    title = (f"{workload.name} {args.scale}: projected from 1 device, per-device batch {per_device}, "
             f"{link.bandwidth_gbs:g} GB/s, {link.latency_us:g} µs, overlap {args.overlap:g}")
    print(title)
    print(f"  compute per step: {inputs.compute_s * 1e3:.2f} ms ({inputs.compute_source})")
    print(f"  gradients all-reduced per step: {bench.gradient_bytes / 2**20:,.1f} MiB ({bench.parameters:,} "
          f"parameters); link: {link.source}")
    print(project.table_text(rows))
    details = {"workload": workload.name, "scale": args.scale, "per_device_batch": per_device,
               "compute_s": inputs.compute_s, "compute_source": inputs.compute_source,
               "gradient_bytes": bench.gradient_bytes,
               "link": {"bandwidth_gbs": link.bandwidth_gbs, "latency_us": link.latency_us, "source": link.source},
               "overlap": args.overlap}
    print("wrote " + ", ".join(str(p) for p in project.save(rows, out_dir, title, details)))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from trainperf.files import write_json_atomic
    from trainperf.runtime import recsys

    workload = registry.get(args.workload)
    if not workload.model_parallel_sets:
        raise TrainperfError(f"plan {workload.name}: it has no model-parallel embedding tables to shard")
    if args.devices < 1 or (args.local_devices is not None and args.local_devices < 1):
        raise TrainperfError("--devices and --local-devices: expected numbers of devices >= 1")
    recipe = jobs.resolve_recipe(workload, "full", args.recipe, [*workload.model_parallel_sets, *args.set])
    local = args.local_devices or min(args.devices, 8)
    batch = (args.batch_size or recipe.global_batch_size) // args.devices
    if batch < 1:
        raise TrainperfError(f"--devices {args.devices}: more devices than samples in the global batch")
    device_bytes = recsys.parse_bytes(args.memory, "--memory")
    host_bytes = recsys.parse_bytes(args.host_memory, "--host-memory")
    result = recsys.plan_for(workload, recipe, args.devices, local, device_bytes, host_bytes, batch)
    print(f"{workload.name} {recipe.name}: {len(result['tables'])} tables on {args.devices} device(s) of "
          f"{recsys.size_text(device_bytes)} ({local} per node, {recsys.size_text(host_bytes)} of host memory "
          f"each), {batch} samples per device, TorchRec's planner")
    print(recsys.plan_table(result))
    if args.json:
        write_json_atomic(Path(args.json), result)
        print(f"wrote {args.json}")
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    from trainperf.runtime.slurm import sbatch_script

    workload = registry.get(args.workload)
    print(sbatch_script(workload.name, args.nodes, args.gpus_per_node, args.run_args, partition=args.partition,
                        account=args.account, time_limit=args.time, cpus_per_gpu=args.cpus_per_gpu,
                        port=args.port), end="")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from trainperf.results import scoring

    folders = scoring.find_benchmark_folders(Path(args.folder))
    all_valid = True
    for folder in folders:
        result = scoring.score_folder(folder, args.ruleset)
        all_valid &= result.valid
        table = Table(title=f"{result.system} / {result.benchmark}  (ruleset {result.ruleset})", title_justify="left")
        for column in ("run", "minutes", "converged", "epochs/samples to converge", "last quality"):
            table.add_column(column)
        for run in result.runs:
            table.add_row(Path(run.file).name, f"{run.minutes:.3f}" if run.minutes is not None else "-",
                          "yes" if run.converged else f"no ({run.reason})",
                          "-" if run.converge_point is None else f"{run.converge_point:g}",
                          scoring.quality_text(run.quality))
        console = Console(width=None if sys.stdout.isatty() else 120)
        console.print(table)
        score = f"{result.score:.3f} minutes" if result.score is not None else "none (invalid)"
        console.print(f"runs found {len(result.runs)}, converged {result.converged}; olympic score: {score}"
                      + (f"  [{result.note}]" if result.note else ""), highlight=False)
        console.print(f"RCP check: {result.rcp}\n", highlight=False)
    return 0 if all_valid else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from trainperf.results import scoring

    comparison = scoring.compare(Path(args.a), Path(args.b), args.ruleset)
    table = Table(title="time-to-train (minutes; olympic score, or the mean when there are too few runs)")
    for column in ("benchmark", f"A: {comparison.system_a}", f"B: {comparison.system_b}", "A / B"):
        table.add_column(column)
    for key, sa, sb, ratio in comparison.rows:
        table.add_row(key, f"{sa:.3f}" if sa else "invalid", f"{sb:.3f}" if sb else "invalid",
                      f"{ratio:.2f}x" if ratio else "-")
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    print("A / B above 1 means B trains faster.")
    for warning in comparison.warnings:
        print(f"warning: {warning}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trainperf.report import collect, render

    data = collect.collect([Path(p) for p in args.paths])
    out = Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise TrainperfError(f"-o {out}: expected an .html file name")
    for path in render.write(data, out, args.markdown):
        print(f"wrote {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from trainperf.bench import throughput
    from trainperf.files import write_json_atomic

    workload = registry.get(args.workload)
    sets = list(args.set)
    if args.batch_size is not None:
        sets.append(f"global_batch_size={args.batch_size}")
    if args.steps < 1 or args.warmup < 0:
        raise TrainperfError("--steps must be >= 1 and --warmup >= 0")
    if args.count_ops:
        return _count_ops(workload, args, sets)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, sets)
    jobs.check_switches(workload, recipe, args.device)
    data_dir = None
    if jobs.needs_data(args.synthetic, args.data):
        data_dir = jobs.prepared_data(workload, args.scale, args.data)
    if args.profile < 0:
        raise TrainperfError(f"--profile {args.profile}: expected a number of steps >= 0")
    result = throughput.run_bench(workload, recipe, args.scale, data_dir, args.synthetic, args.steps, args.warmup,
                                  args.device, profile_steps=args.profile)
    print(throughput.describe(result))
    if result.profile:
        from trainperf.bench import profile

        for key in ("by_device", "by_host"):
            if result.profile[key]:
                print(profile.table_text(result.profile, key))
    if args.json:
        write_json_atomic(Path(args.json), result.to_dict())
        print(f"wrote {args.json}")
    return 0


def _count_ops(workload: Any, args: argparse.Namespace, sets: list[str]) -> int:
    """`bench --count-ops`: what one training step asks of the host (operators, synchronisations, host
    data, host time), at full scale with the workload's CPU-sized probe settings unless overridden."""
    from trainperf.bench import stepcount
    from trainperf.files import write_json_atomic
    from trainperf.runtime import distributed
    from trainperf.spec import Assets

    probe = list(workload.step_probe) if args.scale == "full" else []
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, [*probe, *sets])
    jobs.check_switches(workload, recipe, args.device)
    data_dir = jobs.prepared_data(workload, args.scale, args.data) if args.data or args.scale == "mini" else None
    ctx = distributed.init_from_env(args.device)
    try:
        counts = stepcount.count_step(workload, recipe, ctx, Assets(workload.assets(recipe, data_dir)),
                                      [*probe, *sets], warmup=args.warmup, steps=args.steps,
                                      timed_steps=args.steps)
    finally:
        distributed.shutdown()
    print(f"{workload.name} {args.scale} on {counts.device}, one training step (eager), settings: "
          + (" ".join(counts.overrides) or "the recipe's"))
    print(stepcount.table_text([counts]))
    print("most dispatched: " + ", ".join(f"{name} {n:g}" for name, n in counts.top_ops))
    for site, n in counts.sites.items():
        print(f"  {n:g} x {site}")
    if args.json:
        write_json_atomic(Path(args.json), counts.to_dict())
        print(f"wrote {args.json}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from trainperf.bench import ablate

    workload = registry.get(args.workload)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    data_dir = None
    if jobs.needs_data(args.synthetic, args.data) or args.check_quality:
        data_dir = jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"ablate-{workload.name}-{_stamp()}"
    if args.reps < 1:
        raise TrainperfError(f"--reps {args.reps}: expected >= 1")
    rows = ablate.run_ablation(workload, recipe, args.scale, data_dir, args.synthetic, args.steps, args.warmup,
                               args.device, args.check_quality, args.reps)
    kind = "synthetic" if args.synthetic else "real"
    title = f"{workload.name} {args.scale}: throughput per speedup switch ({kind} data)"
    print(title)
    print(ablate.table_text(rows))
    print("wrote " + ", ".join(str(p) for p in ablate.save(rows, out_dir, title)))
    return 0


def _add_switches(p: argparse.ArgumentParser) -> None:
    """The speedup switches (speedups.SWITCHES), each a recipe override recorded with every result."""
    from trainperf.runtime.speedups import SWITCHES

    g = p.add_argument_group("speedups (override the recipe; see README)")
    for switch in SWITCHES:
        if switch.choices:
            g.add_argument(switch.flag, dest=switch.name, choices=switch.choices, help=switch.help)
        else:
            g.add_argument(switch.flag, dest=switch.name, action=argparse.BooleanOptionalAction, default=None,
                           help=switch.help)


def _switch_sets(args: argparse.Namespace) -> list[str]:
    from trainperf.runtime.speedups import SWITCHES

    sets = []
    for switch in SWITCHES:
        value = getattr(args, switch.name, None)
        if value is not None:
            sets.append(f"{switch.name}={str(value).lower()}")
    return sets


def _add_workload_options(p: argparse.ArgumentParser, with_switches: bool = True) -> None:
    """What selects a workload's run: shared by run, scale, bench and ablate."""
    p.add_argument("workload")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--data", metavar="DIR", help="dataset root (default for mini: the cache folder)")
    p.add_argument("--recipe", metavar="NAME", help="a named recipe of the scale (default: the first)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field (repeatable)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present)")
    if with_switches:
        _add_switches(p)


def _add_link_options(p: Any) -> None:
    p.add_argument("--bandwidth", type=float, metavar="GB/S", help="all-reduce bus bandwidth per device "
                   "(default: measured between local processes)")
    p.add_argument("--latency", type=float, metavar="US", help="per-hop latency in microseconds")
    p.add_argument("--overlap", type=float, default=1.0,
                   help="fraction of backward that hides the all-reduce (default: 1, as DDP's buckets allow)")


def _stamp() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


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
    p.add_argument("--verify", action="store_true",
                   help="read every sample once in parallel processes; list the unreadable ones (then skipped)")
    p.add_argument("--workers", type=int, help="processes for --verify (default: one per CPU)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("run", help="train a workload to its target under the MLPerf clock")
    _add_workload_options(p)
    p.add_argument("--seed", type=int, help="random seed (default: drawn at random and recorded)")
    p.add_argument("--out", metavar="DIR", help="run folder (default: runs/<workload>-<UTC time>/)")
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes to start on this machine (torch elastic launcher)")
    p.add_argument("--division", choices=("closed", "open"),
                   help="submission_division (default: closed for full, open for mini)")
    p.add_argument("--org", default="trainperf", help="submission_org to log")
    p.add_argument("--status", default="onprem", choices=("onprem", "cloud", "preview", "research"),
                   help="submission_status to log (default: onprem)")
    p.add_argument("--runs", type=int, nargs="?", const=0, metavar="N",
                   help="N runs (seeds SEED..SEED+N-1) in the MLPerf submission layout; "
                        "without N: the benchmark's MLPerf run count")
    p.add_argument("--system", help="system name for the submission layout (default: from the machine)")
    p.add_argument("--clear-caches", action="store_true", help="drop the OS page cache first (needs root)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("scale", help="scaling study: time-to-train, speedup and efficiency from 1 to N processes")
    _add_workload_options(p)
    p.add_argument("--nproc", default="1,2", metavar="N,N,...", help="process counts (default: 1,2)")
    p.add_argument("--runs", type=int, default=1, help="runs per process count; the median is reported")
    p.add_argument("--fixed-global-batch", action="store_true",
                   help="keep the recipe's global batch at every size (default: keep the per-device batch)")
    p.add_argument("--out", metavar="DIR", help="study folder (default: runs/scale-<workload>-<UTC time>/)")
    g = p.add_argument_group("projection (no runs: one device's bench and a ring all-reduce model)")
    g.add_argument("--project", metavar="N,N,...", help="project time-to-train on these device counts")
    g.add_argument("--batch-size", type=int, help="per-device batch (default: the recipe's global batch)")
    g.add_argument("--bench-batch", type=int, help="batch of the one-device bench (default: the per-device batch)")
    _add_link_options(g)
    g.add_argument("--peak-tflops", type=float, help="project another device: its peak TFLOP/s (with --mfu)")
    g.add_argument("--mfu", type=float, help="the fraction of --peak-tflops the model reaches")
    g.add_argument("--epochs", type=float, help="epochs to converge where the ruleset has no RCP")
    g.add_argument("--steps", type=int, default=10, help="timed bench steps (default: 10)")
    g.add_argument("--warmup", type=int, default=3, help="untimed bench steps (default: 3)")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("predict", help="predicted full-scale time-to-train: RCP epochs x measured time per epoch")
    _add_workload_options(p)
    p.set_defaults(scale="full")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel devices (default: 1)")
    p.add_argument("--bench-batch", type=int, help="batch of the bench (default: global batch / nproc)")
    p.add_argument("--samples-per-s", type=float, help="a known per-device throughput instead of a bench")
    p.add_argument("--epochs", type=float, help="epochs to converge (default: the RCP files of the ruleset)")
    p.add_argument("--eval-s", type=float, help="seconds per evaluation (default: estimated from the throughput)")
    _add_link_options(p)
    p.add_argument("--steps", type=int, default=10, help="timed bench steps (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed bench steps (default: 3)")
    p.add_argument("--from-log", metavar="PATH", help="check the prediction on published logs (a result_*.txt "
                                                      "or a folder of them): their throughput, RCP epochs")
    p.add_argument("--out", metavar="DIR", help="folder for the all-reduce probe (default: runs/)")
    p.add_argument("--json", metavar="FILE", help="also write the prediction as JSON")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("tune-batch", help="batch-size tuner: throughput and epochs to target per global batch")
    _add_workload_options(p, with_switches=False)
    p.add_argument("--batch-sizes", required=True, metavar="B,B,...", help="global batch sizes, e.g. 64,128,256")
    p.add_argument("--runs", type=int, default=3, help="runs to target per batch size (median; default: 3)")
    p.add_argument("--lr-rule", choices=("linear", "sqrt", "none"), default="linear",
                   help="learning rate x batch/base (linear) or x sqrt(batch/base); step-counted decay points "
                        "x base/batch (default: linear)")
    p.add_argument("--warmup-rule", choices=("steps", "samples"), default="steps",
                   help="the warmup keeps its optimizer steps (its epochs grow with the batch; default) or its "
                        "samples (epochs fixed, Goyal et al.)")
    p.add_argument("--seed", type=int, default=0, help="first seed; run k uses SEED+k at every batch (default: 0)")
    p.add_argument("--steps", type=int, default=20, help="timed bench steps per batch size (default: 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed bench steps (default: 5)")
    p.add_argument("--out", metavar="DIR", help="study folder (default: runs/tune-<workload>-<UTC time>/)")
    p.set_defaults(func=cmd_tune_batch)

    p = sub.add_parser("allreduce", help="all-reduce bandwidth and latency between N local processes")
    p.add_argument("--nproc", type=int, default=2, help="processes (default: 2)")
    p.add_argument("--device", help="cpu (gloo) or cuda (NCCL; default: cuda when present)")
    p.add_argument("--json", metavar="FILE", help="where the measurement is written")
    p.set_defaults(func=cmd_allreduce)

    for name, func, help_text in (
        ("bench", cmd_bench, "throughput mode: samples/s, step times, memory, FLOPs per sample and MFU"),
        ("ablate", cmd_ablate, "throughput of each speedup switch, cumulative and alone, against all-off"),
    ):
        p = sub.add_parser(name, help=help_text)
        _add_workload_options(p, with_switches=name == "bench")
        p.add_argument("--synthetic", action="store_true", help="device-resident random batches (no data loading)")
        p.add_argument("--steps", type=int, default=50, help="timed steps (default: 50)")
        p.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps (default: 10)")
        if name == "bench":
            p.add_argument("--batch-size", type=int, help="global batch size (default: the recipe's)")
            p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
            p.add_argument("--profile", type=int, default=0, metavar="N",
                           help="also profile N steps after the timed ones (torch.profiler): the top operators by "
                                "device and by host time")
            p.add_argument("--count-ops", action="store_true",
                           help="count what one training step asks of the host instead: operators, host-device "
                                "synchronisations (and where), tensors built from host data, host time (--scale "
                                "full: the workload's CPU-sized probe settings, then --set)")
        else:
            p.add_argument("--check-quality", action="store_true",
                           help="also run the mini time-to-train of each configuration")
            p.add_argument("--out", metavar="DIR", help="folder for ablation.csv/.json/.png")
            p.add_argument("--reps", type=int, default=3, help="measurements per configuration (median; default 3)")
        p.set_defaults(func=func)

    p = sub.add_parser("suite", help="a whole round: every workload's runs, one results folder, one report")
    p.add_argument("--only", metavar="A,B", help="these workloads only (default: every registered one)")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--runs", type=int, default=1, help="runs per workload (default: 1)")
    p.add_argument("--seed", type=int, help="first seed of each series (default: drawn at random and recorded)")
    p.add_argument("--data", metavar="ROOT", help="datasets as ROOT/<workload> (default for mini: the cache)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--system", help="system name for the results layout (default: from the machine)")
    p.add_argument("--out", metavar="DIR", help="suite folder (default: runs/suite-<scale>-<UTC time>/)")
    p.set_defaults(func=cmd_suite)

    p = sub.add_parser("plan", help="how TorchRec would shard a workload's embedding tables on N devices (DLRM; "
                                    "no data, no devices needed)")
    p.add_argument("workload", help="a workload with model-parallel embedding tables (dlrm)")
    p.add_argument("--devices", type=int, required=True, help="GPUs in all")
    p.add_argument("--local-devices", type=int, help="GPUs per node (default: up to 8)")
    p.add_argument("--memory", default="80GB", help="memory of each GPU (default: 80GB)")
    p.add_argument("--host-memory", default="256GB",
                   help="host memory per GPU, for tables kept there behind a GPU cache (default: 256GB)")
    p.add_argument("--batch-size", type=int, help="global batch (default: the recipe's)")
    p.add_argument("--recipe", metavar="NAME", help="a named full recipe (default: the first)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("slurm", help="print an sbatch script: one torchrun per node, c10d rendezvous")
    p.add_argument("workload")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--time", default="04:00:00", help="Slurm time limit (default: 04:00:00)")
    p.add_argument("--cpus-per-gpu", type=int, default=8)
    p.add_argument("--port", type=int, default=29500, help="rendezvous port on the first node")
    p.set_defaults(func=cmd_slurm, takes_run_args=True)
    p.epilog = "Arguments after -- are passed to `trainperf run WORKLOAD` on every node, safely quoted."

    p = sub.add_parser("score", help="olympic score of MLPerf result folders (trainperf's or published ones)")
    p.add_argument("folder")
    p.add_argument("--ruleset", help="checker ruleset (default: the one that knows each benchmark)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("compare", help="scores of two result folders side by side, with the ratio")
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument("--ruleset")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("report", help="HTML (and Markdown) report over runs, result folders and scaling studies")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--markdown", action="store_true", help="also write a Markdown version and its PNGs beside it")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("make-minigo-target", help="train the mini MiniGo's target model (shipped in the package)")
    p.add_argument("--generations", type=int, help="self-play generations (default: the shipped target's)")
    p.add_argument("--seed", type=int, help="random seed (default: the shipped target's)")
    p.add_argument("--out", metavar="DIR", help="folder for target.pt and target.json (default: the package's)")
    p.set_defaults(func=cmd_make_minigo_target)

    p = sub.add_parser("make-phase1", help="train the mini BERT's phase-1 checkpoint (shipped in the package)")
    p.add_argument("--steps", type=int, default=6000, help="phase-1 training steps (default: 6000)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1, the shipped checkpoint's)")
    p.add_argument("--out", metavar="DIR", help="folder for vocab.txt, phase1.pt, phase1.json (default: the package's)")
    p.set_defaults(func=cmd_make_phase1)

    p = sub.add_parser("check", help="run the official MLPerf compliance checker on a log")
    p.add_argument("log")
    p.add_argument("--ruleset", help="checker ruleset (default: the one that knows the log's benchmark)")
    p.add_argument("--verbose", action="store_true", help="print the checker's whole output")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
        args.set = list(args.set) + _switch_sets(args)
    try:
        return int(args.func(args))
    except TrainperfError as exc:
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainperf: interrupted", file=sys.stderr)
        return 130
