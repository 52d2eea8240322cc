"""What MLPerf's rules say of a benchmark key, asked of the trainperf workload that declares it: the
compliance ruleset, trainperf's own rules file where no official ruleset knows the key, the runs the
olympic mean drops, and whether RCPs count samples. A log names its trainperf workload (the
`trainperf_workload` record) where two share a key (RetinaNet logged as `ssd`); a published log does not,
and its key's own workload answers (SSD for `ssd`)."""

from __future__ import annotations

from pathlib import Path

from trainperf import registry
from trainperf.contract import Workload
from trainperf.errors import TrainperfError


def declaring(benchmark: str, workload: str | None = None) -> Workload | None:
    """The workload a log of `benchmark` comes from: the one it names, else the key's own."""
    if workload:
        try:
            found = registry.get(workload)
        except TrainperfError:
            found = None
        if found is not None and found.benchmark == benchmark:
            return found
    return registry.by_benchmark(benchmark)


def ruleset_for(benchmark: str, workload: str | None = None, logged: str | None = None) -> str | None:
    """The ruleset a log names (`trainperf_ruleset`), else its workload's (None: no workload knows the key)."""
    if logged:
        return logged
    found = declaring(benchmark, workload)
    return found.mlperf.ruleset if found is not None else None


def own_rules(benchmark: str, workload: str | None = None) -> Path | None:
    found = declaring(benchmark, workload)
    return found.mlperf.own_rules if found is not None else None


def dropped_runs(benchmark: str, workload: str | None = None) -> int:
    """How many runs the olympic mean drops at each end (1 unless the workload declares otherwise)."""
    found = declaring(benchmark, workload)
    return found.mlperf.olympic_drop if found is not None else 1


def rcp_in_samples(benchmark: str, workload: str | None = None) -> bool:
    found = declaring(benchmark, workload)
    return found.mlperf.rcp_in_samples if found is not None else False
