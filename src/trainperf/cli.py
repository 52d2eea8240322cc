"""The `trainperf` command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainperf import __version__, registry
from trainperf.errors import TrainperfError
from trainperf.spec import SCALES, Recipe, Workload


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
    from trainperf.paths import default_run_dir
    from trainperf.results import run_folder
    from trainperf.runtime import distributed

    workload = registry.get(args.workload)
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(args.set or [])
    data_dir = _data_dir(workload, args.scale, args.data)
    # Everything the user typed is checked before anything is written.
    problems = workload.data_problems(args.scale, data_dir)
    if problems and args.scale == "full":
        raise TrainperfError(problems[0])
    placement = distributed.env_placement()
    in_group = placement is not None and placement[2] > 1
    if args.nproc < 1:
        raise TrainperfError(f"--nproc {args.nproc}: expected a number of processes >= 1")
    if in_group and (args.nproc > 1 or args.runs is not None):
        raise TrainperfError("--nproc/--runs: this process was already started by a launcher (torchrun/srun)")
    if args.nproc > 1 and recipe.global_batch_size % args.nproc:
        raise TrainperfError(f"--nproc {args.nproc}: global_batch_size {recipe.global_batch_size} "
                             "is not divisible by the number of processes")
    _check_switches(workload, recipe, args.device, placement[2] if in_group else args.nproc)
    out_dir = Path(args.out) if args.out else default_run_dir(workload.name)
    is_main = placement is None or placement[0] == 0
    if is_main and args.runs is None:
        run_folder.check_free(out_dir)
    if problems and not in_group:
        workload.prepare(args.scale, data_dir, print)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % (2**31)
    if args.runs is not None:
        return _run_series(args, workload, data_dir, out_dir, seed)
    result = _execute(args, workload, recipe, data_dir, out_dir, seed, in_group)
    if result is None:
        return 0  # a rank other than 0: rank 0 reports
    if not in_group:
        _print_summary(workload, args.scale, result, out_dir)
    elif result["status"] != "success":
        print(f"trainperf: run aborted: {result['abort_reason']}", file=sys.stderr)
    return 0 if result["status"] == "success" else 1


def _check_switches(workload: Workload, recipe: Recipe, device: str | None, world_size: int) -> None:
    """An unsupported speedup is a one-line error before any run folder is written (the harness
    checks again, on the device each process really gets)."""
    import torch

    from trainperf.runtime import speedups

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    speedups.check_supported(workload, recipe, torch.device(device), world_size)


def _execute(args: argparse.Namespace, workload: Workload, recipe: Recipe, data_dir: Path, out_dir: Path,
             seed: int, in_group: bool = False) -> dict | None:
    """One run into `out_dir`, in this process or on --nproc processes; rank 0's result (else None)."""
    from trainperf.harness import RunConfig, run
    from trainperf.harness.progress import make_progress
    from trainperf.results import run_folder
    from trainperf.runtime import distributed

    if args.nproc > 1:
        # Every process gets the same run folder and seed; rank 0 writes the log and result.
        code = distributed.launch_local(args.nproc, _passthrough_argv(args, out_dir, seed))
        return run_folder.load_launched(out_dir, code)
    ctx = distributed.init_from_env(args.device)
    seed = distributed.agree_seed(ctx, seed)
    try:
        log_path = run_folder.claim(out_dir) if ctx.is_main else None
        config = RunConfig(workload=workload, recipe=recipe, scale=args.scale, data_dir=data_dir, seed=seed,
                           log_path=log_path, division=_division(args), org=args.org, status=args.status,
                           clear_caches=args.clear_caches,
                           extra_env={"command": shlex.join(["trainperf", *getattr(args, "argv", [])])})
        # Saved inside the harness's signal guard: a SIGTERM from the launcher cannot come between
        # run_stop and the result file.
        save = (lambda res: run_folder.save(out_dir, res)) if ctx.is_main else None
        result = run(config, ctx, make_progress(args.quiet), on_result=save)
    finally:
        distributed.shutdown()
    if not ctx.is_main:
        if result.status != "success":
            raise SystemExit(1)
        return None
    return result.to_dict()


