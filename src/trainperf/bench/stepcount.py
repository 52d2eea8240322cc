"""What one training step asks of the host, counted on any machine (a CPU will do): the operators it
dispatches, those that launch work, those that make a GPU and its host wait for each other, the
tensors it moves from the host, and the host time spent outside operators.

On a GPU every dispatched operator costs host time (Python, the dispatcher, a kernel launch: a few
microseconds) while the device runs asynchronously; a step whose host work exceeds its device work is
launch-bound, and every synchronisation drains the device's queue. These counts do not depend on the
device, so a CPU run predicts where a GPU step will stall (compare ../shared/gpu: RNN-T at 0.1 % MFU).

Synchronisations, by kind (what `torch.cuda.set_sync_debug_mode("warn")` reports on a GPU):
- `item`: a value read back to the host (`.item()`, `float(t)`, `bool(t)`: aten::_local_scalar_dense);
- `data-dependent shape`: an output whose size only the device knows (nonzero, masked_select, a
  boolean-mask index, unique, repeat_interleave without output_size, bincount);
- `host copy`: a device tensor copied to the host in any form (`.cpu()`, `.numpy()`, `.tolist()`,
  `.to("cpu")`, `torch.as_tensor(t, device="cpu")`, `host.copy_(t)`);
- `blocking copy`: host data copied to the device without `non_blocking=True` (`torch.tensor(data,
  device=)`, `as_tensor(..., device=)`, `t.to(device)`, `device_t.copy_(host_t)`): torch's copy waits for
  the stream before it returns (cudaStreamSynchronize), whatever memory the data is in;
- `device synchronize`: an explicit wait (trainperf.devices.synchronize).
`host data` counts every host-to-device transfer of the step, blocking or not.

Every frame's code counts: trainperf's, and the libraries' (torchvision, TorchRec, torchao), whose
calls inside a step synchronise a GPU as much as the step's own; only torch's own package is taken for
bookkeeping (its host-side scalars: the optimizers' step counters). A file belongs to torch when a path
component says so, never by a prefix of its name (".../torchvision/" is not torch's).

Counted as if every tensor of the step lived on the device, as it does on a GPU, except what torch
keeps on the host by design: the optimizers' step counters (reading them is no synchronisation), and
what is made of host tensors alone. Checks that torch runs on a CPU only (F.one_hot's range checks,
which a GPU leaves to the scatter kernel's assert) are not counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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
from trainperf.contract import Assets, Recipe, RuntimeContext, StepProbe, Workload
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
SYNC_KINDS = ("item", "data-dependent shape", "host copy", "blocking copy", "device synchronize")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED_FILES = {__file__, contextlib.__file__}


def in_torch(path: str) -> bool:
    """Whether a code file is torch's own: inside torch's package folder, judged by path components (the
    sibling packages torchvision, torchrec, torchao share the prefix ".../site-packages/torch")."""
    return _kind(path)[0] == "torch"


@functools.lru_cache(maxsize=4096)
def _kind(path: str) -> tuple[str, str]:
    """(torch | skipped | library | code, how the file is named in a site) for a code file's path."""
    if path in _SKIPPED_FILES or not os.path.isabs(path):
        return "skipped", path
    path = os.path.abspath(path)
    if os.path.commonpath([_TORCH_DIR, path]) == _TORCH_DIR:
        return "torch", path
    if os.path.commonpath([_PACKAGE_DIR, path]) == _PACKAGE_DIR:
        return "code", os.path.relpath(path, _PACKAGE_DIR)
    parts = path.split(os.sep)
    if "site-packages" in parts:  # a library: named from its package down (torchvision/ops/boxes.py)
        return "library", "/".join(parts[parts.index("site-packages") + 1:])
    return "code", os.path.basename(path)


