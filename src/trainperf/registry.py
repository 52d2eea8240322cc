"""Workload name -> class. A workload is a package of trainperf/workloads/ whose __init__.py ends with
`WORKLOAD = <its Workload class>`: the registry finds it by reading that line (no workload module is
imported until one is asked for, so a workload's heavy dependencies load only when it is used). Adding
a workload is adding its package."""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

from trainperf import calibration
from trainperf.errors import TrainperfError
from trainperf.spec import Workload

PACKAGE = Path(__file__).with_name("workloads")
_DECLARED = re.compile(r"^WORKLOAD = ([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _found() -> dict[str, str]:
    """name -> "module:Class" of every workload package, the fastest calibrated minis first (the order
    of `suite` and of every listing), then the others by name."""
    found = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        match = _DECLARED.search(init.read_text(encoding="utf-8"))
        if match:
            found[init.parent.name] = f"trainperf.workloads.{init.parent.name}:{match.group(1)}"
    medians = {c.workload: c.median_s for c in calibration.load() if not c.sets and c.nproc == 1}
    order = sorted(found, key=lambda name: (name not in medians, medians.get(name, 0.0), name))
    return {name: found[name] for name in order}


def names() -> list[str]:
    return list(_found())


def by_benchmark(benchmark: str) -> Workload | None:
    """The workload whose MLPerf key is `benchmark`: the one named like the key where several share it
    (ssd: SSD, not RetinaNet, which was logged under it in v2.0), else the first."""
    matches = [name for name in _found() if get(name).benchmark == benchmark]
    if not matches:
        return None
    return get(benchmark if benchmark in matches else matches[0])


def get(name: str) -> Workload:
    """Instantiate the workload called `name`, or raise a one-line error listing the known ones."""
    target = _found().get(name)
    if target is None:
        raise TrainperfError(f"unknown workload {name!r}; known workloads: " + ", ".join(_found()))
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls()
