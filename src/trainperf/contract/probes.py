"""What a workload declares about its full-scale step for the checks and measurements that do not train it:
the host's budget for one step at the CPU probe size (`trainperf.bench.stepcount`), and what one GPU runs of
it in the GPU round (benchmarks/gpu_round.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepProbe:
    """Another configuration of the full-scale step that users run, counted as the default one is: `sets` on top
    of the workload's `step_probe`, in `processes` launched processes. `syncs`: what it may synchronise beyond
    the workload's budget, inherent to it, and `why` (shown beside the figure in the docs)."""

    name: str
    sets: tuple[str, ...]
    processes: int = 1
    syncs: dict[str, int] = field(default_factory=dict)
    # Host-to-device transfers it may make beyond the budget's (non-blocking ones: no synchronisation).
    host_data: int = 0
    why: str = ""


@dataclass(frozen=True)
class StepBudget:
    """At most this many per full-scale training step at the workload's `step_probe` size: operators
    dispatched, synchronisations of each kind, host-data tensors. Operators have ~10 % headroom over the
    measured count (torch versions differ a little); the synchronisations and host-data tensors have none: a
    change that adds one fails tests/bench/test_stepcount.py. Lower a budget when a change removes work, so that
    it stays removed."""

    ops: int
    syncs: dict[str, int] = field(default_factory=dict)
    host_data: int = 0
    # Two steps of one batch do the same work (what CUDA Graphs replay); False: known not to, said why.
    replays: bool = True
    # Configurations counted besides the default and --static-shapes (where the workload offers it; one named
    # "static shapes" here replaces the plain one, to say what that configuration may add).
    also: tuple[StepProbe, ...] = ()


@dataclass(frozen=True)
class DeviceProbe:
    """What one 80 GB GPU benchmarks of the full scale: the per-device batch (NVIDIA's where they publish
    one), the `--set` values that make it fit (fewer blocks of a model too large for one device), and the
    switches its reference runs with."""

    batch: int
    sets: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
