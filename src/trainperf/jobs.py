"""What the `trainperf` commands do, as a library: a run into a folder (in this process, on N local
processes through torch's launcher, or as one process of a group that torchrun/srun started), a
series of runs in the MLPerf submission layout, and the command line that re-creates a run in the
processes it launches. The CLI parses into a `RunRequest` and prints; everything else is here."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainperf import devices, power, prepared, registry
from trainperf.contract import Assets, Recipe, Workload, batch_share
from trainperf.errors import TrainperfError
from trainperf.files import (
    copy_atomic,
    write_json_atomic,
)
from trainperf.power import PowerRequest
from trainperf.runtime.load import busy_note

Say = Callable[[str], None]


# The exit codes of every command (docs/commands.md#exit-codes).
EXIT_OK = 0  # done; for a run, the target was reached
EXIT_NOT_REACHED = 1  # a run ended without reaching its target (budget spent, diverged, a data error)
EXIT_USAGE = 2  # the input was refused before anything ran: an option, a file, a folder
EXIT_INTERNAL = 3  # an unexpected error: a bug in trainperf or below it (the traceback is printed)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM; what finished is kept

@dataclass
class RunRequest:
    """Everything a user says about a run (the options of `trainperf run`)."""

    workload: str
    scale: str = "mini"
    data: str | None = None
    recipe: str | None = None
    sets: list[str] = field(default_factory=list)  # --set assignments, speedup switches included
    device: str | None = None
    seed: int | None = None
    out: str | None = None
    nproc: int = 1
    division: str | None = None
    org: str = "trainperf"
    status: str = "onprem"
    runs: int | None = None  # a series of N runs (0: the benchmark's MLPerf run count)
    resume: bool = False  # a series into a folder that holds some: keep the finished runs, redo the rest
    system: str | None = None
    clear_caches: bool = False
    quiet: bool = False
    command: str = ""  # the command line, recorded with the result
    power: PowerRequest | None = None  # --power: the sources sampled beside the run (trainperf/power)

    @property
    def division_or_default(self) -> str:
        return self.division or ("closed" if self.scale == "full" else "open")

    def common_argv(self) -> list[str]:
        """The options that select what runs (shared by `run` and the runs of a scaling study)."""
        argv = ["--scale", self.scale]
        for flag, value in (("--data", self.data), ("--recipe", self.recipe), ("--device", self.device)):
            if value is not None:
                argv += [flag, str(value)]
        for item in self.sets:
            argv += ["--set", item]
        return argv

    def process_argv(self, out_dir: Path, seed: int) -> list[str]:
        """`trainperf run …` for each launched process: the same run folder and seed everywhere."""
        argv = ["run", self.workload, *self.common_argv(), "--out", str(out_dir), "--seed", str(seed),
                "--org", self.org, "--status", self.status]
        if self.division is not None:
            argv += ["--division", self.division]
        argv += [flag for flag, on in (("--clear-caches", self.clear_caches), ("--quiet", self.quiet)) if on]
        return argv


@dataclass
class RunOutcome:
    """What `start` did: rank 0's result (None on other ranks), where it lives, and the exit code."""

    code: int
    result: dict[str, Any] | None = None
    out_dir: Path | None = None
    in_group: bool = False  # this process was started by a launcher (torchrun/srun)
    series: bool = False


def data_dir(workload: Workload, scale: str, data: str | None) -> Path:
    if data:
        # Absolute: "." has no name (Path(".").name == ""), so the lock beside it, the temporary sibling a
        # generator renames into place, and the comparison with the cache folder would all go wrong.
        return Path(data).expanduser().absolute()
    default = workload.default_data_dir(scale)
    if default is None:
        raise TrainperfError(f"{workload.name} --scale {scale} needs --data DIR (the dataset's root folder)")
    return default


def data_problems(workload: Workload, scale: str, folder: Path) -> list[str]:
    """The workload's own checks, and for generated (mini) data, that no file went missing or changed
    size since it was generated."""
    problems = workload.data_problems(scale, folder)
    if scale == "mini" and not problems:
        problems = prepared.generated_problems(folder)
    if scale == "full" and not problems:
        problems = eval_set_problems(workload, folder)
    return problems


