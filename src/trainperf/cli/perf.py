"""Commands that measure or plan rather than train to a target: bench, ablate, predict, tune-batch,
allreduce, plan, slurm."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from trainperf import jobs, registry
from trainperf.cli.options import (
    add_batch_size,
    add_bench_batch,
    add_device,
    add_epochs,
    add_json,
    add_link_options,
    add_nproc,
    add_out,
    add_recipe,
    add_runs,
    add_seed,
    add_sets,
    add_steps,
    add_workload,
    add_workload_options,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    stamp,
)
from trainperf.contract import batch_share
from trainperf.errors import TrainperfError, shown


def add_predict(sub: Any) -> None:
    p = sub.add_parser("predict", help="predicted full-scale time-to-train: RCP epochs x measured time per epoch")
    add_workload_options(p)
    p.set_defaults(scale="full")
    add_nproc(p, "data-parallel devices (default: 1)")
    add_bench_batch(p, "batch of the bench (default: global batch / nproc)")
    p.add_argument("--samples-per-s", type=positive_float, help="a known per-device throughput instead of a bench")
    add_epochs(p, "epochs to converge (default: the RCP files of the ruleset)")
    p.add_argument("--eval-s", type=non_negative_float,
                   help="seconds per evaluation (default: estimated from the throughput)")
    add_link_options(p)
    add_steps(p, steps=10, warmup=3, what="bench ")
    p.add_argument("--from-log", metavar="PATH", help="check the prediction on published logs (a result_*.txt "
                                                      "or a folder of them): their throughput, RCP epochs")
    add_out(p, "folder for the all-reduce probe (default: runs/)")
    add_json(p, "also write the prediction as JSON")
    p.set_defaults(func=cmd_predict)


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
    out_dir = Path(args.out or "runs") / f"predict-{workload.name}-{stamp()}"
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


def add_tune_batch(sub: Any) -> None:
    p = sub.add_parser("tune-batch", help="batch-size tuner: throughput and epochs to target per global batch")
    add_workload_options(p, with_switches=False)
    p.add_argument("--batch-sizes", required=True, metavar="B,B,...", help="global batch sizes, e.g. 64,128,256")
    add_runs(p, "runs to target per batch size (median; default: 3)", default=3)
    p.add_argument("--lr-rule", choices=("linear", "sqrt", "none"), default="linear",
                   help="learning rate x batch/base (linear) or x sqrt(batch/base); step-counted decay points "
                        "x base/batch (default: linear)")
    p.add_argument("--warmup-rule", choices=("steps", "samples"), default="steps",
                   help="the warmup keeps its optimizer steps (its epochs grow with the batch; default) or its "
                        "samples (epochs fixed, Goyal et al.)")
    add_seed(p, default=0, help="first seed; run k uses SEED+k at every batch (default: 0)")
    add_steps(p, steps=20, warmup=5, what="bench ")
    add_out(p, "study folder (default: runs/tune-<workload>-<UTC time>/)")
    p.set_defaults(func=cmd_tune_batch)


def cmd_tune_batch(args: argparse.Namespace) -> int:
    from trainperf.science import tune

    workload = registry.get(args.workload)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    batches = tune.parse_batches(args.batch_sizes)
    jobs.check_switches(workload, recipe, args.device)
    data_dir = jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"tune-{workload.name}-{stamp()}"
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


def add_allreduce(sub: Any) -> None:
    p = sub.add_parser("allreduce", help="all-reduce bandwidth and latency between N local processes")
    add_nproc(p, "processes (default: 2)", default=2)
    add_device(p, "cpu (gloo) or cuda (NCCL; default: cuda when present)")
    add_json(p, "where the measurement is written")
    p.set_defaults(func=cmd_allreduce)


def cmd_allreduce(args: argparse.Namespace) -> int:
    from trainperf.runtime import distributed
    from trainperf.science import project

    placement = distributed.env_placement()
    if placement is not None and placement[2] > 1:  # one process of the probe's group
        project.probe_in_group(Path(args.json), device=args.device)
        return 0
    if args.nproc < 2:
        raise TrainperfError(f"--nproc {args.nproc}: the all-reduce probe needs at least 2 processes")
    out_dir = Path(args.json).parent if args.json else Path("runs") / f"allreduce-{stamp()}"
    link = project.measure_link(args.nproc, out_dir, args.device)
    print(f"all-reduce between {args.nproc} local processes: bandwidth {link.bandwidth_gbs:.3f} GB/s, "
          f"latency {link.latency_us:.1f} µs (ring model fitted to 4 KiB-16 MiB; {out_dir / 'allreduce.json'})")
    return 0


def project_scaling(args: argparse.Namespace) -> int:
    from trainperf.bench import scaling
    from trainperf.science import measure, project

    workload = registry.get(args.workload)
    devices = scaling.parse_nprocs(args.project)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    jobs.check_switches(workload, recipe, args.device)
    per_device = args.batch_size or recipe.global_batch_size
    out_dir = Path(args.out) if args.out else Path("runs") / f"project-{workload.name}-{stamp()}"
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


def add_plan(sub: Any) -> None:
    p = sub.add_parser("plan", help="how many GPUs a sharded workload needs and in which layout: TorchRec's "
                                    "table sharding (DLRM), FSDP x TP sizes (Llama); no data, no devices needed")
    add_workload(p, help="a workload with model-parallel embedding tables (dlrm) or a fully sharded model "
                         "(llama31_8b, llama31_405b)")
    p.add_argument("--devices", type=positive_int,
                   help="GPUs in all (required for tables; for a sharded model, also the need at this count)")
    p.add_argument("--local-devices", type=positive_int, help="GPUs per node (default: up to 8)")
    p.add_argument("--memory", default="80GB", help="memory of each GPU (default: 80GB)")
    p.add_argument("--host-memory", default="256GB",
                   help="host memory per GPU, for tables kept there behind a GPU cache (default: 256GB)")
    add_batch_size(p, "global batch (default: the recipe's)")
    add_recipe(p, "a named full recipe (default: the first)")
    add_sets(p)
    add_json(p, "also write the plan as JSON")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from trainperf.files import write_json_atomic
    from trainperf.runtime import recsys

    workload = registry.get(args.workload)
    if not workload.model_parallel_sets:
        return _fsdp_plan(workload, args)
    if args.devices is None:
        raise TrainperfError(f"plan {workload.name}: --devices N is required (the GPUs its tables are sharded over)")
    if args.devices < 1 or (args.local_devices is not None and args.local_devices < 1):
        raise TrainperfError("--devices and --local-devices: expected numbers of devices >= 1")
    if args.devices > recsys.MAX_PLAN_DEVICES:
        raise TrainperfError(f"--devices {args.devices}: TorchRec's planner searches every table's shards over every "
                             f"device, in time that grows with their count (512: about 2 minutes on a 2-core CPU); "
                             f"at most {recsys.MAX_PLAN_DEVICES:,}")
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


def _fsdp_plan(workload: Any, args: argparse.Namespace) -> int:
    from trainperf.bench import shardplan
    from trainperf.files import write_json_atomic
    from trainperf.runtime import recsys

    sets = list(args.set) + ([f"global_batch_size={args.batch_size}"] if args.batch_size else [])
    recipe = jobs.resolve_recipe(workload, "full", args.recipe, sets)
    memory = recsys.parse_bytes(args.memory, "--memory")
    rows = shardplan.plan(workload, recipe, memory, args.devices)
    print(f"{workload.name} {recipe.name}: GPUs of {recsys.size_text(memory)}, global batch "
          f"{recipe.global_batch_size:,}, one sequence of {getattr(recipe, 'seq_len', '?'):,} tokens per "
          f"micro-batch; " + ("FSDP2 over all GPUs, each MoE layer's experts split over ep" if hasattr(recipe, "ep")
                              else "FSDP2 over dp, tensor and sequence parallelism over tp")
          + f" (margin {shardplan.MARGIN}x)")
    print(shardplan.plan_table(rows, args.devices))
    if args.json:
        write_json_atomic(Path(args.json), {"workload": workload.name, "recipe": recipe.name,
                                            "memory_bytes": memory, "devices": args.devices, "layouts": rows})
        print(f"wrote {args.json}")
    return 0


def add_slurm(sub: Any) -> None:
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


def cmd_slurm(args: argparse.Namespace) -> int:
    from trainperf.cli import build_parser
    from trainperf.cli.options import switch_sets
    from trainperf.runtime.slurm import sbatch_script

    workload = registry.get(args.workload)
    # What every node will run, checked here rather than after the job has queued: the run parser
    # (unknown options, bad values: one line, exit 2), then the recipe (--recipe, --set) and the batch
    # split. Not the data (a path on the cluster) nor the switches (the nodes' devices are not these).
    run, unknown = build_parser().parse_known_args(["run", workload.name, *args.run_args])
    if unknown:
        raise TrainperfError(f"after --: {shown(' '.join(unknown))}: not an option of trainperf run "
                             "(see trainperf run --help)")
    for flag, given in (("--nproc", run.nproc != 1), ("--out", run.out is not None),
                        ("--runs", run.runs is not None), ("--resume", run.resume)):
        if given:
            raise TrainperfError(f"{flag}: set by the script (one torchrun per node, runs/<workload>-<job id>)")
    recipe = jobs.resolve_recipe(workload, run.scale, run.recipe, [*run.set, *switch_sets(run)])
    world = args.nodes * args.gpus_per_node
    batch_share(recipe.global_batch_size, world, where=f"--nodes {args.nodes} x --gpus-per-node {args.gpus_per_node}")
    print(sbatch_script(workload.name, args.nodes, args.gpus_per_node, args.run_args, partition=args.partition,
                        account=args.account, time_limit=args.time, cpus_per_gpu=args.cpus_per_gpu,
                        port=args.port), end="")
    return 0


def add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="throughput mode: samples/s, step times, memory, FLOPs per sample and MFU")
    add_workload_options(p)
    add_synthetic(p)
    add_steps(p, steps=50, warmup=10)
    add_batch_size(p, "global batch size (default: the recipe's)")
    add_json(p, "also write the figures as JSON")
    p.add_argument("--profile", type=non_negative_int, default=0, metavar="N",
                   help="also profile N steps after the timed ones (torch.profiler): the top operators by device and "
                        "by host time")
    p.add_argument("--count-ops", action="store_true",
                   help="count what one training step asks of the host instead: operators, host-device "
                        "synchronisations (and where), tensors built from host data, host time (--scale full: the "
                        "workload's CPU-sized probe settings, then --set)")
    p.set_defaults(func=cmd_bench)


def add_synthetic(p: Any) -> None:
    p.add_argument("--synthetic", action="store_true", help="device-resident random batches (no data loading)")


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
    from trainperf.contract import Assets
    from trainperf.files import write_json_atomic
    from trainperf.runtime import distributed

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
    if args.steps > 1:  # two counted steps of the same batch: the same work, as a captured graph replays it?
        print("replays: " + (f"differ at {counts.unstable}" if counts.unstable else
                             f"the same operators and shapes in each of the {args.steps} counted steps"))
    if args.json:
        write_json_atomic(Path(args.json), counts.to_dict())
        print(f"wrote {args.json}")
    return 0


def add_ablate(sub: Any) -> None:
    p = sub.add_parser("ablate", help="throughput of each speedup switch, cumulative and alone, against all-off")
    add_workload_options(p, with_switches=False)
    add_synthetic(p)
    add_steps(p, steps=50, warmup=10)
    p.add_argument("--check-quality", action="store_true", help="also run the mini time-to-train of each configuration")
    add_out(p, "folder for ablation.csv/.json/.png")
    p.add_argument("--reps", type=positive_int, default=3, help="measurements per configuration (median; default 3)")
    p.set_defaults(func=cmd_ablate)


def cmd_ablate(args: argparse.Namespace) -> int:
    from trainperf.bench import ablate

    workload = registry.get(args.workload)
    recipe = jobs.resolve_recipe(workload, args.scale, args.recipe, args.set)
    data_dir = None
    if jobs.needs_data(args.synthetic, args.data) or args.check_quality:
        data_dir = jobs.prepared_data(workload, args.scale, args.data)
    out_dir = Path(args.out) if args.out else Path("runs") / f"ablate-{workload.name}-{stamp()}"
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