def _division(args: argparse.Namespace) -> str:
    return args.division or ("closed" if args.scale == "full" else "open")


def _run_series(args: argparse.Namespace, workload: Workload, data_dir: Path, out_dir: Path, seed: int) -> int:
    """N runs with distinct recorded seeds, in the MLPerf submission layout."""
    import shutil

    from trainperf.results import submission
    from trainperf.runtime.context import RuntimeContext

    count = args.runs if args.runs > 0 else workload.mlperf_runs
    device = RuntimeContext.create(args.device).device
    world = args.nproc if device.type == "cuda" else 1
    system = args.system or submission.default_system_name(device, world)
    logs_dir, system_json, details_dir = submission.layout_paths(out_dir, system, workload.benchmark)
    if logs_dir.exists() and any(logs_dir.glob("result_*.txt")):
        raise TrainperfError(f"--out {out_dir}: {logs_dir} already holds results; choose another folder")
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(args.set or [])
    logs_dir.mkdir(parents=True, exist_ok=True)
    submission.write_system(system_json, submission.system_description(
        system, args.org, _division(args), args.status, device, world))
    print(f"{count} runs of {workload.name} {args.scale} into {out_dir} (system {system})")
    finished = 0
    for i in range(count):
        run_dir = details_dir / f"run_{i}"
        try:
            result = _execute(args, workload, recipe, data_dir, run_dir, seed + i)
        except TrainperfError as exc:
            result, why = None, str(exc)
        else:
            why = "no result (see the messages above)"
        if result is None:
            print(f"run {i}: {why}; the series stops", file=sys.stderr)
            break
        reason = result.get("abort_reason") or ""
        if reason.startswith(("received SIG", "interrupted")):
            print(f"run {i}: interrupted; the {finished} finished run(s) are kept", file=sys.stderr)
            return 130
        shutil.copyfile(run_dir / "mlperf_log.txt", logs_dir / f".result_{i}.txt.tmp")
        os.replace(logs_dir / f".result_{i}.txt.tmp", logs_dir / f"result_{i}.txt")
        finished += 1
        ttt = f"{result['time_to_train_s']:.2f} s" if result["time_to_train_s"] is not None else "-"
        print(f"run {i} (seed {seed + i}): {result['status']} in {ttt}")
    print(f"results: {logs_dir}\nsystem description: {system_json}\nscore it: trainperf score {out_dir}")
    return 0 if finished == count else 1


def _passthrough_argv(args: argparse.Namespace, out_dir: Path, seed: int) -> list[str]:
    argv = ["run", args.workload, "--scale", args.scale, "--out", str(out_dir), "--seed", str(seed),
            "--org", args.org, "--status", args.status]
    for flag, value in (("--data", args.data), ("--recipe", args.recipe), ("--device", args.device),
                        ("--division", args.division)):
        if value is not None:
            argv += [flag, str(value)]
    for item in args.set or []:
        argv += ["--set", item]
    argv += [flag for flag, on in (("--clear-caches", args.clear_caches), ("--quiet", args.quiet)) if on]
    return argv