def eval_set_problems(workload: Workload, folder: Path) -> list[str]:
    """An empty evaluation set passes every file check; a run would then train its whole budget and score
    nothing (BLEU of no sentence fails, COCO AP of no image or no box reads 0.0). Refused before a run,
    for `run`, `bench` and `prepare` alike."""
    found = workload.eval_set("full", folder)
    if found is None or found[1] > 0:
        return []
    expected = f" (MLPerf's holds {workload.mlperf.full_eval_samples:,})" if workload.mlperf.full_eval_samples else ""
    return [f"{found[0]}: the evaluation set is empty{expected}; a run would train and then score nothing"]


def generate(workload: Workload, folder: Path, problems: list[str], say: Say = print) -> None:
    """Generate mini data into `folder`, again when trainperf's copy there is damaged: only into a folder
    trainperf may write (`check_generation_target`), as a folder written whole (prepared.write_owned:
    a temporary sibling renamed onto the missing or empty folder, the record of its files inside), one
    process at a time (a lock on the folder itself: nothing is left beside it)."""
    check_generation_target(workload, folder)

    def still_needed() -> bool:
        now = data_problems(workload, "mini", folder)
        if not now:
            say(f"{workload.name}: mini dataset in {folder} made by another process meanwhile")
            return False
        if prepared.read_generated(folder) is not None:
            say(f"{now[0]}: generating it again")
        else:
            say(f"{workload.name}: generating the mini dataset in {folder} (first use only)")
        return True

    prepared.write_owned(folder, workload.name, lambda tmp, said: workload.prepare("mini", tmp, said), say,
                         check=lambda: check_generation_target(workload, folder), needed=still_needed,
                         option="--data")


def check_generation_target(workload: Workload, folder: Path) -> prepared.GeneratedRecord | None:
    """A mini generator writes only into a missing or empty folder, or one it generated before (its record
    says so), and deletes only the files its record names: any other folder is refused in one line,
    before anything is written — a user's real dataset given to a mini (a forgotten --scale full) first.
    Returns the record of what trainperf generated there (None: nothing there yet)."""
    here = Path.cwd().resolve()
    if folder.resolve() == here or folder.resolve() in here.parents:
        raise TrainperfError(f"--data {folder}: is the current folder (or holds it); mini data replaces the folder it "
                             "is generated into: name another folder, or leave --data out")
    record = prepared.read_generated(folder) if folder.is_dir() and not folder.is_symlink() else None
    if record is not None and not record.by_generator and folder != workload.default_data_dir("mini"):
        raise TrainperfError(
            f"--data {folder}: its {prepared.GENERATED_MANIFEST} was written by an older trainperf, which also "
            "recorded real datasets given to a mini, so it does not show trainperf generated this folder and "
            "nothing in it is deleted. If this is the real dataset, delete that file and add --scale full; if "
            "trainperf generated it, delete the folder and run again")

    def unowned(foreign: list[str], shown: str) -> str:
        complete = not workload.data_problems("mini", folder)
        what = (f"a complete {workload.name} dataset trainperf did not generate" if complete else
                f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} trainperf did not write")
        return (f"holds {what} ({shown}); mini data is generated only into a new or empty folder, or one trainperf "
                "generated. If this is the real dataset, add --scale full; for the mini, leave --data out or name "
                "a new folder")

    return prepared.owned_target(folder, workload.name, "--data", unowned, what="mini dataset",
                                 legacy_ok=True)


def prepared_data(workload: Workload, scale: str, data: str | None, say: Say = print) -> Path:
    """The data folder, ready: a mini dataset is generated on first use, a full one must be complete."""
    folder = data_dir(workload, scale, data)
    problems = data_problems(workload, scale, folder)
    if problems and scale == "full":
        raise TrainperfError(problems[0])
    if problems:
        generate(workload, folder, problems, say)
    return folder


def needs_data(synthetic: bool, data: str | None) -> bool:
    """Whether a benchmark opens the dataset: for real batches, or because the user named one (a
    synthetic benchmark's model is then sized by it: DLRM's tables, NCF's embeddings)."""
    return not synthetic or data is not None


