"""What one training step asks of the host, counted on any machine (a CPU will do): the operators it
dispatches, those that launch work, those that make a GPU and its host wait for each other, the
tensors it builds from host data, and the host time spent outside operators.

On a GPU every dispatched operator costs host time (Python, the dispatcher, a kernel launch: a few
microseconds) while the device runs asynchronously; a step whose host work exceeds its device work is
launch-bound, and every synchronisation drains the device's queue. These counts do not depend on the
device, so a CPU run predicts where a GPU step will stall (compare ../shared/gpu: RNN-T at 0.1 % MFU).

Synchronisations, by kind:
- `item`: a value read back to the host (`.item()`, `float(t)`, `bool(t)`: aten::_local_scalar_dense);
- `data-dependent shape`: an output whose size only the device knows (nonzero, masked_select, a
  boolean-mask index, unique, repeat_interleave without output_size, bincount);
- `host copy`: `.cpu()`, `.numpy()`, `.tolist()` of a tensor;
- `device synchronize`: an explicit wait (trainperf.devices.synchronize).
`host data` counts the step's host-to-device copies: host tensors moved to the device, and tensors
made on the device from Python or NumPy data (torch.tensor, as_tensor, from_numpy given a device); on
a GPU each is a pageable copy, before which CUDA synchronises the stream.

Counted as if every tensor of the step lived on the device, as it does on a GPU, except what torch
keeps on the host by design: the optimizers' step counters (reading them is no synchronisation), and
torch's own host-side scalars.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from trainperf import devices
from trainperf.contract import Assets, Recipe, RuntimeContext, Workload
from trainperf.runtime import speedups
from trainperf.runtime.step import TrainStep

aten = torch.ops.aten

_DATA_DEPENDENT = {aten.nonzero, aten.masked_select, aten.unique_dim, aten._unique, aten._unique2,
                   aten.unique_consecutive, aten.unique_dim_consecutive, aten.bincount, aten.masked_scatter}
# Allocations and other operators that launch no kernel on a GPU (views are found by their schema).
_NO_KERNEL = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided,
              aten.lift_fresh, aten.detach, aten._local_scalar_dense, aten.set_, aten.resize_, aten.sym_size,
              aten.sym_stride, aten.sym_numel, aten.is_same_size, aten._has_compatible_shallow_copy_type}
# Operators whose outputs at these positions torch always keeps on the host (whatever the inputs).
_HOST_OUTPUTS = {aten._pack_padded_sequence: (1,)}  # (data, batch_sizes): batch_sizes is a CPU tensor
SYNC_KINDS = ("item", "data-dependent shape", "host copy", "device synchronize")
_TORCH_DIR = os.path.dirname(torch.__file__)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED_FILES = {__file__, contextlib.__file__}


def _site(depth: int = 2) -> str:
    """Where the current operator was called from: the innermost frame outside torch (and this module),
    named relative to the package when it is trainperf's ('workloads/gnmt/model.py:88 (forward)')."""
    frame = sys._getframe(depth)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and path not in _SKIPPED_FILES:
            shown = os.path.relpath(path, _PACKAGE_DIR) if path.startswith(_PACKAGE_DIR) else os.path.basename(path)
            node = torch._C._current_autograd_node()  # inside backward: which forward operator's gradient
            during = f" in {node.name()}" if node is not None else ""
            return f"{shown}:{frame.f_lineno} ({frame.f_code.co_name}){during}"
        frame = frame.f_back
    return "unknown"


