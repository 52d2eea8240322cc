"""What every workload's preparation guarantees (every registered workload, those to come included):
its outputs get the permissions the user's umask gives (a shared dataset folder stays readable), and
prepared data is tied to its sources — a changed source is named, and preparing again redoes the work."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainperf import registry


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o027
    os.umask(previous)


def _modes(root: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"files": set(), "folders": set()}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        found["folders" if path.is_dir() else "files"].add(oct(mode))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_mini_preparation_outputs_have_the_umask_permissions(tmp_path, name, umask_027):
    workload = registry.get(name)
    data = tmp_path / "data"
    workload.prepare("mini", data, lambda s: None)
    assert not workload.data_problems("mini", data)
    # 0o666 / 0o777 less the umask: group-readable, as any file the user writes (not owner-only).
    assert _modes(data) == {"files": {oct(0o640)}, "folders": {oct(0o750)}}


def _changed(path: Path) -> None:
    """A valid, different source: its last line once more (every source so far is line-oriented)."""
    text = path.read_bytes()
    last = text.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    path.write_bytes(text + last + b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_a_changed_source_is_named_and_prepared_again(tmp_path, name):
    workload = registry.get(name)
    data = tmp_path / "data"
    workload.prepare("mini", data, lambda s: None)
    sources = workload.sources("mini", data)
    if not sources:
        pytest.skip(f"{name}: its mini data is read as it is (no prepared cache)")
    assert not workload.data_problems("mini", data)
    said: list[str] = []
    workload.prepare("mini", data, said.append)
    assert said and "already" in said[-1]
    source = sorted(sources.values())[-1]
    _changed(source)
    problems = workload.data_problems("mini", data)
    assert len(problems) == 1 and str(source) in problems[0] and "changed" in problems[0], problems
    said.clear()
    workload.prepare("mini", data, said.append)
    assert any(str(source) in line for line in said)  # it says why it prepares again
    assert not workload.data_problems("mini", data)
