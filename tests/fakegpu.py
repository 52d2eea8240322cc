"""A GPU machine for tests on a CPU: torch's CUDA entry points replaced by strict fakes.

torch's `set_device` rejects a device without an index ("Expected a torch.device with a specified
index or an integer"); its other CUDA calls quietly take a bare `cuda` as the current device. The fakes
here reject a bare `cuda` (and a missing device) everywhere, and an index the machine does not have,
so the bug class that crashed every GPU run on its first call fails on a CPU. Tensors stay on the
CPU: a TorchFunctionMode checks every device argument given to a torch function (factories,
`Tensor.to`, `Module.to`), then maps it to the CPU, so whole runs go through trainperf's GPU-only
branches (pinned copies, side streams, prefetch threads, memory figures) without a GPU.

Every call is recorded (`calls`), so a test can assert that the code it means to cover was reached.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

TORCH_MESSAGE = "Expected a torch.device with a specified index or an integer, but got:"


class BareDevice(ValueError):
    """What torch raises for a device without an index where it needs one."""


@dataclass
class FakeProperties:
    name: str
    total_memory: int
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 132


class FakeStream:
    def __init__(self, machine: FakeCuda, device: torch.device) -> None:
        self.machine, self.device = machine, device
        self.waited_for: list[FakeStream] = []

    def is_capturing(self) -> bool:
        return False

    def wait_stream(self, other: Any) -> None:
        if not isinstance(other, FakeStream):
            raise TypeError(f"wait_stream needs a stream, got {other!r}")
        self.machine.calls.append(("Stream.wait_stream", self.device.index))
        self.waited_for.append(other)


@dataclass
class FakeCuda:
    """`count` GPUs named `gpu_name`; `current` is torch's current device index."""

    count: int = 1
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    current: int = 0
    capability: tuple[int, int] = (9, 0)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    stream_stack: list[FakeStream] = field(default_factory=list)

    # -- the rule ------------------------------------------------------------------------------
    def index(self, what: str, device: Any) -> int:
        """The index of `device`, as torch's strict path demands it; anything else raises."""
        if isinstance(device, int) and not isinstance(device, bool):
            idx = device
        else:
            if isinstance(device, str):
                device = torch.device(device)
            if not isinstance(device, torch.device) or device.type != "cuda" or device.index is None:
                raise BareDevice(f"{what}: {TORCH_MESSAGE}{device}")
            idx = device.index
        if not 0 <= idx < self.count:
            raise RuntimeError(f"{what}: CUDA error: invalid device ordinal {idx} (this machine has {self.count})")
        self.calls.append((what, idx))
        return idx

    def names_called(self) -> set[str]:
        return {name for name, _ in self.calls}

    # -- torch.cuda ----------------------------------------------------------------------------
    def set_device(self, device: Any) -> None:
        self.current = self.index("set_device", device)

    def current_device(self) -> int:
        return self.current

    def synchronize(self, device: Any = None) -> None:
        self.index("synchronize", device)

    def get_device_name(self, device: Any = None) -> str:
        self.index("get_device_name", device)
        return self.gpu_name

    def get_device_properties(self, device: Any = None) -> FakeProperties:
        self.index("get_device_properties", device)
        return FakeProperties(self.gpu_name, self.total)

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        self.index("get_device_capability", device)
        return self.capability

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self.index("mem_get_info", device)
        return (self.total - 3 * 2**30, self.total)

    def max_memory_allocated(self, device: Any = None) -> int:
        self.index("max_memory_allocated", device)
        return 1 * 2**30

    def max_memory_reserved(self, device: Any = None) -> int:
        self.index("max_memory_reserved", device)
        return 2 * 2**30

    def memory_reserved(self, device: Any = None) -> int:
        self.index("memory_reserved", device)
        return 2 * 2**30

    def memory_allocated(self, device: Any = None) -> int:
        self.index("memory_allocated", device)
        return 1 * 2**30

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.index("reset_peak_memory_stats", device)

    def stream_class(self) -> type:
        machine = self

        class Stream(FakeStream):
            def __init__(self, device: Any = None, priority: int = 0) -> None:
                idx = machine.index("Stream", device)
                super().__init__(machine, torch.device("cuda", idx))

        return Stream

    def current_stream(self, device: Any = None) -> FakeStream:
        idx = self.index("current_stream", device)
        return FakeStream(self, torch.device("cuda", idx))

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        if not isinstance(stream, FakeStream):
            raise TypeError(f"torch.cuda.stream needs a stream, got {stream!r}")
        self.calls.append(("stream", stream.device.index))
        self.stream_stack.append(stream)
        try:
            yield
        finally:
            self.stream_stack.pop()

    def event_class(self) -> type:
        machine = self

        class Event:
            """A timing event as strict as CUDA's: elapsed_time needs enable_timing and both events recorded."""

            def __init__(self, enable_timing: bool = False, **kwargs: Any) -> None:
                self.timing, self.at = enable_timing, None

            def record(self, stream: Any = None) -> None:
                machine.calls.append(("Event.record", machine.current_device()))
                self.at = time.perf_counter()

            def elapsed_time(self, end: Any) -> float:
                if not (self.timing and end.timing):
                    raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
                if self.at is None or end.at is None:
                    raise RuntimeError("Both events must be recorded before calculating elapsed time.")
                return (end.at - self.at) * 1e3

        return Event

    # -- installing it -------------------------------------------------------------------------
    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Replace torch's CUDA entry points (undone with the monkeypatch) and the Generator class."""
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(cuda, "is_bf16_supported", lambda *a, **k: True)
        for name in ("set_device", "current_device", "synchronize", "get_device_name", "get_device_properties",
                     "get_device_capability", "mem_get_info", "max_memory_allocated", "max_memory_reserved",
                     "memory_reserved", "memory_allocated",
                     "reset_peak_memory_stats", "current_stream", "stream"):
            monkeypatch.setattr(cuda, name, getattr(self, name))
        monkeypatch.setattr(cuda, "Stream", self.stream_class())
        monkeypatch.setattr(cuda, "Event", self.event_class())
        monkeypatch.setattr(cuda, "set_sync_debug_mode", lambda mode: self.calls.append(("set_sync_debug_mode", mode)))
        monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 27, 3))
        monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
        monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        # torch's device-generic API, which optimizers and loaders consult on their own.
        accel = torch.accelerator
        monkeypatch.setattr(accel, "is_available", lambda: True)
        monkeypatch.setattr(accel, "device_count", lambda: self.count)
        monkeypatch.setattr(accel, "current_accelerator", lambda check_available=False: torch.device("cuda"))
        monkeypatch.setattr(accel, "current_device_index", lambda: self.current)
        monkeypatch.setattr(accel, "set_device_index", self.set_device)
        monkeypatch.setattr(accel, "current_stream", lambda device=None: FakeStream(
            self, torch.device("cuda", self.current if device is None else self.index("current_stream", device))))
        machine = self
        real_generator = torch.Generator

        class Generator(real_generator):
            """torch.Generator on the CPU, its device argument checked."""

            def __new__(cls, device: Any = "cpu") -> Any:
                dev = torch.device(device)
                if dev.type == "cuda":
                    machine.index("Generator", dev)
                return real_generator.__new__(cls, device="cpu")

        monkeypatch.setattr(torch, "Generator", Generator)

        def pin_memory(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            machine.calls.append(("pin_memory", None))
            return tensor

        def record_stream(tensor: torch.Tensor, stream: Any) -> None:
            if not isinstance(stream, FakeStream):
                raise TypeError(f"record_stream needs a stream, got {stream!r}")
            machine.calls.append(("record_stream", stream.device.index))

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)