def sync_kind(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Why `func` with these arguments makes the host wait for the device (None: it does not)."""
    packet = func.overloadpacket
    if packet is aten._local_scalar_dense:
        return "item"
    if packet in _DATA_DEPENDENT:
        return "data-dependent shape"
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "data-dependent shape"
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return "data-dependent shape"  # a boolean mask is turned into indices by nonzero
    return None


class Residency:
    """Which tensors of the counted step live on the host even on a GPU, so that reading them is no
    synchronisation: torch's optimizer step counters, tensors built from host data (until moved to the
    step's device), host copies, and what operators make of host tensors alone. Every other tensor is
    taken to be on the device, as it is on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # id -> weak reference: a WeakSet would compare tensors with == (elementwise) on a hash clash.
        self._host: dict[int, weakref.ref] = {}

    def host(self, tensor: Any) -> bool:
        if not isinstance(tensor, torch.Tensor):
            return True  # a Python number
        if self.device.type != "cpu" and tensor.device.type == "cpu":
            return True  # a real device: where the tensor is says it
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def mark_host(self, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):
            self._host[id(tensor)] = weakref.ref(tensor)

    def mark_device(self, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):
            self._host.pop(id(tensor), None)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The step counters torch keeps on the host (non-capturable, unfused optimizers)."""
        for state in optimizer.state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.dim() == 0:
                self.mark_host(step)


class _Dispatched(TorchDispatchMode):
    """Counts every operator dispatched (forward, backward and the optimizer alike), and the
    synchronisations among them (on tensors `residency` places on the device)."""

    def __init__(self, residency: Residency | None = None, replays: bool = False) -> None:
        super().__init__()
        # replays: each step's operators and their output shapes, with where they were called from, kept to
        # compare two steps (`next_replay`): what CUDA Graphs would replay must be the same work.
        self.replays: list[list[tuple[str, str, str]]] | None = [[]] if replays else None
        self.ops: Counter[str] = Counter()
        self.kernels = 0
        self.syncs: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.residency = residency or Residency(torch.device("cpu"))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.ops[str(func.overloadpacket)] += 1
        if not (func.is_view or func.overloadpacket in _NO_KERNEL):
            self.kernels += 1
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_host = bool(inputs) and all(self.residency.host(t) for t in inputs)
        kind = sync_kind(func, args, kwargs)
        if kind and not on_host:
            self.syncs[kind] += 1
            self.sites[f"{kind}: {_site()}"] += 1
        out = func(*args, **kwargs)
        if self.replays is not None:
            shapes = ",".join(str(list(t.shape)) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
            self.replays[-1].append((str(func), shapes, _site(2)))
        if on_host:  # what is made of host tensors alone stays on the host
            for tensor in pytree.tree_leaves(out):
                self.residency.mark_host(tensor)
        for index in _HOST_OUTPUTS.get(func.overloadpacket, ()):
            self.residency.mark_host(out[index])
        return out


def first_difference(before: list[tuple[str, str, str]], after: list[tuple[str, str, str]]) -> str | None:
    """Where two replays of a step part: the first operator that differs in kind or output shapes (what a
    captured graph could not replay), or one step's extra operators; None when they are the same work."""
    for (op_a, shapes_a, _), (op_b, shapes_b, site) in zip(before, after, strict=False):
        if op_a != op_b:
            return f"{site}: {op_b} where the step before ran {op_a} (another path through the step)"
        if shapes_a != shapes_b:
            return f"{site}: {op_b} made {shapes_b} where the step before made {shapes_a}"
    if len(before) != len(after):
        longer = after if len(after) > len(before) else before
        extra = longer[min(len(before), len(after))]
        return (f"{extra[2]}: {extra[0]} and {abs(len(after) - len(before))} more operators in one step than in "
                "the other")
    return None


def _on_host(device: Any) -> bool:
    """Whether a factory's `device` argument asks for the host: none (torch's default device), or the
    string "cpu". A torch.device is taken to be the step's device: that is what the step's code passes
    (a run on a CPU cannot tell the two apart otherwise)."""
    return device is None or (isinstance(device, str) and device.startswith("cpu"))


_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
              torch.randperm, torch.arange, torch.linspace, torch.logspace, torch.eye, torch.empty_strided,
              torch.scalar_tensor}


class _HostFactories(TorchFunctionMode):
    """A tensor factory called without a device makes a host tensor (torch's default device), such as
    torchvision's `torch.empty(1).uniform_(...).item()` for a random choice: reading it is no sync.
    (See _on_host for what a device argument says.)"""

    def __init__(self, residency: Residency) -> None:
        super().__init__()
        self.residency = residency

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FACTORIES and _on_host(kwargs.get("device")):
            self.residency.mark_host(out)
        return out