def resolve_recipe(workload: Workload, scale: str, name: str | None, sets: list[str]) -> Recipe:
    recipe = workload.recipe(scale, name).with_overrides(sets)
    workload.check_recipe(recipe)
    return recipe


def check_switches(workload: Workload, recipe: Recipe, device: str | None, world_size: int | None = None) -> None:
    """An unsupported speedup, or a parallelism the processes cannot hold (ep=2 on one process, say), is a
    one-line error before any run folder is written (the harness checks again, on the device each process
    really gets). `world_size`: the processes the run will have (default: the launcher's, else one)."""
    from trainperf.contract import RuntimeContext
    from trainperf.runtime import distributed, speedups

    resolved = devices.resolve(device)
    speedups.check_supported(workload, recipe, resolved)
    spec = workload.parallelism(recipe)
    if spec is None:
        return
    if world_size is None:
        placement = distributed.env_placement()
        world_size = placement[2] if placement is not None else 1
    speedups.check_parallelism(workload, spec, recipe, RuntimeContext(device=resolved, world_size=world_size))


def start(request: RunRequest, say: Say = print, warn: Say = print) -> RunOutcome:
    """`trainperf run`: checks everything the user typed before anything is written, then one run
    (or a series) into the run folder."""
    from trainperf.paths import default_run_dir
    from trainperf.results import run_folder
    from trainperf.runtime import distributed

    workload = registry.get(request.workload)
    recipe = resolve_recipe(workload, request.scale, request.recipe, request.sets)
    folder = data_dir(workload, request.scale, request.data)
    problems = data_problems(workload, request.scale, folder)
    if problems and request.scale == "full":
        raise TrainperfError(problems[0])
    placement = distributed.env_placement()
    in_group = placement is not None and placement[2] > 1
    if request.nproc < 1:
        raise TrainperfError(f"--nproc {request.nproc}: expected a number of processes >= 1")
    if in_group and (request.nproc > 1 or request.runs is not None):
        raise TrainperfError("--nproc/--runs: this process was already started by a launcher (torchrun/srun)")
    if request.nproc > 1:
        batch_share(recipe.global_batch_size, request.nproc, where=f"--nproc {request.nproc}")
    check_switches(workload, recipe, request.device, placement[2] if in_group else request.nproc)
    if request.power is not None and workload.untimed_evaluation:
        raise TrainperfError(f"--power: {workload.name}'s evaluations are off the MLPerf clock, so its log's times are "
                             "not the wall clock the power readings keep; its energy is not measured")
    if request.power is not None and power.samples_here():
        request.power = power.check(request.power, warn)  # a source that cannot be read: refused before any write
    out_dir = Path(request.out) if request.out else default_run_dir(workload.name)
    is_main = placement is None or placement[0] == 0
    if is_main and request.runs is None:
        run_folder.check_free(out_dir)
    if request.resume and request.runs is None:
        raise TrainperfError("--resume: only a series (--runs) can be resumed")
    if problems and not in_group:
        generate(workload, folder, problems, say)
    if not in_group:
        # Files build() reads (metadata, weights): a missing one is named before any folder is written.
        assets = Assets(workload.assets(recipe, folder))
        assets.check()
        workload.check_assets(recipe, assets)
        for note in workload.notes(recipe, request.scale):
            say(f"note: {note}")
    seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "little") % (2**31)
    if request.runs is not None:
        code = run_series(request, workload, recipe, folder, out_dir, seed, say, warn)
        return RunOutcome(code=code, out_dir=out_dir, series=True)
    result = run_once(request, workload, recipe, folder, out_dir, seed)
    if result is None:
        return RunOutcome(code=0, out_dir=out_dir, in_group=in_group)  # a rank other than 0: rank 0 reports
    code = 0 if result["status"] == "success" else EXIT_INTERRUPTED if interrupted(result) else EXIT_NOT_REACHED
    return RunOutcome(code=code, result=result, out_dir=out_dir, in_group=in_group)