def _print_summary(workload: Workload, scale: str, result: dict, out_dir: Path) -> None:
    ttt = f"{result['time_to_train_s']:.2f} s" if result["time_to_train_s"] is not None else "-"
    if result["status"] == "success":
        detail = f"{result['epochs_to_target']} epochs, {workload.metric.name} {result['final_metric']:.4f}"
    else:
        detail = result["abort_reason"]
    procs = result["environment"].get("world_size", 1)
    print(f"{workload.name} {scale}: {result['status']} in {ttt} ({detail})"
          + (f" on {procs} processes" if procs > 1 else ""))
    print(f"log: {out_dir / 'mlperf_log.txt'}\nresult: {out_dir / 'result.json'}")


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

    workload = registry.get(args.workload)
    nprocs = scaling.parse_nprocs(args.nproc)
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(args.set or [])
    if args.runs < 1:
        raise TrainperfError(f"--runs {args.runs}: expected >= 1")
    _prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"scale-{workload.name}-{_stamp()}"
    if (out_dir / "scaling.json").exists():
        raise TrainperfError(f"--out {out_dir}: already holds a scaling study; choose another folder")
    run_args = ["--scale", args.scale]
    for flag, value in (("--data", args.data), ("--recipe", args.recipe), ("--device", args.device)):
        if value is not None:
            run_args += [flag, value]
    for item in args.set or []:
        run_args += ["--set", item]
    rows = scaling.run_study(workload.name, nprocs, args.runs, recipe.global_batch_size, out_dir, run_args,
                             fixed_global_batch=args.fixed_global_batch)
    mode = "fixed global batch" if args.fixed_global_batch else "fixed per-device batch"
    title = f"{workload.name} {args.scale}: {mode}, {args.runs} run(s) per point"
    paths = scaling.save(rows, out_dir, title)
    print(title)
    print(scaling.table_text(rows))
    print("wrote " + ", ".join(str(p) for p in paths))
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
        for column in ("run", "minutes", "converged", "epochs/samples to converge"):
            table.add_column(column)
        for run in result.runs:
            table.add_row(Path(run.file).name, f"{run.minutes:.3f}" if run.minutes is not None else "-",
                          "yes" if run.converged else f"no ({run.reason})",
                          "-" if run.converge_point is None else f"{run.converge_point:g}")
        console = Console(width=None if sys.stdout.isatty() else 120)
        console.print(table)
        score = f"{result.score:.3f} minutes" if result.score is not None else "none (invalid)"
        console.print(f"runs found {len(result.runs)}, converged {result.converged}; olympic score: {score}"
                      + (f"  [{result.note}]" if result.note else ""), highlight=False)
        console.print(f"RCP check: {result.rcp}\n", highlight=False)
    return 0 if all_valid else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from trainperf.results import scoring

    def scores(root: str) -> dict[str, scoring.BenchmarkScore]:
        found: dict[str, scoring.BenchmarkScore] = {}
        for folder in scoring.find_benchmark_folders(Path(root)):
            result = scoring.score_folder(folder, args.ruleset, rcp=False)
            found.setdefault(result.benchmark, result)
        return found

    a, b = scores(args.a), scores(args.b)
    common = [k for k in a if k in b]
    if not common:
        raise TrainperfError(f"{args.a} and {args.b} have no benchmark in common "
                             f"({', '.join(a) or 'none'} vs {', '.join(b) or 'none'})")
    table = Table(title="time-to-train (minutes; olympic score, or the mean when there are too few runs)")
    for column in ("benchmark", f"A: {a[common[0]].system}", f"B: {b[common[0]].system}", "A / B"):
        table.add_column(column)
    for key in common:
        sa, sb = a[key].score or a[key].mean, b[key].score or b[key].mean
        ratio = f"{sa / sb:.2f}x" if sa and sb else "-"
        table.add_row(key, f"{sa:.3f}" if sa else "invalid", f"{sb:.3f}" if sb else "invalid", ratio)
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    print("A / B above 1 means B trains faster.")
    for key in common:
        if a[key].eval_samples != b[key].eval_samples:
            print(f"warning: {key}: the two were evaluated on different datasets (eval_samples "
                  f"{a[key].eval_samples} vs {b[key].eval_samples}, e.g. full vs mini): not comparable")
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


def _prepared_data(workload: Workload, scale: str, data: str | None) -> Path:
    data_dir = _data_dir(workload, scale, data)
    problems = workload.data_problems(scale, data_dir)
    if problems and scale == "full":
        raise TrainperfError(problems[0])
    if problems:
        workload.prepare(scale, data_dir, print)
    return data_dir


