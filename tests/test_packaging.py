"""What the project's files ask for: every third-party module trainperf imports is declared in pyproject."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
# Imported only where a user asks for them, each behind a one-line error or a fallback, and not declared:
# torchrec goes in with --no-deps beside the recsys extras (pyproject says why); pynvml comes with torch's
# CUDA wheels; torchaudio publishes no build for the pinned torch (loss_impl=torchaudio says so).
UNDECLARED = {"torchrec", "pynvml", "torchaudio"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    names = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0] for spec in specs}
    return {n.lower().replace("_", "-") for n in names}


def _imported_top_level(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"trainperf", "__future__"}


@pytest.mark.slow
def test_every_third_party_import_of_the_package_is_declared():
    declared = _declared()
    owners = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(_imported_top_level(ROOT / "src" / "trainperf")):
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if not dists & declared and module not in UNDECLARED:
            missing.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_the_torch_floors_are_the_tested_versions():
    """pyproject's floors for torch and torchvision are the versions constraints.txt pins (CI tests those)."""
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    for name in ("torch", "torchvision"):
        floor = next(d.split(">=")[1] for d in deps if d.startswith(name + ">="))
        assert pins[name].startswith(floor + "."), f"{name}>={floor} but CI tests {name}=={pins[name]}"
