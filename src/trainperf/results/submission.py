"""The MLPerf submission layout: results/<system>/<benchmark>/result_<i>.txt and systems/<system>.json.

The system description is filled from the machine; a field trainperf cannot read stays empty
(nothing is invented), which the official system-description checker accepts.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from trainperf import devices
from trainperf.files import write_json_atomic
from trainperf.runtime import environment

# Every field the official system_desc_checker requires for training.
FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_memory_capacity",
    "host_storage_type", "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework", "other_software_stack",
    "operating_system", "sw_notes",
)
# submission_status in the log -> the system description's status wording.
STATUS = {"onprem": "Available on-premise", "cloud": "Available cloud", "preview": "Preview",
          "research": "Research, Development, or Internal (RDI)"}


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 ** 2:.0f} GB"
    except (OSError, ValueError, IndexError):
        pass
    return ""


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def default_system_name(device: torch.device, world_size: int) -> str:
    return environment.system_name(device, world_size)


def system_description(system_name: str, org: str, division: str, status: str, device: torch.device,
                       world_size: int) -> dict[str, Any]:
    cpu = environment.cpuinfo()
    stack = devices.versions() if device.type == "cuda" else {}
    versions = environment.describe(device, world_size)["versions"]
    desc = {field: "" for field in FIELDS}
    desc.update({
        "submitter": org,
        "division": division,
        "status": STATUS.get(status, status),
        "system_name": system_name,
        "number_of_nodes": "1",
        "host_processors_per_node": cpu.get("sockets", ""),
        "host_processor_model_name": environment.cpu_model(),
        "host_processor_core_count": cpu.get("cpu cores", ""),
        "host_processor_vcpu_count": str(os.cpu_count() or ""),
        "host_processor_frequency": f"{float(cpu['cpu MHz']):.0f} MHz" if "cpu MHz" in cpu else "",
        "host_processor_caches": cpu.get("cache size", ""),
        "host_memory_capacity": _memory(),
        "accelerators_per_node": str(world_size if device.type == "cuda" else 0),
        "accelerator_model_name": devices.name(device) if device.type == "cuda" else "",
        "accelerator_memory_capacity": (f"{devices.total_memory(device) / 1024 ** 3:.0f} GB"
                                        if device.type == "cuda" else ""),
        "framework": f"PyTorch {torch.__version__}",
        "other_software_stack": {
            key: value for key, value in {
                "trainperf": versions["trainperf"],
                "python": platform.python_version(),
                "torchvision": versions["torchvision"],
                "cuda_version": stack.get("cuda"),
                "cudnn_version": stack.get("cudnn"),
                "nccl_version": stack.get("nccl"),
            }.items() if value
        },
        "operating_system": _os_name(),
    })
    return desc


def layout_paths(out: Path, system: str, benchmark: str) -> tuple[Path, Path, Path]:
    """(results folder for the logs, systems json, trainperf's own per-run details folder)."""
    return (out / "results" / system / benchmark, out / "systems" / f"{system}.json",
            out / "trainperf" / system / benchmark)


def write_system(path: Path, desc: dict[str, Any]) -> None:
    write_json_atomic(path, desc)
