"""An out-of-tree workload: a package installed beside trainperf that declares a workload in the
`trainperf.workloads` entry point group is listed, runs its mini to its target and is held to the same
conformance tests as the built-in workloads (tests/plugin_package is that package, built and installed
here with pip into a folder of its own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainperf import registry

PACKAGE = Path(__file__).with_name("plugin_package")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin built and installed by pip (no index, no build isolation: offline) into a folder of its own."""
    build = tmp_path_factory.mktemp("plugin-src")
    shutil.copytree(PACKAGE, build, dirs_exist_ok=True)
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation",
                    "--target", str(target), str(build)], check=True, capture_output=True, text=True)
    assert (target / "circles_plugin" / "__init__.py").is_file()
    return target


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin's folder on this process's path, the registry read again (and again after the test)."""
    monkeypatch.syspath_prepend(str(site))
    registry._found.cache_clear()
    yield site
    registry._found.cache_clear()
    sys.modules.pop("circles_plugin", None)


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_the_installed_workload_is_listed_and_passes_the_conformance_tests(installed, tmp_path, capsys):
    from tests import test_conformance as conformance

    assert "circles" in registry.names() and registry.origin("circles") == "circles-plugin"
    assert registry.origin("resnet") is None
    conformance.test_what_the_workload_declares("circles")
    for recipe in registry.get("circles").recipes("full"):
        conformance.test_every_full_recipe_passes_the_closed_rules(tmp_path, "circles", recipe)
    conformance.test_the_mini_trains_on_a_synthetic_batch("circles")
    data = tmp_path / "circles-mini"
    registry.get("circles").prepare("mini", data, print)
    assert registry.get("circles").data_problems("mini", data) == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_installed_workload_runs_its_mini_to_its_target(site, tmp_path):
    env = _env(site)
    listed = subprocess.run([sys.executable, "-m", "trainperf", "list"], env=env, capture_output=True, text=True,
                            check=True)
    assert "circles" in listed.stdout and "installed from circles-plugin" in listed.stdout
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trainperf", "run", "circles", "--data", str(tmp_path / "points"),
                           "--seed", "1", "--out", str(out), "--quiet"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= 0.95
    checked = subprocess.run([sys.executable, "-m", "trainperf", "check", str(out / "mlperf_log.txt")], env=env,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_broken_entry_point_is_one_line_and_the_others_still_work(installed, monkeypatch, capsys):
    import importlib.metadata

    real = importlib.metadata.entry_points

    def with_broken(**kwargs):
        found = list(real(**kwargs))
        if kwargs.get("group") == registry.ENTRY_POINTS:
            found += [importlib.metadata.EntryPoint("resnet", "elsewhere:Impostor", registry.ENTRY_POINTS),
                      importlib.metadata.EntryPoint("Bad Name", "x:Y", registry.ENTRY_POINTS),
                      importlib.metadata.EntryPoint("gone", "no_such_module:Gone", registry.ENTRY_POINTS)]
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", with_broken)
    registry._found.cache_clear()
    names = registry.names()
    assert "circles" in names and "resnet" in names and "Bad Name" not in names
    err = capsys.readouterr().err
    assert "'resnet' is already a workload's name" in err and "expected a lower-case name" in err
    from trainperf.errors import TrainperfError

    with pytest.raises(TrainperfError, match=r"^workload 'gone' \(from an installed package\): cannot load "
                                             r"no_such_module:Gone \(ModuleNotFoundError: No module named "
                                             r"'no_such_module'\)$"):
        registry.get("gone")


def test_a_plugin_that_raises_at_import_or_lacks_a_dependency_leaves_list_whole(installed, tmp_path, monkeypatch,
                                                                                capsys):
    """Issue 60, 10: a plugin raising at import was a traceback that also broke `trainperf list`, and a plugin's
    missing dependency cut `list` short. Each is one line; every other workload is still listed and usable."""
    import importlib.metadata

    from trainperf.cli import main

    (tmp_path / "raising_plugin.py").write_text("raise RuntimeError('its config file is missing')\n")
    (tmp_path / "needy_plugin.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points

    def with_broken(**kwargs):
        if kwargs.get("group") != registry.ENTRY_POINTS:
            return real(**kwargs)  # other libraries' (triton's backends) as they are
        return [*real(**kwargs), importlib.metadata.EntryPoint("raising", "raising_plugin:W", registry.ENTRY_POINTS),
                importlib.metadata.EntryPoint("needy", "needy_plugin:W", registry.ENTRY_POINTS)]

    monkeypatch.setattr(importlib.metadata, "entry_points", with_broken)
    registry._found.cache_clear()
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    listed = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert set(registry.names()) <= set(listed) and "circles" in listed and "resnet" in listed
    flat = " ".join(out.split())  # the lines are wrapped to the terminal
    assert "cannot be loaded: workload 'raising'" in flat and "RuntimeError: its config file is missing" in flat
    assert "needy" in flat and "No module named 'a_dependency_not_installed'" in flat
    assert "(2 cannot be loaded)" in flat
    assert registry.by_benchmark("resnet").name == "resnet"  # scoring still finds the others
    assert "warning: workload 'raising'" in capsys.readouterr().err  # said once, as left out
    assert main(["run", "raising"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RuntimeError: its config file is missing" in err[0]
