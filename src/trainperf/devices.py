"""Every CUDA entry point trainperf calls, in one place, and the rule they share: a device handed to
torch.cuda always carries its index.

torch accepts a bare `cuda` in some calls (factories, `synchronize`: the current device) and rejects
it in others (`set_device`: "Expected a torch.device with a specified index"). A bare `cuda` that
slipped through to `set_device` once crashed every GPU run while every CPU test passed. So a device
string is resolved once, here (`resolve`: a bare `cuda` becomes `cuda:<LOCAL_RANK>`, or the current
device), and everything that takes a device afterwards gets the indexed one. No other module calls
`torch.cuda` (tests/runtime/test_devices.py checks the source tree and runs these functions against
strict fakes of torch's CUDA entry points).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainperf.errors import TrainperfError

DEVICE_HELP = "expected cpu, cuda or cuda:N"


def available() -> bool:
    return torch.cuda.is_available()


def count() -> int:
    return torch.cuda.device_count() if available() else 0


def _local_rank_from_env() -> int | None:
    value = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID"))
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def resolve(spec: str | torch.device | None = None, local_rank: int | None = None) -> torch.device:
    """The device a process uses, always indexed for CUDA. `spec`: cpu, cuda, cuda:N, or None (cuda
    when present, else cpu). A bare cuda is cuda:<local_rank> (LOCAL_RANK from the launcher when not
    given), else the current device. Bad input is one line naming the option."""
    if spec is None:
        spec = "cuda" if available() else "cpu"
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError, ValueError):
        raise TrainperfError(f"--device {str(spec)!r}: {DEVICE_HELP}") from None
    if dev.type not in ("cpu", "cuda"):
        raise TrainperfError(f"--device {str(spec)!r}: only cpu and cuda devices are supported ({DEVICE_HELP})")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not available():
        raise TrainperfError(f"--device {str(spec)!r}: no CUDA GPU is visible on this machine")
    visible = count()
    if dev.index is not None:
        if dev.index >= visible:
            raise TrainperfError(f"--device {str(spec)!r}: this machine shows {visible} GPU(s) "
                                 f"(cuda:0 to cuda:{visible - 1})")
        return dev
    rank = local_rank if local_rank is not None else _local_rank_from_env()
    if rank is None:
        return torch.device("cuda", torch.cuda.current_device())
    if rank < visible:
        return torch.device("cuda", rank)
    if visible == 1:
        # One GPU per task (Slurm's GPU binding, CUDA_VISIBLE_DEVICES set per process): it is device 0.
        return torch.device("cuda", 0)
    raise TrainperfError(f"local rank {rank}: this machine shows {visible} GPUs; start at most one process per GPU")


def _indexed(device: torch.device) -> torch.device:
    # A second line of defence: a bare cuda device here is a trainperf bug, not a user's mistake.
    if device.type == "cuda" and device.index is None:
        raise ValueError(f"{device}: a CUDA device without an index reached a CUDA call (resolve it first)")
    return device


def activate(device: torch.device) -> None:
    """Make `device` this process's current CUDA device (collectives, graphs and streams use it)."""
    if device.type == "cuda":
        torch.cuda.set_device(_indexed(device))


def timing_event(device: torch.device) -> Any:
    """A CUDA event that records when `device` (the current one: events record on its current stream) reaches
    it (`record()`; `elapsed_time(other)` in ms once both have passed): a step's device time without waiting
    for it."""
    if device.type != "cuda":
        raise ValueError(f"timing events are CUDA events; {device} is not a CUDA device")
    return torch.cuda.Event(enable_timing=True)


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(_indexed(device))


def name(device: torch.device) -> str:
    return torch.cuda.get_device_name(_indexed(device))


def tf32_allowed() -> bool:
    """Whether fp32 convolutions or matrix products may run in TF32 on tensor cores."""
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32
                or torch.get_float32_matmul_precision() != "highest")


