"""Process groups on torch.distributed: joined from torchrun's or Slurm's environment, launched
locally through torch's elastic launcher API (never a home-made launcher or collective).

State lives in the RuntimeContext that is passed down; nothing here is module-global.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import signal
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainperf import devices
from trainperf.contract import ModelParts, RuntimeContext
from trainperf.errors import Interrupted, TrainperfError
from trainperf.signals import hung_up

EXIT_INTERRUPTED = 130  # jobs.EXIT_INTERRUPTED (jobs imports this module)

# A rank that stops answering makes the others fail their next collective after this long.
DEFAULT_TIMEOUT_S = 120


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
                continue
            width = len(lo)
            hosts.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    return hosts


def env_placement(env: dict[str, str] | None = None) -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) from torchrun or srun variables, or None for a plain process.

    For srun, MASTER_ADDR defaults to the first host of SLURM_JOB_NODELIST and MASTER_PORT to a
    port derived from the job id, so that every task finds the same rendezvous.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"])
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        if "MASTER_ADDR" not in env:
            hosts = expand_nodelist(env.get("SLURM_JOB_NODELIST", "localhost"))
            env["MASTER_ADDR"] = hosts[0] if hosts else "localhost"
        env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
        return int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"])
    return None


def init_from_env(device: str | None = None, timeout_s: float | None = None) -> RuntimeContext:
    """Join the process group the environment describes, or run alone when no launcher started this
    process. A launched process joins its group even when it is the only one (`torchrun
    --nproc_per_node 1`): the collectives, DDP and NCCL then run as they would on N devices."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("TRAINPERF_COLLECTIVE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    placement = env_placement()
    if placement is None:
        return RuntimeContext.create(device)
    rank, local_rank, world = placement
    dev = devices.resolve(device, local_rank)
    devices.activate(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    try:
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=dev if dev.type == "cuda" else None)
    except Exception as exc:  # noqa: BLE001 - any rendezvous failure is the user's setup
        raise TrainperfError(f"rank {rank}: cannot join the {backend} process group at "
                             f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} ({exc})") from None
    return RuntimeContext(device=dev, rank=rank, world_size=world, local_rank=local_rank, grouped=True)


def preflight(ctx: RuntimeContext) -> None:
    """A short all-reduce that fails fast, with a clear message, when the group does not work."""
    probe = torch.ones(1, device=ctx.device)
    try:
        dist.all_reduce(probe)
    except Exception as exc:  # noqa: BLE001
        raise TrainperfError(f"rank {ctx.rank}: all-reduce pre-flight failed ({exc})") from None
    if int(probe.item()) != ctx.world_size:
        raise TrainperfError(f"rank {ctx.rank}: all-reduce pre-flight summed {int(probe.item())}, "
                             f"expected {ctx.world_size}")


def wrap_data_parallel(parts: ModelParts, ctx: RuntimeContext) -> ModelParts:
    """DistributedDataParallel over the process group: gradients all-reduced (averaged) every step."""
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        parts.model = DistributedDataParallel(parts.model, device_ids=device_ids)
    return parts


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class Launched:
    """How a local launch ended: `code` 0 when every process exited 0, else the first failure's exit
    code (1 if unknown); `failed_first` says which rank failed first and how."""

    code: int
    failed_rank: int | None = None
    failed_first: str | None = None


# The signals the elastic agent catches in the launching process and passes on to every process.
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def launch_local(nproc: int, argv: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> Launched:
    """Run `python -m trainperf ARGV` as `nproc` local processes through torch's elastic launcher.

    The launcher sets RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*; when one process dies it stops the others.
    A signal to this process (Ctrl-C, SIGTERM, SIGHUP) is passed on by the launcher to every process
    (each closes its run), which it then waits for (`shutdown_timeout`, then SIGKILL); it is then
    raised here as `Interrupted`, not as torch's SignalException.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The children inherit this process's environment: set it for the launch, then restore it.
    # One intra-op thread per process unless the user chose otherwise: N processes share the cores.
    # The agent catches (and passes on) only the signals this process does not ignore: under nohup a
    # closed terminal must not stop the run.
    handled = [name for name in _AGENT_SIGNALS if signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN]
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"trainperf-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2,
        start_method="spawn", shutdown_timeout=10, signals_to_handle=",".join(handled),
    )
    child_env = {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc))),
        "TRAINPERF_COLLECTIVE_TIMEOUT_S": os.environ.get("TRAINPERF_COLLECTIVE_TIMEOUT_S", str(timeout_s)),
        # The ranks are one run: the machine-load monitor counts this process and its descendants as it.
        "TRAINPERF_LAUNCHER_PID": str(os.getpid()),
    }
    # launch_agent sets TORCHELASTIC_SIGNALS_TO_HANDLE from the config, for good: restored below too.
    saved_signals_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    saved = {key: os.environ.get(key) for key in child_env}
    os.environ.update(child_env)
    # The agent installs its own handlers for these signals and leaves them there: put ours back after.
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _AGENT_SIGNALS}
    # The launcher logs every non-zero exit as an error, including a run that ended `aborted` (exit 1)
    # on every rank; trainperf reports failures itself, below. (The agent's own logger has a level of
    # its own, hence each logger below torch.distributed.elastic.)
    quiet = [logging.getLogger(name) for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]
             if name.startswith("torch.distributed.elastic")]
    levels = [(logger, logger.level) for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", "trainperf", *argv)
    except SignalException as exc:
        if exc.sigval == signal.SIGHUP:
            hung_up()
        raise Interrupted(signal.Signals(exc.sigval).name) from None
    except ChildFailedError as exc:
        failures = exc.failures
        if len(failures) == nproc and all(f.exitcode in (1, EXIT_INTERRUPTED) for f in failures.values()):
            # every rank finished its run and reported it aborted (or interrupted): not a crash
            return Launched(code=max(f.exitcode for f in failures.values()))
        rank, failure = min(failures.items(), key=lambda kv: kv[1].timestamp)
        code = failure.exitcode if failure.exitcode > 0 else 1
        how = f"exit code {failure.exitcode}" if failure.exitcode >= 0 else f"signal {-failure.exitcode}"
        first = f"rank {rank} failed first ({how})"
        print(f"trainperf: {first}; the launcher stopped the other ranks", file=sys.stderr)
        return Launched(code=code, failed_rank=rank, failed_first=first)
    finally:
        for logger, level in levels:
            logger.setLevel(level)
        for name, handler in handlers.items():
            signal.signal(getattr(signal, name), signal.SIG_DFL if handler is None else handler)
        for key, value in [*saved.items(), ("TORCHELASTIC_SIGNALS_TO_HANDLE", saved_signals_env)]:
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Launched(code=0)


def agree_seed(ctx: RuntimeContext, seed: int) -> int:
    """Every process must use rank 0's seed (a seed drawn at random differs per process)."""
    if not ctx.distributed:
        return seed
    value = torch.tensor([seed], dtype=torch.long, device=ctx.device)
    dist.broadcast(value, src=0)
    return int(value.item())
