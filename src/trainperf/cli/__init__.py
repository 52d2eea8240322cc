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
from trainperf.cli.options import (
    add_link_options,
    add_scale,
    add_workload,
    add_workload_options,
    non_negative_float,
    non_negative_int,
    output_dir,
    output_file,
    positive_float,
    positive_int,
    ruleset_name,
    seed_int,
    share,
    switch_sets,
    system_name,
)
from trainperf.cli.perf import (
    cmd_ablate,
    cmd_allreduce,
    cmd_bench,
    cmd_plan,
    cmd_predict,
    cmd_slurm,
    cmd_tune_batch,
)
from trainperf.cli.runs import (
    cmd_check,
    cmd_compare,
    cmd_list,
    cmd_make_minigo_target,
    cmd_make_phase1,
    cmd_prepare,
    cmd_report,
    cmd_run,
    cmd_scale,
    cmd_score,
    cmd_suite,
)
from trainperf.errors import Interrupted, TrainperfError
from trainperf.jobs import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from trainperf.runtime.distributed import env_placement
from trainperf.signals import hung_up

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainperf", description="Time-to-train benchmarks by MLPerf rules.")
    parser.add_argument("--version", action="version", version=f"trainperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", help="workloads, their metric and targets, and whether data is ready")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("prepare", help="generate the mini dataset, or verify a full dataset")
    add_workload(p)
    add_scale(p)
    p.add_argument("--data", metavar="DIR", help="dataset root (default for mini: the cache folder)")
    p.add_argument("--verify", action="store_true",
                   help="read every sample once in parallel processes; list the unreadable ones (then skipped)")
    p.add_argument("--workers", type=positive_int, help="processes for --verify (default: one per CPU)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("run", help="train a workload to its target under the MLPerf clock")
    add_workload_options(p)
    p.add_argument("--seed", type=seed_int, help="random seed (default: drawn at random and recorded)")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="run folder (default: runs/<workload>-<UTC time>/)")
    p.add_argument("--nproc", type=positive_int, default=1,
                   help="data-parallel processes to start on this machine (torch elastic launcher)")
    p.add_argument("--division", choices=("closed", "open"),
                   help="submission_division (default: closed for full, open for mini)")
    p.add_argument("--org", default="trainperf", help="submission_org to log")
    p.add_argument("--status", default="onprem", choices=("onprem", "cloud", "preview", "research"),
                   help="submission_status to log (default: onprem)")
    p.add_argument("--runs", type=positive_int, nargs="?", const=0, metavar="N",
                   help="N runs (seeds SEED..SEED+N-1) in the MLPerf submission layout; "
                        "without N: the benchmark's MLPerf run count")
    p.add_argument("--system", type=system_name,
                   help="system name for the submission layout (default: from the machine)")
    p.add_argument("--resume", action="store_true",
                   help="with --runs, into a folder that holds an interrupted series: keep its finished runs "
                        "and redo the others (same seeds)")
    p.add_argument("--clear-caches", action="store_true", help="drop the OS page cache first (needs root)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("scale", help="scaling study: time-to-train, speedup and efficiency from 1 to N processes")
    add_workload_options(p)
    p.add_argument("--nproc", default="1,2", metavar="N,N,...", help="process counts (default: 1,2)")
    p.add_argument("--runs", type=positive_int, default=1, help="runs per process count; the median is reported")
    p.add_argument("--fixed-global-batch", action="store_true",
                   help="keep the recipe's global batch at every size (default: keep the per-device batch)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="study folder (default: runs/scale-<workload>-<UTC time>/)")
    g = p.add_argument_group("projection (no runs: one device's bench and a ring all-reduce model)")
    g.add_argument("--project", metavar="N,N,...", help="project time-to-train on these device counts")
    g.add_argument("--batch-size", type=positive_int, help="per-device batch (default: the recipe's global batch)")
    g.add_argument("--bench-batch", type=positive_int,
                   help="batch of the one-device bench (default: the per-device batch)")
    add_link_options(g)
    g.add_argument("--peak-tflops", type=positive_float, help="project another device: its peak TFLOP/s (with --mfu)")
    g.add_argument("--mfu", type=share, help="the fraction of --peak-tflops the model reaches")
    g.add_argument("--epochs", type=positive_float, help="epochs to converge where the ruleset has no RCP")
    g.add_argument("--steps", type=positive_int, default=10, help="timed bench steps (default: 10)")
    g.add_argument("--warmup", type=non_negative_int, default=3, help="untimed bench steps (default: 3)")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("predict", help="predicted full-scale time-to-train: RCP epochs x measured time per epoch")
    add_workload_options(p)
    p.set_defaults(scale="full")
    p.add_argument("--nproc", type=positive_int, default=1, help="data-parallel devices (default: 1)")
    p.add_argument("--bench-batch", type=positive_int, help="batch of the bench (default: global batch / nproc)")
    p.add_argument("--samples-per-s", type=positive_float, help="a known per-device throughput instead of a bench")
    p.add_argument("--epochs", type=positive_float,
                   help="epochs to converge (default: the RCP files of the ruleset)")
    p.add_argument("--eval-s", type=non_negative_float,
                   help="seconds per evaluation (default: estimated from the throughput)")
    add_link_options(p)
    p.add_argument("--steps", type=positive_int, default=10, help="timed bench steps (default: 10)")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed bench steps (default: 3)")
    p.add_argument("--from-log", metavar="PATH", help="check the prediction on published logs (a result_*.txt "
                                                      "or a folder of them): their throughput, RCP epochs")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="folder for the all-reduce probe (default: runs/)")
    p.add_argument("--json", metavar="FILE", type=output_file, help="also write the prediction as JSON")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("tune-batch", help="batch-size tuner: throughput and epochs to target per global batch")
    add_workload_options(p, with_switches=False)
    p.add_argument("--batch-sizes", required=True, metavar="B,B,...", help="global batch sizes, e.g. 64,128,256")
    p.add_argument("--runs", type=positive_int, default=3, help="runs to target per batch size (median; default: 3)")
    p.add_argument("--lr-rule", choices=("linear", "sqrt", "none"), default="linear",
                   help="learning rate x batch/base (linear) or x sqrt(batch/base); step-counted decay points "
                        "x base/batch (default: linear)")
    p.add_argument("--warmup-rule", choices=("steps", "samples"), default="steps",
                   help="the warmup keeps its optimizer steps (its epochs grow with the batch; default) or its "
                        "samples (epochs fixed, Goyal et al.)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="first seed; run k uses SEED+k at every batch (default: 0)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed bench steps per batch size (default: 20)")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed bench steps (default: 5)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="study folder (default: runs/tune-<workload>-<UTC time>/)")
    p.set_defaults(func=cmd_tune_batch)

    p = sub.add_parser("allreduce", help="all-reduce bandwidth and latency between N local processes")
    p.add_argument("--nproc", type=positive_int, default=2, help="processes (default: 2)")
    p.add_argument("--device", help="cpu (gloo) or cuda (NCCL; default: cuda when present)")
    p.add_argument("--json", metavar="FILE", type=output_file, help="where the measurement is written")
    p.set_defaults(func=cmd_allreduce)

    for name, func, help_text in (
        ("bench", cmd_bench, "throughput mode: samples/s, step times, memory, FLOPs per sample and MFU"),
        ("ablate", cmd_ablate, "throughput of each speedup switch, cumulative and alone, against all-off"),
    ):
        p = sub.add_parser(name, help=help_text)
        add_workload_options(p, with_switches=name == "bench")
        p.add_argument("--synthetic", action="store_true", help="device-resident random batches (no data loading)")
        p.add_argument("--steps", type=positive_int, default=50, help="timed steps (default: 50)")
        p.add_argument("--warmup", type=non_negative_int, default=10, help="untimed warm-up steps (default: 10)")
        if name == "bench":
            p.add_argument("--batch-size", type=positive_int, help="global batch size (default: the recipe's)")
            p.add_argument("--json", metavar="FILE", type=output_file, help="also write the figures as JSON")
            p.add_argument("--profile", type=non_negative_int, default=0, metavar="N",
                           help="also profile N steps after the timed ones (torch.profiler): the top operators by "
                                "device and by host time")
            p.add_argument("--count-ops", action="store_true",
                           help="count what one training step asks of the host instead: operators, host-device "
                                "synchronisations (and where), tensors built from host data, host time (--scale "
                                "full: the workload's CPU-sized probe settings, then --set)")
        else:
            p.add_argument("--check-quality", action="store_true",
                           help="also run the mini time-to-train of each configuration")
            p.add_argument("--out", metavar="DIR", type=output_dir, help="folder for ablation.csv/.json/.png")
            p.add_argument("--reps", type=positive_int, default=3,
                           help="measurements per configuration (median; default 3)")
        p.set_defaults(func=func)

    p = sub.add_parser("suite", help="a whole round: every workload's runs, one results folder, one report")
    p.add_argument("--only", metavar="A,B", help="these workloads only (default: every registered one)")
    add_scale(p)
    p.add_argument("--runs", type=positive_int, default=1, help="runs per workload (default: 1)")
    p.add_argument("--seed", type=seed_int,
                   help="first seed of each series (default: drawn at random and recorded)")
    p.add_argument("--data", metavar="ROOT", help="datasets as ROOT/<workload> (default for mini: the cache)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--system", type=system_name, help="system name for the results layout (default: from the machine)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="suite folder (default: runs/suite-<scale>-<UTC time>/)")
    p.add_argument("--resume", action="store_true",
                   help="go on with the interrupted suite in --out: finished workloads kept, each series resumed")
    p.set_defaults(func=cmd_suite)

    p = sub.add_parser("plan", help="how TorchRec would shard a workload's embedding tables on N devices (DLRM; "
                                    "no data, no devices needed)")
    add_workload(p, help="a workload with model-parallel embedding tables (dlrm)")
    p.add_argument("--devices", type=positive_int, required=True, help="GPUs in all")
    p.add_argument("--local-devices", type=positive_int, help="GPUs per node (default: up to 8)")
    p.add_argument("--memory", default="80GB", help="memory of each GPU (default: 80GB)")
    p.add_argument("--host-memory", default="256GB",
                   help="host memory per GPU, for tables kept there behind a GPU cache (default: 256GB)")
    p.add_argument("--batch-size", type=positive_int, help="global batch (default: the recipe's)")
    p.add_argument("--recipe", metavar="NAME", help="a named full recipe (default: the first)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    p.add_argument("--json", metavar="FILE", type=output_file, help="also write the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("slurm", help="print an sbatch script: one torchrun per node, c10d rendezvous")
    add_workload(p)
    p.add_argument("--nodes", type=positive_int, required=True, help="nodes to run on")
    p.add_argument("--gpus-per-node", type=positive_int, required=True, help="GPUs (one process each) per node")
    p.add_argument("--partition", help="Slurm partition (#SBATCH --partition; default: the cluster's)")
    p.add_argument("--account", help="Slurm account to charge (#SBATCH --account)")
    p.add_argument("--time", default="04:00:00", help="Slurm time limit (default: 04:00:00)")
    p.add_argument("--cpus-per-gpu", type=positive_int, default=8, help="CPU cores per GPU (default: 8)")
    p.add_argument("--port", type=positive_int, default=29500, help="rendezvous port on the first node")
    p.set_defaults(func=cmd_slurm, takes_run_args=True)
    p.epilog = "Arguments after -- are passed to `trainperf run WORKLOAD` on every node, safely quoted."

    p = sub.add_parser("score", help="olympic score of MLPerf result folders (trainperf's or published ones)")
    p.add_argument("folder", help="a results folder in the submission layout (trainperf run --runs --out FOLDER)")
    p.add_argument("--ruleset", type=ruleset_name,
                   help="checker ruleset (default: the one that knows each benchmark)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("compare", help="scores of two result folders side by side, with the ratio")
    p.add_argument("a", metavar="A", help="the baseline results folder")
    p.add_argument("b", metavar="B", help="the results folder compared with A")
    p.add_argument("--ruleset", type=ruleset_name,
                   help="checker ruleset (default: the one that knows each benchmark)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("report", help="HTML (and Markdown) report over runs, result folders and scaling studies")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run folders, submission folders, scaling or ablation studies, suites")
    p.add_argument("-o", "--output", default="report.html", type=output_file,
                   help="HTML file to write (default: report.html)")
    p.add_argument("--markdown", action="store_true", help="also write a Markdown version and its PNGs beside it")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("make-minigo-target", help="train the mini MiniGo's target model (shipped in the package)")
    p.add_argument("--generations", type=positive_int, help="self-play generations (default: the shipped target's)")
    p.add_argument("--seed", type=seed_int, help="random seed (default: the shipped target's)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="folder for target.pt and target.json (default: the package's)")
    p.set_defaults(func=cmd_make_minigo_target)

    p = sub.add_parser("make-phase1", help="train the mini BERT's phase-1 checkpoint (shipped in the package)")
    p.add_argument("--steps", type=positive_int, default=6000, help="phase-1 training steps (default: 6000)")
    p.add_argument("--seed", type=seed_int, default=1, help="random seed (default: 1, the shipped checkpoint's)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="folder for vocab.txt, phase1.pt, phase1.json (default: the package's)")
    p.set_defaults(func=cmd_make_phase1)

    p = sub.add_parser("check", help="run the official MLPerf compliance checker on a log")
    p.add_argument("log", help="an MLPerf log (mlperf_log.txt, result_N.txt)")
    p.add_argument("--ruleset", type=ruleset_name,
                   help="checker ruleset (default: the one that knows the log's benchmark)")
    p.add_argument("--verbose", action="store_true", help="print the checker's whole output")
    p.set_defaults(func=cmd_check)
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


def main(argv: Sequence[str] | None = None) -> int:
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
