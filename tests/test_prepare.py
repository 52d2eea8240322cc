"""What every workload's preparation guarantees (every registered workload, those to come included):
its outputs get the permissions the user's umask gives (a shared dataset folder stays readable), and
prepared data is tied to its sources — a changed source is named, and preparing again redoes the work."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainperf import registry

MINIS = [name for name in registry.names() if "mini" in registry.get(name).scales]
# The gate prepares one mini from scratch here (its other minis are prepared once for the golden records).
GATE_MINI = "ncf"


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
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == GATE_MINI else pytest.mark.second_tier)
                                  for n in MINIS])
def test_mini_preparation_outputs_have_the_umask_permissions(tmp_path, name, umask_027):
    workload = registry.get(name)
    data = tmp_path / "data"
    workload.prepare("mini", data, lambda s: None)
    assert not workload.data_problems("mini", data)
    if not data.exists():
        pytest.skip(f"{name}: no data to prepare (its training data is made during the run)")
    # 0o666 / 0o777 less the umask: group-readable, as any file the user writes (not owner-only).
    assert _modes(data) == {"files": {oct(0o640)}, "folders": {oct(0o750)}}


def _changed(path: Path) -> None:
    """A valid, different source: its last line once more (every source so far is line-oriented); the
    other side of a parallel corpus (x.en / x.de) changes with it, or the pair would be invalid."""
    other = path.with_name(path.name[:-3] + {".en": ".de", ".de": ".en"}[path.name[-3:]]) \
        if path.name[-3:] in (".en", ".de") else None
    for side in [path] + ([other] if other is not None and other.is_file() else []):
        text = side.read_bytes()
        last = text.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        side.write_bytes(text + last + b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == GATE_MINI else pytest.mark.second_tier)
                                  for n in MINIS])
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


def test_stamps_see_content_params_format_and_missing_sources(tmp_path, monkeypatch):
    from trainperf import prepared

    src = tmp_path / "ratings.csv"
    src.write_bytes(b"a,b\n1,2\n")
    where = tmp_path / "manifest.json"
    stamp = prepared.stamp({"ratings.csv": src}, 1, {"seed": 0})
    assert prepared.stale(stamp, {"ratings.csv": src}, 1, {"seed": 0}, where) is None
    os.utime(src, (1, 1))  # a copy with another time, the same content: still the same source
    assert prepared.stale(stamp, {"ratings.csv": src}, 1, {"seed": 0}, where) is None
    src.write_bytes(b"a,b\n1,3\n")  # same size, other content
    assert prepared.stale(stamp, {"ratings.csv": src}, 1, {"seed": 0}, where) == \
        f"{src}: changed (same size, other content) since the data was prepared"
    sources = {"ratings.csv": src}
    assert prepared.stale(stamp, sources, 2, {"seed": 0}, where).startswith(f"{where}: prepared in format 1")
    assert prepared.stale(stamp, sources, 1, {"seed": 1}, where).startswith(f"{where}: prepared with")
    assert prepared.stale(None, sources, 1, {"seed": 0}, where).endswith("(no record of its sources)")
    src.unlink()
    assert prepared.stale(stamp, sources, 1, {"seed": 0}, where) == f"{src}: gone since the data was prepared"


def test_large_sources_are_fingerprinted_by_size_time_and_edges(tmp_path, monkeypatch):
    from trainperf import prepared

    monkeypatch.setattr(prepared, "HASH_WHOLE_BELOW", 1000)
    monkeypatch.setattr(prepared, "EDGE_BYTES", 100)
    big = tmp_path / "day_0"
    big.write_bytes(bytes(range(256)) * 20)
    stamp = prepared.stamp({"day_0": big}, 1, {})
    assert set(prepared.fingerprint(big)) == {"size", "mtime_ns", "edges_sha256"}  # not read whole
    data = bytearray(big.read_bytes())
    data[-1] ^= 1  # the last MiB (here: 100 bytes) changed, size kept
    mtime = big.stat().st_mtime_ns
    big.write_bytes(bytes(data))
    os.utime(big, ns=(mtime, mtime))
    assert "other content" in prepared.stale(stamp, {"day_0": big}, 1, {}, tmp_path)


def test_data_dot_is_the_current_folder_by_its_absolute_path(tmp_path, monkeypatch, capsys):
    """`--data .` has no name (Path(".").name == ""): the lock beside it landed inside it, and a generator
    that renames a sibling into place raised ValueError. Mini data replaces its folder: never the current one."""
    from tests.conftest import imagenet_folder
    from trainperf.cli import main
    from trainperf.prepared import GENERATED_MANIFEST

    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "ncf", "--data", "."]) == 2
    err = capsys.readouterr().err
    assert "is the current folder" in err and "..trainperf-lock" not in err and not list(tmp_path.iterdir())
    (tmp_path / GENERATED_MANIFEST).write_text('{"files": {}}')  # a mini made here by an older trainperf
    assert main(["prepare", "resnet", "--data", "."]) == 2
    assert "Traceback" not in capsys.readouterr().err
    # A full dataset is read where it is: `.` works as its absolute path does.
    monkeypatch.chdir(imagenet_folder(tmp_path / "imagenet"))
    assert main(["prepare", "resnet", "--scale", "full", "--data", "."]) == 0
    assert f"{tmp_path / 'imagenet'}: ready for trainperf run resnet" in capsys.readouterr().out


@pytest.mark.parametrize("name", [n for n in registry.names() if registry.get(n).mlperf.full_eval_samples is not None])
def test_every_fixed_evaluation_set_is_counted_for_the_empty_set_check(name):
    """jobs.eval_set_problems refuses an empty evaluation set for `prepare` and `run` alike: every workload
    whose evaluation is a fixed set says where it is and how to count it (3D U-Net's 42 cases are checked
    by its own split, and its recipe refuses an empty eval_cases)."""
    workload = registry.get(name)
    if name == "unet3d":
        pytest.skip("the reference's 42 cases are required by data_problems; eval_cases is checked by the recipe")
    from trainperf.contract import DataSource

    for scale in workload.scales:
        assert type(workload.scale(scale).data).eval_set is not DataSource.eval_set, \
            f"{name}: declares full_eval_samples but its {scale} data source does not say where its evaluation set is"
