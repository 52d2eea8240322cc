"""What machine and software a result came from: versions, CPU, GPU, git sha, MLPerf platform name."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from trainperf import devices


def cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The first processor's fields of /proc/cpuinfo (model name, cpu MHz, cpu cores, cache size,
    flags as a set) and the number of sockets; empty where the file cannot be read."""
    info: dict[str, Any] = {}
    sockets: set[str] = set()
    try:
        text = path.read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            sockets.add(value)
        elif key == "flags" and "flags" not in info:
            info["flags"] = set(value.split())
        elif key in ("model name", "cpu MHz", "cpu cores", "cache size") and key not in info:
            info[key] = value
    if sockets:
        info["sockets"] = str(len(sockets))
    return info


def cpu_model() -> str:
    return cpuinfo().get("model name") or platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    return devices.names()


def platform_name(device: torch.device, world_size: int = 1) -> str:
    """The `submission_platform` value: '<N>x<accelerator>' or '<cores>-core <CPU>'."""
    if device.type == "cuda":
        return f"{world_size}x{devices.name(device)}"
    return f"{os.cpu_count()}-core {cpu_model()}"


def system_name(device: torch.device, world_size: int = 1) -> str:
    """The machine's name in the submission layout and in reports ("amd_epyc_7b13_2cpu", "8xnvidia_h100"):
    one name per machine, whether it ran one run or a series, so that `report` never compares a
    machine with itself."""
    if device.type == "cuda":
        name = f"{world_size}x{devices.name(device)}"
    else:
        name = f"{cpu_model()} {os.cpu_count()}cpu"
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()


def git_sha() -> str | None:
    """The commit of the trainperf source tree, when it runs from a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torchvision_version() -> str | None:
    try:
        import torchvision
    except ImportError:
        return None
    return torchvision.__version__


def describe(device: torch.device, world_size: int = 1) -> dict[str, Any]:
    """Everything needed to say where a number came from."""
    return {
        "platform": platform_name(device, world_size),
        "system": system_name(device, world_size),
        "device": str(device),
        "world_size": world_size,
        # The collective backend of the process group this process joined (nccl, gloo), or None.
        "backend": (torch.distributed.get_backend() if torch.distributed.is_available()
                    and torch.distributed.is_initialized() else None),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpus": gpu_names(),
        "cuda": devices.versions()["cuda"],
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            **{name: _version(name) for name in ("trainperf", "mlperf-logging", "numpy", "scikit-learn")},
            # torch's own strings carry the build (+cpu, +cu130), which the wheel metadata drops.
            "torch": torch.__version__,
            "torchvision": _torchvision_version(),
        },
        "git_sha": git_sha(),
    }