def run_once(request: RunRequest, workload: Workload, recipe: Recipe, folder: Path, out_dir: Path,
             seed: int) -> dict[str, Any] | None:
    """One run into `out_dir`, in this process or on --nproc processes; rank 0's result (else None).
    A non-zero rank whose run did not succeed exits 1 (its launcher reports it)."""
    from trainperf.harness import RunConfig
    from trainperf.results import run_folder

    def run_config(log_path: Path | None, seed: int) -> RunConfig:
        return RunConfig(workload=workload, recipe=recipe, scale=request.scale, data_dir=folder, seed=seed,
                         log_path=log_path, division=request.division_or_default, org=request.org,
                         status=request.status, clear_caches=request.clear_caches,
                         extra_env={"command": request.command})

    result: dict[str, Any] | None = None
    saved = out_dir / run_folder.RESULT_NAME
    try:
        with power.sampling(request.power, out_dir):
            if request.nproc > 1:
                result = _run_launched(request, out_dir, seed, run_config(out_dir / run_folder.LOG_NAME, seed))
            else:
                result = _run_here(request, out_dir, seed, run_config)
    except BaseException:
        # Interrupted: the aborted run's log has its timed region, and its energy goes with its result (finish
        # never raises, so the interruption stays what propagates).
        power.finish(request.power, out_dir, out_dir / run_folder.LOG_NAME,
                     saved if saved.exists() and power.holds_result() else None)
        raise
    # Only the process holding rank 0's result adds to result.json; another node writes its node file.
    summary = power.finish(request.power, out_dir, out_dir / run_folder.LOG_NAME,
                           saved if result is not None else None)
    if result is not None and summary is not None:
        result = dict(result, power=summary, energy_j=summary["energy_j"])
    return result


def _run_here(request: RunRequest, out_dir: Path, seed: int, run_config: Callable[[Path | None, int], Any]
              ) -> dict[str, Any] | None:
    from trainperf.harness import run
    from trainperf.harness.progress import make_progress
    from trainperf.results import run_folder
    from trainperf.runtime import distributed

    ctx = distributed.init_from_env(request.device)
    seed = distributed.agree_seed(ctx, seed)
    try:
        log_path = run_folder.claim(out_dir) if ctx.is_main else None
        config = run_config(log_path, seed)
        # Saved inside the harness's signal guard: a SIGTERM from the launcher cannot come between
        # run_stop and the result file.
        save = (lambda res: run_folder.save(out_dir, res)) if ctx.is_main else None
        result = run(config, ctx, make_progress(request.quiet), on_result=save)
    finally:
        distributed.shutdown()
    if not ctx.is_main:
        if result.status != "success":
            # As rank 0 would: 130 when interrupted, 1 otherwise (the launcher tells them from a crash).
            raise SystemExit(EXIT_INTERRUPTED if interrupted(result.to_dict()) else EXIT_NOT_REACHED)
        return None
    return result.to_dict()


def _run_launched(request: RunRequest, out_dir: Path, seed: int, config: Any) -> dict[str, Any]:
    """A run on --nproc local processes; rank 0's result. When rank 0 died before it could close its run
    (killed; or stopped by the launcher after its grace period), this process closes it: `run_stop`
    `aborted` appended to the log through mllog, and the result.json that log supports. Interrupted
    (Ctrl-C, SIGTERM, SIGHUP to this process, which the launcher passed on to every rank): the
    aborted result, whose reason says so, or `Interrupted` again when no run was opened yet or it had
    already ended with success (the command stops either way: a series too)."""
    from trainperf.errors import Interrupted
    from trainperf.harness.run import close_for_rank0
    from trainperf.results import run_folder
    from trainperf.results.logs import read_records
    from trainperf.runtime import distributed

    log, saved = out_dir / run_folder.LOG_NAME, out_dir / run_folder.RESULT_NAME
    try:
        launched = distributed.launch_local(request.nproc, request.process_argv(out_dir, seed))
    except Interrupted as stop:
        if log.exists() and not saved.exists():
            run_folder.save(out_dir, close_for_rank0(config, request.nproc, f"received {stop.signal_name}",
                                                      read_records(log)))
        if not saved.exists() or run_folder.load(out_dir)["status"] == "success":
            raise
        return run_folder.load(out_dir)
    if launched.code != 0 and log.exists() and not saved.exists():
        reason = f"{launched.failed_first or f'exit code {launched.code}'}; closed by the launching process"
        run_folder.save(out_dir, close_for_rank0(config, request.nproc, reason, read_records(log)))
    result = run_folder.load_launched(out_dir, launched.code)
    if launched.failed_first and interrupted(result):
        # The launcher's SIGTERM to the surviving ranks, after another one failed: not the user's.
        result["abort_reason"] = f"{launched.failed_first}; then {result['abort_reason']} from the launcher"
        write_json_atomic(saved, result)
    return result