class OnTheCpu(TorchFunctionMode):
    """Every device argument of a torch function checked by the fake machine, then made the CPU."""

    def __init__(self, machine: FakeCuda) -> None:
        super().__init__()
        self.machine = machine

    def _cpu(self, what: str, value: Any) -> Any:
        if isinstance(value, torch.device) and value.type == "cuda":
            self.machine.index(what, value)
            return torch.device("cpu")
        if isinstance(value, str) and value.startswith("cuda"):
            self.machine.index(what, torch.device(value))
            return "cpu"
        return value

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.device:  # building a device object is not using one
            return func(*args, **kwargs)
        what = getattr(func, "__name__", str(func))
        args = tuple(self._cpu(what, a) for a in args)
        kwargs = {k: self._cpu(what, v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def gpu_machine(monkeypatch: pytest.MonkeyPatch, count: int = 1, **kwargs: Any) -> Iterator[FakeCuda]:
    """Inside: a machine with `count` (strictly faked) GPUs on which trainperf's code runs on the CPU.
    Threads started inside (a prefetching loader, background scoring) see the same machine: torch
    function modes are per thread, so each thread enters its own."""
    machine = FakeCuda(count=count, **kwargs)
    machine.install(monkeypatch)
    real_run = threading.Thread.run

    def run(thread: threading.Thread) -> None:
        with OnTheCpu(machine):
            real_run(thread)

    monkeypatch.setattr(threading.Thread, "run", run)
    with OnTheCpu(machine):
        yield machine