@contextlib.contextmanager
def _host_hooks(syncs: Counter[str], host_data: Counter[str], sites: Counter[str], residency: Residency
                ) -> Iterator[None]:
    """At the Python level, what the dispatcher does not show: copies of device tensors to the host,
    explicit device waits, tensors built from host data (and their moves to the device)."""
    saved: list[tuple[Any, str, Any]] = []

    inside = [False]  # a wrapper's own call of torch comes back through torch's function modes

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapper = make(original)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                return original(*args, **kwargs)
            inside[0] = True
            try:
                return wrapper(*args, **kwargs)
            finally:
                inside[0] = False

        saved.append((owner, name, original))
        setattr(owner, name, guarded)

    def ours() -> bool:
        """Called from outside torch (torch's own host-side bookkeeping is not counted): the frame
        above the wrapper that asks (frames: ours, the wrapper, guarded, the caller)."""
        return not sys._getframe(3).f_code.co_filename.startswith(_TORCH_DIR)

    def host_copy(original: Any) -> Any:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not residency.host(tensor):  # a device tensor read back, by whomever (torch's code too)
                syncs["host copy"] += 1
                sites[f"host copy: {_site()}"] += 1
                if original is torch.Tensor.cpu and tensor.device.type == "cpu":
                    # A distinct host tensor (on a CPU, .cpu() returns the tensor itself), made outside the
                    # counting: the copy stands for the transfer, not for operators of the step.
                    with _disable_current_modes():
                        copy = tensor.clone()
                    residency.mark_host(copy)
                    return copy
            result = original(tensor, *args, **kwargs)
            residency.mark_host(result)
            return result
        return counted

    def from_host(original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not (args and isinstance(args[0], torch.Tensor)):  # a tensor given: no data from the host
                if _on_host(kwargs.get("device")):
                    residency.mark_host(result)  # a host tensor: moving it to the device is counted then
                elif ours():  # made on a device from host data: a copy (torch's own are host scalars)
                    host_data[f"torch.{original.__name__}"] += 1
                    sites[f"torch.{original.__name__}: {_site()}"] += 1
            return result
        return counted

    def move(original: Any) -> Any:
        def moved(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            result = original(tensor, *args, **kwargs)
            target = next((a for a in (*args, kwargs.get("device")) if isinstance(a, (str, torch.device))), None)
            if residency.host(tensor) and target is not None and torch.device(target) == residency.device:
                host_data["host to device"] += 1  # by whomever: torch's code too
                sites[f"host to device: {_site()}"] += 1
                if result is tensor:  # on a CPU the move returns the tensor itself: it is a device tensor now
                    result = tensor.clone()
                residency.mark_device(result)
            return result
        return moved

    for method in ("cpu", "numpy", "tolist"):
        patch(torch.Tensor, method, host_copy)
    patch(torch.Tensor, "to", move)
    patch(devices, "synchronize", lambda original: lambda device: (
        syncs.update(["device synchronize"]), sites.update([f"device synchronize: {_site()}"]), original(device)))
    for factory in ("tensor", "as_tensor", "from_numpy"):
        patch(torch, factory, from_host)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


@dataclass
class StepCounts:
    """One training step's demands on the host (the means over the counted steps)."""

    workload: str
    recipe: str
    overrides: list[str]
    batch_size: int
    ops: float  # operators dispatched per step
    kernels: float  # of which launch device work (views and allocations left out)
    syncs: dict[str, float]  # host-device synchronisations per step, by kind (SYNC_KINDS)
    host_data: float  # tensors built from host data per step
    step_ms: float | None  # wall time of a step on this machine (median; None: not timed)
    host_ms: float | None  # of which outside operators: Python and framework code (median)
    top_ops: list[tuple[str, float]] = field(default_factory=list)  # the most frequent operators per step
    # Where the synchronisations and host-data tensors come from, per step: "kind: file:line (function)".
    sites: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"
    # Where two counted steps of the same batch did different work (first_difference); None: the same (or one
    # step counted). A step that differs cannot be captured once and replayed.
    unstable: str | None = None

    @property
    def sync_total(self) -> float:
        return sum(self.syncs.values())

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sync_total": self.sync_total}


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """The profiler's native library logs every start and stop on file descriptor 2 (and, on a CUDA
    build without a GPU, a device-count error): silenced while inside. Python errors are unaffected."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _time_inside_ops(step: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds of one call of `step`, seconds inside outermost aten operators), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with quiet_native_stderr():
        prof.start()
    try:
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
    finally:
        with quiet_native_stderr():
            prof.stop()
    inside = 0.0
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:  # outermost: its time covers the operators it calls
            inside += event.cpu_time_total / 1e6
    return wall, inside


def count_step(workload: Workload, recipe: Recipe, ctx: RuntimeContext, assets: Assets, overrides: list[str],
               warmup: int = 1, steps: int = 2, timed_steps: int = 2) -> StepCounts:
    """Count `steps` training steps of `recipe` (after `warmup` steps, which create optimizer state and
    whatever a library keeps from its first call) on one synthetic batch, eager (no compile or graphs:
    they would hide the operators); then time `timed_steps` more under torch.profiler for the host time
    outside operators (0: not timed)."""
    recipe = recipe.with_overrides([*overrides, "compile=false", "cuda_graphs=false", "async_eval=false"])
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, assets)
    step = TrainStep(parts, 1000, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    parts.model.train()
    residency = Residency(ctx.device)
    # The warm-up is watched too (its counts dropped): what it moved to the host for good (FBGEMM's feature
    # dimensions, copied once at its first call) is a host tensor in the counted steps, as on a GPU.
    with _host_hooks(Counter(), Counter(), Counter(), residency), _HostFactories(residency), _Dispatched(residency):
        for _ in range(warmup):
            step(batch)
    ctx.synchronize()
    residency.add_optimizer(parts.optimizer)
    mode = _Dispatched(residency, replays=steps > 1)
    host_data: Counter[str] = Counter()
    with _host_hooks(mode.syncs, host_data, mode.sites, residency), _HostFactories(residency), mode:
        for i in range(steps):
            if mode.replays is not None and i:
                mode.replays.append([])
            step(batch)
    unstable = None
    if mode.replays is not None:
        unstable = next((d for a, b in zip(mode.replays, mode.replays[1:], strict=False)
                         if (d := first_difference(a, b))), None)
    walls, hosts = [], []
    for _ in range(timed_steps):
        wall, inside = _time_inside_ops(lambda: (step(batch), ctx.synchronize()))
        walls.append(wall)
        hosts.append(max(wall - inside, 0.0))
    per = 1.0 / steps
    return StepCounts(
        workload=workload.name, recipe=recipe.name, overrides=list(overrides),
        batch_size=workload.batch_samples(batch), ops=sum(mode.ops.values()) * per, kernels=mode.kernels * per,
        syncs={kind: mode.syncs.get(kind, 0) * per for kind in SYNC_KINDS},
        host_data=sum(host_data.values()) * per,
        step_ms=statistics.median(walls) * 1e3 if walls else None,
        host_ms=statistics.median(hosts) * 1e3 if hosts else None,
        top_ops=[(name, n * per) for name, n in mode.ops.most_common(8)], device=str(ctx.device),
        sites={site: n * per for site, n in mode.sites.most_common()}, unstable=unstable)


def probe(workload: Workload, ctx: RuntimeContext, sets: list[str] | None = None, recipe_name: str | None = None,
          warmup: int = 2, steps: int = 2, timed_steps: int = 2) -> StepCounts:
    """The counts of `workload`'s full-scale step at its `step_probe` settings (then `sets`), built as
    a synthetic benchmark builds it: no dataset. Two warm-up steps: the first makes the optimizers' state, the
    second is where DDP rebuilds its buckets (a broadcast, once: TorchRec's dense part is under DDP)."""
    overrides = [*workload.step_probe, *(sets or [])]
    recipe = workload.recipe("full", recipe_name).with_overrides(overrides)
    workload.check_recipe(recipe)
    assets = Assets(workload.assets(recipe, None))
    return count_step(workload, recipe, ctx, assets, overrides, warmup=warmup, steps=steps, timed_steps=timed_steps)


def table_text(rows: list[StepCounts]) -> str:
    lines = [f"{'workload':<12} {'batch':>5} {'ops/step':>9} {'kernels':>8} {'syncs':>6} {'host data':>9} "
             f"{'host ms':>8} {'step ms':>8}  sync kinds"]
    for r in rows:
        kinds = ", ".join(f"{k} {v:g}" for k, v in r.syncs.items() if v) or "-"
        host = "-" if r.host_ms is None else f"{r.host_ms:.1f}"
        wall = "-" if r.step_ms is None else f"{r.step_ms:.1f}"
        lines.append(f"{r.workload:<12} {r.batch_size:>5} {r.ops:>9,.0f} {r.kernels:>8,.0f} {r.sync_total:>6g} "
                     f"{r.host_data:>9g} {host:>8} {wall:>8}  {kinds}")
    return "\n".join(lines)