def run_series(request: RunRequest, workload: Workload, recipe: Recipe, folder: Path, out_dir: Path, seed: int,
               say: Say = print, warn: Say = print) -> int:
    """N runs with distinct recorded seeds, in the MLPerf submission layout. Exit code 0 when all ran
    (a run that missed its target is still a run: the olympic score allows for it), 130 when
    interrupted (the finished runs are kept), 1 otherwise."""
    from trainperf.results import submission

    count = request.runs if request.runs else workload.mlperf.runs
    device = devices.resolve(request.device)
    world = request.nproc if device.type == "cuda" else 1
    system = request.system or submission.default_system_name(device, world)
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainperfError(f"--out {out_dir}: exists and is not a folder")
    logs_dir, system_json, details_dir = submission.layout_paths(out_dir, system, workload.benchmark)
    kept = {i for i in range(count) if (logs_dir / f"result_{i}.txt").is_file()}
    if (kept or any(logs_dir.glob("result_*.txt"))) and not request.resume:
        raise TrainperfError(f"--out {out_dir}: {logs_dir} already holds results; choose another folder, or add "
                             "--resume to keep the finished runs and redo the others")
    cut = [i for i in range(count) if i not in kept and (details_dir / f"run_{i}").exists()]
    if cut and not request.resume:
        raise TrainperfError(f"--out {out_dir}: run {cut[0]} was cut short ({details_dir / f'run_{cut[0]}'}); add "
                             "--resume to redo it and go on, or choose another folder")
    if kept:
        first = _series_seed(details_dir, kept, seed)
        if request.seed is not None and request.seed != first:
            raise TrainperfError(f"--resume: --seed {request.seed} differs from the kept runs' (--seed {first}); "
                                 "a resumed series keeps its seeds")
        seed = first
        _check_same_series(request, recipe, logs_dir, details_dir, kept)
    logs_dir.mkdir(parents=True, exist_ok=True)
    submission.write_system(system_json, submission.system_description(
        system, request.org, request.division_or_default, request.status, device, world))
    resumed = f", {len(kept)} kept" if kept else ""
    say(f"{count} runs of {workload.name} {request.scale} into {out_dir} (system {system}{resumed})")
    finished = len(kept)
    for i in range(count):
        run_dir = details_dir / f"run_{i}"
        if i in kept:
            continue
        if request.resume and run_dir.exists():
            shutil.rmtree(run_dir)  # a run cut short: its log never reached the results folder
        try:
            result = run_once(request, workload, recipe, folder, run_dir, seed + i)
        except TrainperfError as exc:
            result, why = None, str(exc)
        else:
            why = "no result (see the messages above)"
        if result is None:
            warn(f"run {i}: {why}; the series stops")
            break
        if interrupted(result):
            warn(f"run {i}: interrupted; the {finished} finished run(s) are kept (add --resume to the same "
                 "command to go on)")
            return EXIT_INTERRUPTED
        power.copy_to_series(run_dir, logs_dir, i)  # first: result_<i>.txt is what marks the run as kept
        copy_atomic(run_dir / "mlperf_log.txt", logs_dir / f"result_{i}.txt")
        finished += 1
        ttt = f"{result['time_to_train_s']:.2f} s" if result["time_to_train_s"] is not None else "-"
        say(f"run {i} (seed {seed + i}): {result['status']} in {ttt}")
        busy = busy_note(result.get("machine_load"))
        if busy:
            warn(f"run {i}: {busy}")
    say(f"results: {logs_dir}\nsystem description: {system_json}\nscore it: trainperf score {out_dir}")
    return 0 if finished == count else 1


