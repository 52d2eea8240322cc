"""A ready sbatch script: one torchrun per node, c10d rendezvous on the first node of the job."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from trainperf.errors import TrainperfError

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


def sbatch_script(workload: str, nodes: int, gpus_per_node: int, run_args: Sequence[str], *,
                  partition: str | None = None, account: str | None = None, time_limit: str = "04:00:00",
                  cpus_per_gpu: int = 8, port: int = 29500, job_name: str | None = None) -> str:
    """The script text. Every user-supplied value is shell-quoted; Slurm variables expand at run time."""
    if nodes < 1 or gpus_per_node < 1:
        raise TrainperfError("--nodes and --gpus-per-node must be >= 1")
    if not _TIME.match(time_limit):
        raise TrainperfError(f"--time {time_limit!r}: expected a Slurm time such as 04:00:00 or 1-00:00:00")
    if not 1 <= port <= 65535:
        raise TrainperfError(f"--port {port}: expected a TCP port")
    for flag in ("--nproc", "--out"):
        if flag in run_args:
            raise TrainperfError(f"{flag}: set by the script (one torchrun per node, runs/<workload>-<job id>)")
    name = job_name or f"trainperf-{workload}"

    def directive(key: str, value: str) -> str:
        if "\n" in value:
            raise TrainperfError(f"--{key}: must be a single line")
        return f"#SBATCH --{key}={value}"

    lines = [
        "#!/bin/bash",
        directive("job-name", name),
        directive("nodes", str(nodes)),
        directive("ntasks-per-node", "1"),
        directive("gpus-per-node", str(gpus_per_node)),
        directive("cpus-per-task", str(cpus_per_gpu * gpus_per_node)),
        directive("time", time_limit),
        directive("output", f"{name}-%j.out"),
    ]
    if partition:
        lines.append(directive("partition", partition))
    if account:
        lines.append(directive("account", account))
    quoted = " ".join(shlex.quote(a) for a in ["run", workload, *run_args])
    lines += [
        "",
        "set -euo pipefail",
        "# The first node of the allocation hosts the c10d rendezvous. (No pipe into head: under",
        "# pipefail, scontrol would die of SIGPIPE on a long host list and fail the job.)",
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'head_node=${nodes[0]}',
        "",
        "# NCCL settings worth checking on a new cluster (see README, multi-node):",
        "# export NCCL_DEBUG=INFO            # print the transport NCCL picked (IB, RoCE, sockets)",
        "# export NCCL_SOCKET_IFNAME=ib0     # the interface for bootstrap/socket traffic",
        "# export NCCL_IB_HCA=mlx5           # which InfiniBand adapters to use",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-" + str(cpus_per_gpu) + "}",
        "",
        "srun --kill-on-bad-exit=1 torchrun \\",
        '  --nnodes="$SLURM_JOB_NUM_NODES" \\',
        f"  --nproc-per-node={gpus_per_node} \\",
        '  --rdzv-id="$SLURM_JOB_ID" \\',
        "  --rdzv-backend=c10d \\",
        f'  --rdzv-endpoint="$head_node:{port}" \\',
        f'  -m trainperf {quoted} --out "runs/{shlex.quote(workload)}-$SLURM_JOB_ID"',
        "",
    ]
    return "\n".join(lines)