def cmd_bench(args: argparse.Namespace) -> int:
    from trainperf.bench import throughput
    from trainperf.results.files import write_json_atomic

    workload = registry.get(args.workload)
    sets = list(args.set or [])
    if args.batch_size is not None:
        sets.append(f"global_batch_size={args.batch_size}")
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(sets)
    if args.steps < 1 or args.warmup < 0:
        raise TrainperfError("--steps must be >= 1 and --warmup >= 0")
    data_dir = None
    if not args.synthetic or workload.needs_data_to_build:
        data_dir = _prepared_data(workload, args.scale, args.data)
    result = throughput.run_bench(workload, recipe, args.scale, data_dir, args.synthetic, args.steps, args.warmup,
                                  args.device)
    print(throughput.describe(result))
    if args.json:
        write_json_atomic(Path(args.json), result.to_dict())
        print(f"wrote {args.json}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from trainperf.bench import ablate

    workload = registry.get(args.workload)
    recipe = workload.recipe(args.scale, args.recipe).with_overrides(args.set or [])
    data_dir = None
    if not args.synthetic or args.check_quality or workload.needs_data_to_build:
        data_dir = _prepared_data(workload, args.scale, args.data)
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
    """The speedup switches, each a recipe override (recorded with every result)."""
    g = p.add_argument_group("speedups (override the recipe; see README)")
    g.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="autocast precision (fp16 adds loss scaling)")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="NHWC memory layout for convolutions")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (warmed up on synthetic batches before run_start)")
    g.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the model's forward/backward as CUDA Graphs and replay them (GPU only)")
    g.add_argument("--fused-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="torch's fused optimizer kernels where they exist")
    g.add_argument("--async-eval", action=argparse.BooleanOptionalAction, default=None,
                   help="score evaluations in a background thread while training continues")


def _switch_sets(args: argparse.Namespace) -> list[str]:
    sets = []
    if getattr(args, "precision", None):
        sets.append(f"precision={args.precision}")
    for name in ("channels_last", "compile", "cuda_graphs", "fused_optimizer", "async_eval"):
        value = getattr(args, name, None)
        if value is not None:
            sets.append(f"{name}={'true' if value else 'false'}")
    return sets


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
    _add_switches(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("scale", help="scaling study: time-to-train, speedup and efficiency from 1 to N processes")
    p.add_argument("workload")
    p.add_argument("--nproc", default="1,2", metavar="N,N,...", help="process counts (default: 1,2)")
    p.add_argument("--runs", type=int, default=1, help="runs per process count; the median is reported")
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--data", metavar="DIR")
    p.add_argument("--recipe", metavar="NAME")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--device")
    p.add_argument("--fixed-global-batch", action="store_true",
                   help="keep the recipe's global batch at every size (default: keep the per-device batch)")
    p.add_argument("--out", metavar="DIR", help="study folder (default: runs/scale-<workload>-<UTC time>/)")
    _add_switches(p)
    p.set_defaults(func=cmd_scale)

    for name, func, help_text in (
        ("bench", cmd_bench, "throughput mode: samples/s, step times, memory, FLOPs per sample and MFU"),
        ("ablate", cmd_ablate, "throughput of each speedup switch, cumulative and alone, against all-off"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("workload")
        p.add_argument("--scale", choices=SCALES, default="mini")
        p.add_argument("--data", metavar="DIR")
        p.add_argument("--recipe", metavar="NAME")
        p.add_argument("--set", action="append", metavar="KEY=VALUE")
        p.add_argument("--device")
        p.add_argument("--synthetic", action="store_true", help="device-resident random batches (no data loading)")
        p.add_argument("--steps", type=int, default=50, help="timed steps (default: 50)")
        p.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps (default: 10)")
        if name == "bench":
            p.add_argument("--batch-size", type=int, help="global batch size (default: the recipe's)")
            p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
            _add_switches(p)
        else:
            p.add_argument("--check-quality", action="store_true",
                           help="also run the mini time-to-train of each configuration")
            p.add_argument("--out", metavar="DIR", help="folder for ablation.csv/.json/.png")
            p.add_argument("--reps", type=int, default=3, help="measurements per configuration (median; default 3)")
        p.set_defaults(func=func)

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
        args.set = (args.set or []) + _switch_sets(args)
    try:
        return int(args.func(args))
    except TrainperfError as exc:
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainperf: interrupted", file=sys.stderr)
        return 130