def _series_seed(details_dir: Path, kept: set[int], fallback: int) -> int:
    """The first seed of a series being resumed: run k used SEED + k (its result.json says which)."""
    for k in sorted(kept):
        path = details_dir / f"run_{k}" / "result.json"
        try:
            return int(json.loads(path.read_text(encoding="utf-8"))["seed"]) - k
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return fallback


def _check_same_series(request: RunRequest, recipe: Recipe, logs_dir: Path, details_dir: Path,
                       kept: set[int]) -> None:
    """A resumed series must be the series it resumes: one submission holds one recipe, one
    organisation, division and status. Compared with what each kept run recorded (its result.json,
    its log); the first difference is refused in one line."""
    from trainperf.results.logs import read_records

    now = {"scale": request.scale, "recipe": json.loads(json.dumps(recipe.to_dict(), default=str)),
           "division": request.division_or_default, "org": request.org, "status": request.status}
    for k in sorted(kept):
        result_path = details_dir / f"run_{k}" / "result.json"
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
            was = {"scale": result["scale"], "recipe": result["recipe"], "division": result["division"]}
        except (OSError, ValueError, KeyError, TypeError):
            raise TrainperfError(f"--resume: {result_path}: unreadable, so run {k} cannot be shown to be of this "
                                 "series; start a new folder") from None
        logged = {r["key"]: r.get("value") for r in read_records(logs_dir / f"result_{k}.txt")}
        was |= {"org": logged.get("submission_org"), "status": logged.get("submission_status")}
        measured = bool(result.get("power"))
        if measured != (request.power is not None):
            raise TrainperfError(f"--resume: run {k} was made {'with' if measured else 'without'} --power, this "
                                 f"command {'with' if request.power is not None else 'without'}; a resumed series "
                                 "measures the energy of all its runs or of none")
        for key in ("scale", "division", "org", "status"):
            if was[key] != now[key]:
                raise TrainperfError(f"--resume: run {k} was made with --{key} {was[key]}, this command says "
                                     f"{now[key]}; a resumed series must be the same series")
        changed = sorted(f for f in set(was["recipe"]) | set(now["recipe"])
                         if was["recipe"].get(f) != now["recipe"].get(f))
        if changed:
            f = changed[0]
            more = f" (and {len(changed) - 1} more field(s))" if len(changed) > 1 else ""
            raise TrainperfError(f"--resume: run {k} used {f}={was['recipe'].get(f)!r}, this command "
                                 f"{f}={now['recipe'].get(f)!r}{more}; a resumed series must use the same recipe "
                                 "and --set options")


def interrupted(result: dict[str, Any]) -> bool:
    """Whether a run ended because the user (or the system) stopped it, not because it failed."""
    return (result.get("abort_reason") or "").startswith(("received SIG", "interrupted"))


def summary(workload: Workload, scale: str, result: dict[str, Any], out_dir: Path) -> str:
    """The lines `trainperf run` prints after a run."""
    ttt = f"{result['time_to_train_s']:.2f} s" if result["time_to_train_s"] is not None else "-"
    if result["status"] == "success":
        detail = (f"{result['epochs_to_target']} epochs, {workload.metric.name} "
                  f"{workload.metric.describe(result['final_metric'])}")
    else:
        detail = result["abort_reason"]
    procs = result["environment"].get("world_size", 1)
    busy = busy_note(result.get("machine_load"))
    return (f"{workload.name} {scale}: {result['status']} in {ttt} ({detail})"
            + (f" on {procs} processes" if procs > 1 else "")
            + (f"\nwarning: {busy}" if busy else "")
            + f"\nlog: {out_dir / 'mlperf_log.txt'}\nresult: {out_dir / 'result.json'}"
            + f"\nnext: trainperf report {out_dir} -o report.html (a page with the convergence curve); "
            + f"trainperf check {out_dir / 'mlperf_log.txt'}; for a score, the MLPerf runs: trainperf run "
            + f"{workload.name}{' --scale full' if scale == 'full' else ''} --runs {workload.mlperf.runs} --out sub/ "
            + "&& trainperf score sub/")


def command_line(argv: list[str]) -> str:
    return shlex.join(["trainperf", *argv])