def _site(depth: int = 2) -> str:
    """Where the current operator was called from: the innermost frame outside torch (and this module),
    named relative to the package when it is trainperf's ('workloads/gnmt/model.py:88 (forward)'); a
    library's frame is followed by the first frame outside the libraries that called into it."""
    frame = sys._getframe(depth)
    found = ""
    while frame is not None:
        kind, shown = _kind(frame.f_code.co_filename)
        if kind in ("library", "code"):
            place = f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
            if not found:
                node = torch._C._current_autograd_node()  # inside backward: which forward operator's gradient
                found = place + (f" in {node.name()}" if node is not None else "")
                if kind == "code":
                    return found
            elif kind == "code":
                return f"{found} via {place}"
        frame = frame.f_back
    return found or "unknown"


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
        # Value reads ahead that torch makes on a CPU only (F.one_hot's range checks): not counted.
        self.cpu_only_reads = 0
        # Inside a transfer the Python hooks count (its own copy_ below is the same transfer).
        self.transferring = False

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
        self.host_data: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.residency = residency or Residency(torch.device("cpu"))

    def sync(self, kind: str, depth: int = 3) -> None:
        self.syncs[kind] += 1
        self.sites[f"{kind}: {_site(depth)}"] += 1

    def transfer(self, what: str, non_blocking: bool, depth: int = 3) -> None:
        """A host-to-device transfer: host data, and a synchronisation unless it was asked not to block."""
        self.host_data[what] += 1
        if non_blocking:
            self.sites[f"{what} (non-blocking): {_site(depth)}"] += 1
        else:
            self.sync("blocking copy", depth + 1)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        residency = self.residency
        self.ops[str(func.overloadpacket)] += 1
        if not (func.is_view or func.overloadpacket in _NO_KERNEL):
            self.kernels += 1
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_host = bool(inputs) and all(residency.host(t) for t in inputs)
        kind = sync_kind(func, args, kwargs)
        if kind == "item" and residency.cpu_only_reads:
            residency.cpu_only_reads -= 1
        elif kind and not on_host:
            self.sync(kind)
        if func.overloadpacket is aten.copy_ and not residency.transferring and len(args) > 1:
            into, source = residency.host(args[0]), residency.host(args[1])
            if into and not source:
                self.sync("host copy")
            elif source and not into and isinstance(args[1], torch.Tensor):
                self.transfer("copy_ from the host", bool(args[2] if len(args) > 2 else kwargs.get("non_blocking")))
        out = func(*args, **kwargs)
        if self.replays is not None:
            shapes = ",".join(str(list(t.shape)) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
            self.replays[-1].append((str(func), shapes, _site(2)))
        if on_host:  # what is made of host tensors alone stays on the host
            for tensor in pytree.tree_leaves(out):
                residency.mark_host(tensor)
        for index in _HOST_OUTPUTS.get(func.overloadpacket, ()):
            residency.mark_host(out[index])
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
_ONE_HOT = {torch.nn.functional.one_hot, torch._C._nn.one_hot}


class _HostFactories(TorchFunctionMode):
    """A tensor factory called without a device makes a host tensor (torch's default device), such as
    torchvision's `torch.empty(1).uniform_(...).item()` for a random choice: reading it is no sync.
    (See _on_host for what a device argument says.) And F.one_hot's value reads that torch makes on a CPU
    only: given num_classes, a GPU reads nothing (the scatter kernel asserts the range); without, one."""

    def __init__(self, residency: Residency) -> None:
        super().__init__()
        self.residency = residency

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _ONE_HOT:
            classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            before = self.residency.cpu_only_reads
            self.residency.cpu_only_reads = before + (2 if classes >= 0 else 1)
            try:
                return func(*args, **kwargs)
            finally:
                self.residency.cpu_only_reads = before
        out = func(*args, **kwargs)
        if func in _FACTORIES and _on_host(kwargs.get("device")):
            self.residency.mark_host(out)
        return out


def _move_target(args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """`Tensor.to`'s device (None: none named) and non_blocking, from any of its call forms: to(device,
    dtype, non_blocking, copy), to(dtype, non_blocking, copy), to(other, non_blocking, copy)."""
    target = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
    flags = [a for a in args if isinstance(a, bool)]
    return target, bool(kwargs.get("non_blocking", flags[0] if flags else False))


@contextlib.contextmanager
def _host_hooks(mode: _Dispatched) -> Iterator[None]:
    """At the Python level, what the dispatcher does not show on a CPU (where a move to the step's device
    is no operator at all): copies of device tensors to the host, explicit device waits, tensors built
    from host data and moved to the device."""
    residency = mode.residency
    saved: list[tuple[Any, str, Any]] = []

    inside = [False]  # a wrapper's own call of torch comes back through torch's function modes

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapper = make(original)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                return original(*args, **kwargs)
            inside[0] = residency.transferring = True
            try:
                return wrapper(*args, **kwargs)
            finally:
                inside[0] = residency.transferring = False

        saved.append((owner, name, original))
        setattr(owner, name, guarded)

    def ours() -> bool:
        """Called from outside torch (torch's own host-side scalars are not counted): the frame above the
        wrapper that asks (frames: ours, the wrapper, guarded, the caller)."""
        return not in_torch(sys._getframe(3).f_code.co_filename)

    def to_host(tensor: torch.Tensor, result: Any) -> Any:
        """`result`, the host copy of `tensor`: counted when `tensor` is on the device, made a distinct host
        tensor on a CPU (where the copy is the tensor itself), made outside the counting: it stands for the
        transfer, not for operators of the step."""
        if not residency.host(tensor):
            mode.sync("host copy", 4)
            if result is tensor and tensor.device.type == "cpu":
                with _disable_current_modes():
                    result = tensor.clone()
        residency.mark_host(result)
        return result

    def host_copy(original: Any) -> Any:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return to_host(tensor, original(tensor, *args, **kwargs))
        return counted

    def from_host(original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            device = kwargs.get("device")
            given = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if given is not None:  # a tensor given: a transfer only where `device` names another place
                if device is None:
                    return result
                if _on_host(device):
                    return to_host(given, result)
                if residency.host(given):
                    mode.transfer(f"torch.{original.__name__}", False, 4)
                    if result is given:
                        result = given.clone()
                    residency.mark_device(result)
                return result
            if _on_host(device):
                residency.mark_host(result)  # a host tensor: moving it to the device is counted then
            elif ours():  # made on the device from Python or NumPy data: a blocking copy
                mode.transfer(f"torch.{original.__name__}", False, 4)
            return result
        return counted

    def move(original: Any) -> Any:
        def moved(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            result = original(tensor, *args, **kwargs)
            target, non_blocking = _move_target(args, kwargs)
            if target is None:
                return result
            if _on_host(target):
                return to_host(tensor, result)
            if residency.host(tensor) and torch.device(target).type == residency.device.type:
                mode.transfer("host to device", non_blocking, 4)  # by whomever: torch's code too
                if result is tensor:  # on a CPU the move returns the tensor itself: it is a device tensor now
                    result = tensor.clone()
                residency.mark_device(result)
            return result
        return moved

    for method in ("cpu", "numpy", "tolist"):
        patch(torch.Tensor, method, host_copy)
    patch(torch.Tensor, "to", move)
    patch(devices, "synchronize", lambda original: lambda device: (mode.sync("device synchronize", 4),
                                                                   original(device)))
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


def _eager(recipe: Recipe) -> Recipe:
    """The recipe's step run eagerly (compile and graphs would hide its operators); what runs eagerly around a
    captured graph is the static-shapes step, so it is counted as such when graphs were on."""
    graphed = ["static_shapes=true"] if recipe.cuda_graphs else []
    return recipe.with_overrides([*graphed, "compile=false", "cuda_graphs=false", "async_eval=false"])


def count_step(workload: Workload, recipe: Recipe, ctx: RuntimeContext, assets: Assets, overrides: list[str],
               warmup: int = 1, steps: int = 2, timed_steps: int = 2) -> StepCounts:
    """Count `steps` training steps of `recipe` (after `warmup` steps, which create optimizer state and
    whatever a library keeps from its first call) on one synthetic batch, eager (no compile or graphs:
    they would hide the operators); then time `timed_steps` more under torch.profiler for the host time
    outside operators (0: not timed)."""
    recipe = _eager(recipe.with_overrides(overrides))
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, assets)
    step = TrainStep(parts, 1000, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    parts.model.train()
    residency = Residency(ctx.device)
    # The warm-up is watched too (its counts dropped): what it moved to the host for good (FBGEMM's feature
    # dimensions, copied once at its first call) is a host tensor in the counted steps, as on a GPU.
    warming = _Dispatched(residency)
    with _host_hooks(warming), _HostFactories(residency), warming:
        for _ in range(warmup):
            step(batch)
    ctx.synchronize()
    residency.add_optimizer(parts.optimizer)
    mode = _Dispatched(residency, replays=steps > 1)
    with _host_hooks(mode), _HostFactories(residency), mode:
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
        host_data=sum(mode.host_data.values()) * per,
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


def _built(workload: Workload, ctx: RuntimeContext, sets: list[str] | None) -> tuple[Callable[[], Any], Any]:
    """The full-scale step at the workload's probe settings (then `sets`), eager, as `probe` counts it: the
    step function and its optimizer."""
    overrides = [*workload.step_probe, *(sets or [])]
    recipe = workload.recipe("full").with_overrides(overrides)
    recipe = _eager(recipe)
    workload.check_recipe(recipe)
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    step = TrainStep(parts, 1000, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    parts.model.train()
    return (lambda: step(batch)), parts.optimizer


def device_syncs(workload: Workload, ctx: RuntimeContext, sets: list[str] | None = None, warmup: int = 2,
                 steps: int = 2) -> dict[str, Any]:
    """On a CUDA GPU, the truth the counts are held to: the synchronisations torch itself reports for the same
    step (`torch.cuda.set_sync_debug_mode("warn")`: every blocking copy, value read, data-dependent shape and
    explicit wait), per step, with where each was made (the innermost frame outside torch, as the counts name
    theirs)."""
    import warnings

    if ctx.device.type != "cuda":
        raise ValueError(f"device_syncs needs a CUDA device, not {ctx.device}")
    run, _ = _built(workload, ctx, sets)
    for _ in range(warmup):
        run()
    ctx.synchronize()
    sites: Counter[str] = Counter()

    def shown(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "synchroniz" in str(message):
            sites[_site(2)] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = shown
        devices.sync_debug_mode("warn")
        try:
            for _ in range(steps):
                run()
        finally:
            devices.sync_debug_mode("default")
    ctx.synchronize()
    return {"workload": workload.name, "sets": list(sets or []), "syncs": sum(sites.values()) / steps,
            "sites": {site: n / steps for site, n in sites.most_common()}}


def configurations(workload: Workload) -> list[StepProbe]:
    """Each configuration of the full-scale step users run that the counts cover: the full recipe's own switches
    (eager: compile and graphs hide operators, and a step that synchronises cannot be captured anyway),
    --static-shapes where the workload offers it, and what its budget adds (expert parallelism on two
    processes, say)."""
    found = [StepProbe("default", ())]
    declared = list(workload.step_budget.also)
    if "static_shapes" in workload.speedups and all(p.name != "static shapes" for p in declared):
        found.append(StepProbe("static shapes", ("static_shapes=true",)))
    return found + declared


def allowed(workload: Workload, configuration: StepProbe) -> dict[str, int]:
    """The synchronisations the configuration may make: the workload's budget and what is inherent to it."""
    budget = dict(workload.step_budget.syncs)
    for kind, n in configuration.syncs.items():
        budget[kind] = budget.get(kind, 0) + n
    return budget


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
