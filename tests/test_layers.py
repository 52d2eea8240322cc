"""Lower layers never import higher ones (imports inside functions included): the contract and the
runtime know nothing of results, reports or the command line, and workloads import only the
contract and the leaf helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import trainperf

PACKAGE = Path(trainperf.__file__).parent
LEAVES = {"__init__", "errors", "rulesets", "files", "plots", "paths", "prepared", "loaders", "devices", "optional",
          "calibration", "signals", "arrays"}
# What each part may import, besides itself and the leaves.
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "spec": {"contract"},  # the contract's old name, kept for out-of-tree workloads
    "optim": set(),
    "runtime": {"contract"},
    "workloads": {"contract", "optim"},
    "harness": {"contract", "runtime"},
    "results": {"contract", "runtime", "registry"},  # what the rules say of a key, asked of its workload
    "registry": {"contract"},  # workloads are imported by name, lazily
    # energy to train: where a run stands (runtime's placement) and its log's times (results' reader)
    "power": {"runtime", "results"},
    "bench": {"contract", "runtime", "harness", "results", "power"},
    "report": {"contract", "results", "registry"},
    "jobs": {"contract", "runtime", "harness", "results", "registry", "power"},
    "suite": {"contract", "runtime", "results", "registry", "jobs", "report", "power"},
    "science": {"contract", "runtime", "harness", "results", "registry", "jobs", "bench"},
    "cli": {"contract", "runtime", "results", "registry", "jobs", "bench", "report", "suite", "science", "power"},
    "__main__": {"cli"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _from_root(name: str) -> str:
    """`from trainperf import X`: a submodule, or an attribute of the package itself."""
    is_module = (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name).is_dir()
    return f"trainperf.{name}" if is_module else "trainperf"


def _imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("trainperf", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module if node.module != "trainperf" else _from_root(a.name) for a in node.names]
            for name in names:
                if name.startswith("trainperf.") and _part(name) != _part(module):
                    found.setdefault(_part(module), set()).add(_part(name))
    return found


def test_every_part_imports_only_what_is_below_it():
    violations = {part: sorted(used - ALLOWED.get(part, set()) - LEAVES) for part, used in _imports().items()}
    assert {part: bad for part, bad in violations.items() if bad} == {}


def test_the_leaves_import_nothing_of_trainperf_but_errors():
    # `devices` (the one door to torch.cuda) is itself a leaf that imports only `errors`.
    imports = _imports()
    assert sorted(imports.get("devices", set()) - {"errors"}) == []
    assert {leaf: sorted(imports.get(leaf, set()) - {"errors", "__init__", "paths", "devices", "files"})
            for leaf in LEAVES} == \
        {leaf: [] for leaf in LEAVES}


def _workload_imports() -> dict[str, set[str]]:
    """Each workload package's (and common/'s) imports of other workload packages."""
    root = PACKAGE / "workloads"
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if len(parts) < 2:
            continue
        own = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "trainperf.workloads"
                         else [node.module])
            for name in names:
                if name.startswith("trainperf.workloads."):
                    other = name.split(".")[2]
                    if other not in (own, "common"):
                        found.setdefault(own, set()).add(other)
    return found


def test_no_workload_imports_another():
    """Only workloads/common/ is shared (the LLM and Criteo families' code, COCO, WMT, the RNNs): a workload
    builds on it, never on another workload's package, and common/ names no workload."""
    assert _workload_imports() == {}


def test_the_contracts_former_name_is_the_same_modules():
    """Out-of-tree workloads written against `trainperf.spec` get the very classes of trainperf.contract."""
    import trainperf.spec.recipe

    import trainperf.contract.recipe
    from trainperf.contract import Workload
    from trainperf.spec import Workload as Former

    assert trainperf.spec.recipe is trainperf.contract.recipe and Former is Workload
