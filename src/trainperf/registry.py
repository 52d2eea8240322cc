"""Workload name -> class. A built-in workload is a package of trainperf/workloads/ whose __init__.py
ends with `WORKLOAD = <its Workload class>`: the registry finds it by reading that line. An out-of-tree
workload is declared by a package installed beside trainperf, in the `trainperf.workloads` entry point
group (`circles = "my_package:Circles"`). A package's `MAKES = {...}` literal declares the assets a
`trainperf make-*` command builds for it (read, not imported, like its WORKLOAD line). No workload module
is imported until one is asked for, so a workload's heavy dependencies load only when it is used. Adding a
workload is adding its package."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path

from trainperf import calibration
from trainperf.contract import Workload
from trainperf.errors import TrainperfError

PACKAGE = Path(__file__).with_name("workloads")
_DECLARED = re.compile(r"^WORKLOAD = ([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)
ENTRY_POINTS = "trainperf.workloads"
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@cache
def _found() -> dict[str, str]:
    """name -> "module:Class" of every workload package, the fastest calibrated minis first (the order
    of `suite` and of every listing), then the others by name."""
    found = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        match = _DECLARED.search(init.read_text(encoding="utf-8"))
        if match:
            found[init.parent.name] = f"trainperf.workloads.{init.parent.name}:{match.group(1)}"
    found.update(_installed(set(found)))
    medians = {c.workload: c.median_s for c in calibration.load() if not c.sets and c.nproc == 1}
    order = sorted(found, key=lambda name: (name not in medians, medians.get(name, 0.0), name))
    return {name: found[name] for name in order}


def _installed(taken: set[str]) -> dict[str, str]:
    """name -> "module:Class" of the workloads installed packages declare (entry points), each checked for
    a usable name; one that cannot be used is said once on stderr and left out, never fatal to the others."""
    found: dict[str, str] = {}
    _ORIGIN.clear()  # read afresh with the entry points (the registry's cache may be cleared)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        package = entry.dist.name if entry.dist is not None else "an installed package"
        if not _NAME.fullmatch(entry.name) or ":" not in entry.value:
            why = f"expected a lower-case name = \"module:Class\", got {entry.name} = {entry.value!r}"
        elif entry.name in taken or entry.name in found:
            why = f"{entry.name!r} is already a workload's name"
        else:
            found[entry.name] = entry.value
            _ORIGIN[entry.name] = package
            continue
        print(f"trainperf: warning: {package}'s {ENTRY_POINTS} entry point left out: {why}", file=sys.stderr)
    return found


_ORIGIN: dict[str, str] = {}


def origin(name: str) -> str | None:
    """The installed package an out-of-tree workload comes from; None for a built-in one."""
    _found()
    return _ORIGIN.get(name)


# What a `MAKES` entry may declare: the command's help, its default folder (./OUT) and the files it writes,
# and its options with their defaults (None: the workload's own default).
MAKE_FIELDS = {"help", "out", "files", "what", "steps", "seed", "generations"}


@cache
def makes() -> dict[str, tuple[str, dict]]:
    """`make-*` command -> (the workload that builds it, its declaration), from the built-in packages'
    `MAKES` literals."""
    found: dict[str, tuple[str, dict]] = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["MAKES"]:
                for command, spec in ast.literal_eval(node.value).items():
                    if not command.startswith("make-") or not {"help", "out", "files"} <= set(spec) <= MAKE_FIELDS \
                            or command in found:
                        raise TrainperfError(f"{init}: MAKES entry {command!r}: expected a new make-* command with "
                                             f"help, out and files, and only {sorted(MAKE_FIELDS)}")
                    found[command] = (init.parent.name, spec)
    return found


def names() -> list[str]:
    return list(_found())


def usable(names_: list[str] | None = None) -> dict[str, Workload]:
    """name -> workload of those that load (all by default): an installed workload that cannot be imported
    (a missing dependency, an error at import) is said once on stderr and left out, never fatal to the
    others or to the command that lists them."""
    found = {}
    for name in names_ if names_ is not None else names():
        try:
            found[name] = get(name)
        except TrainperfError as exc:
            if name not in _WARNED:
                _WARNED.add(name)
                print(f"trainperf: warning: {exc}; left out", file=sys.stderr)
    return found


_WARNED: set[str] = set()


def by_benchmark(benchmark: str) -> Workload | None:
    """The workload whose MLPerf key is `benchmark`: the one named like the key where several share it
    (ssd: SSD, not RetinaNet, which was logged under it in v2.0), else the first."""
    matches = [name for name, workload in usable().items() if workload.benchmark == benchmark]
    if not matches:
        return None
    return get(benchmark if benchmark in matches else matches[0])


def get(name: str) -> Workload:
    """Instantiate the workload called `name`, or raise a one-line error listing the known ones."""
    target = _found().get(name)
    if target is None:
        raise TrainperfError(f"unknown workload {name!r}; known workloads: " + ", ".join(_found()))
    module_name, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except Exception as exc:  # noqa: BLE001 - an installed package's module may raise anything at import
        if module_name.startswith("trainperf."):
            raise  # a built-in workload that does not import is a bug of trainperf's
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise TrainperfError(f"workload {name!r} (from {origin(name)}): cannot load {target} "
                             f"({type(exc).__name__}{': ' if first else ''}{first[:200]})") from None
    if not (isinstance(cls, type) and issubclass(cls, Workload)) or cls.name != name:
        raise TrainperfError(f"workload {name!r} (from {origin(name) or 'trainperf'}): {target} is not a Workload "
                             f"class named {name!r}")
    return cls()