def names() -> list[str]:
    """The name of every visible GPU."""
    return [torch.cuda.get_device_name(torch.device("cuda", i)) for i in range(count())]


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return tuple(torch.cuda.get_device_capability(_indexed(device)))  # type: ignore[return-value]


def total_memory(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(_indexed(device)).total_memory)


def free_memory(device: torch.device) -> int:
    """Bytes this process could still allocate on the GPU: what the driver has free (torch.cuda.mem_get_info)
    plus what torch's caching allocator holds unused (a probe step's freed activations stay cached: the
    driver counts them as taken)."""
    dev = _indexed(device)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return int(torch.cuda.mem_get_info(dev)[0]) + max(0, int(cached))


def versions() -> dict[str, str | None]:
    """CUDA, cuDNN and NCCL versions of this torch build (None where it has none)."""
    if not available():
        return {"cuda": None, "cudnn": None, "nccl": None}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        nccl: str | None = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        nccl = None
    return {"cuda": torch.version.cuda, "cudnn": str(cudnn) if cudnn else None, "nccl": nccl}


@dataclass(frozen=True)
class MemoryPeaks:
    """What a step held on the device. `reserved` is what a user sizes a batch by: the caching
    allocator's segments, CUDA Graph pools included (a graph replays into memory it reserved at
    capture, which `allocated` no longer counts). `in_use` is the whole device as the driver sees it
    (the CUDA context and other processes included), None where unknown."""

    allocated_mib: float
    reserved_mib: float
    in_use_mib: float | None
    total_mib: float | None


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(_indexed(device))


def memory_peaks(device: torch.device) -> MemoryPeaks:
    """Peak allocated and reserved memory since the last `reset_peaks`, and the device's use now."""
    dev = _indexed(device)
    free, total = torch.cuda.mem_get_info(dev)
    return MemoryPeaks(allocated_mib=torch.cuda.max_memory_allocated(dev) / 2**20,
                       reserved_mib=torch.cuda.max_memory_reserved(dev) / 2**20,
                       in_use_mib=(total - free) / 2**20, total_mib=total / 2**20)


def side_stream(device: torch.device) -> Any:
    """A new stream on `device`, for copies that overlap the computation."""
    return torch.cuda.Stream(device=_indexed(device))


def current_stream(device: torch.device) -> Any:
    return torch.cuda.current_stream(_indexed(device))


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Queue the work inside on `stream` instead of the current one."""
    with torch.cuda.stream(stream):
        yield


def copy_async(tensor: torch.Tensor, device: torch.device, stream: Any) -> torch.Tensor:
    """`tensor` on `device`, copied on `stream` (pinned host memory makes it asynchronous); the copy is
    kept alive for the current stream, which will read it."""
    with on_stream(stream):
        moved = tensor.to(_indexed(device), non_blocking=True)
    return moved


def from_host(data: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of Python data on `device`, without waiting for the device: made in pinned host memory on a
    GPU (torch's host allocator keeps the block until the copy has run) and copied with non_blocking.
    `torch.tensor(data, device=)` copies from pageable memory and waits for the stream before returning."""
    host = torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def hand_over(tensors: tuple[torch.Tensor, ...], device: torch.device, stream: Any) -> None:
    """Make the current stream wait for `stream`'s copies of `tensors`, and tell the allocator they are
    used there (so their memory is not reused while the current stream still reads them)."""
    current = current_stream(device)
    current.wait_stream(stream)
    for tensor in tensors:
        tensor.record_stream(current)


def sync_debug_mode(mode: str) -> None:
    """torch's check for operations that synchronise with the host ("error" raises on them)."""
    torch.cuda.set_sync_debug_mode(mode)


def gpu_processes(index: int) -> list[int]:
    """The pids of the processes holding a context on GPU `index` (NVML, through torch's own use of it);
    empty where NVML cannot tell (no driver library, or a GPU it does not see)."""
    try:
        import pynvml  # shipped with torch's CUDA wheels (nvidia-ml-py)

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception:  # noqa: BLE001 - a monitor never ends a run: no answer is an empty answer
        return []
