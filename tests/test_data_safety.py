"""trainperf never deletes or overwrites what it did not write: a mini generator replaces the folder it
writes, so it writes only into a new or empty folder or one that trainperf made (its record of
generated files says so). Every workload whose mini writes files, through `prepare` and `run`; and the
leftovers and races around a data folder (stale temporary outputs inside it, two prepares at once)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from trainperf import jobs, prepared, registry
from trainperf.cli import main

# What a user's real dataset looks like where a mini would be written (a forgotten --scale full): each
# workload's declaration (Workload.real_layout).
REAL_TREES = {name: list(registry.get(name).real_layout) for name in registry.names() if registry.get(name).real_layout}


def _writes_files(name: str) -> bool:
    # MiniGo's training data is self-play, made during the run; a full-scale-only workload generates nothing.
    return name != "minigo" and "mini" in registry.get(name).scales


def _tree(root: Path, files: list[str]) -> dict[str, bytes]:
    made = {}
    for i, rel in enumerate(files):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"the user's data {i}\n".encode())
        made[rel] = path.read_bytes()
    return made


def _unchanged(root: Path, made: dict[str, bytes]) -> bool:
    found = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return found == made


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _complete_real_tree(name: str, root: Path) -> dict[str, bytes]:
    """A complete dataset in the reference's on-disk format that trainperf did not generate: every file
    the mini's layout has (a copy of the generated one: the minis write the real format), the user's own
    files of the real layout beside them (a tokenizer, a LoRA base, notes), and no record of generation."""
    from tests.conftest import mini_data

    shutil.copytree(mini_data(name), root)
    (root / prepared.GENERATED_MANIFEST).unlink()
    workload = registry.get(name)
    for i, rel in enumerate(["NOTES.txt", "tokenizer/tokenizer.json", *REAL_TREES[name]]):
        path = root / rel
        if path.exists():
            continue
        made = [d for d in path.parents if not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"the user's own file {i}\n".encode())
        if workload.data_problems("mini", root):  # not where the mini's reader would look (ncf's ml-20m/)
            path.unlink()
            for d in made:
                d.rmdir()
    assert not registry.get(name).data_problems("mini", root), "the copy must pass the mini's own checks"
    return _snapshot(root)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_TREES))
def test_a_complete_real_dataset_given_to_a_mini_is_refused_and_kept_whole(tmp_path, name, capsys):
    """Issue 60, 1: a forgotten --scale full on a complete real dataset adopted it (its record written into
    it, listing the user's files), and the next change of any file deleted the whole folder. Now: refused
    in one line suggesting --scale full, before anything is written, by `run`, `prepare` and again after
    the user changed a file of theirs."""
    real = tmp_path / "real"
    made = _complete_real_tree(name, real)
    capsys.readouterr()  # what generating the copied mini printed
    out = tmp_path / "run"
    for argv in (["run", name, "--data", str(real), "--out", str(out), "--quiet"],
                 ["prepare", name, "--data", str(real)], "append", ["prepare", name, "--data", str(real)],
                 ["run", name, "--data", str(real), "--out", str(out), "--quiet"]):
        if argv == "append":
            with (real / "NOTES.txt").open("a") as fh:
                fh.write("x\n")
            made = _snapshot(real)
            continue
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(real) in err[0] and "--scale full" in err[0], err
        assert f"a complete {name} dataset trainperf did not generate" in err[0], err
        assert _snapshot(real) == made and not (real / prepared.GENERATED_MANIFEST).exists()
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real"]  # nothing beside it either (no lock file)


def test_a_suite_given_a_root_of_real_datasets_leaves_them_whole(tmp_path):
    from trainperf import suite

    root = tmp_path / "datasets"
    root.mkdir()
    made = _complete_real_tree("llama31_8b", root / "llama31_8b")
    rows = suite.run_suite(["llama31_8b"], "mini", 1, tmp_path / "suite", seed=0, data_root=root,
                           say=lambda line: None, warn=lambda line: None)
    assert rows[0].status == "failed" and "--scale full" in rows[0].reason, rows[0]
    assert _snapshot(root / "llama31_8b") == made


def test_a_record_from_an_older_trainperf_adopts_nothing_and_deletes_nothing(tmp_path, capsys):
    """The record older versions wrote into a real dataset (every file, the user's too) does not make it
    trainperf's: refused, and the folder kept whole even where a listed file has changed since."""
    real = tmp_path / "c4"
    made = _complete_real_tree("llama31_8b", real)
    capsys.readouterr()
    files = {p: len(b) for p, b in made.items()}
    (real / prepared.GENERATED_MANIFEST).write_text(json.dumps({"files": files}))
    with (real / "NOTES.txt").open("a") as fh:
        fh.write("x\n")
    made = _snapshot(real)
    for verb in ("prepare", "run"):
        assert main([verb, "llama31_8b", "--data", str(real)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "older trainperf" in err[0] and "--scale full" in err[0], err
        assert _snapshot(real) == made


@pytest.mark.slow
def test_a_regeneration_deletes_only_what_trainperf_wrote(tmp_path, capsys):
    folder = tmp_path / "ncf"
    assert main(["prepare", "ncf", "--data", str(folder)]) == 0
    record = prepared.read_generated(folder)
    assert record is not None and record.workload == "ncf"
    assert set(record.files) == {p.relative_to(folder).as_posix() for p in folder.rglob("*")
                                 if p.is_file() and p.name != prepared.GENERATED_MANIFEST}
    # The user's file beside trainperf's damaged one: nothing is deleted, the refusal names it.
    victim = folder / sorted(record.files)[0]
    victim.write_bytes(victim.read_bytes()[:10])
    (folder / "mine.txt").write_text("keep\n")
    made = _snapshot(folder)
    assert main(["prepare", "ncf", "--data", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "mine.txt" in err and "did not write" in err and _snapshot(folder) == made
    # Without it: trainperf's files only are replaced.
    (folder / "mine.txt").unlink()
    assert main(["prepare", "ncf", "--data", str(folder)]) == 0
    assert "generating it again" in capsys.readouterr().out and not prepared.generated_problems(folder)


@pytest.mark.parametrize("record", [{"generator": "trainperf", "workload": "ncf", "files": {"../victim.txt": 5}},
                                    {"generator": "trainperf", "workload": "ncf", "files": {"/etc/hosts": 5}},
                                    {"generator": "trainperf", "workload": "ncf", "files": ["ratings.csv"]},
                                    "not json"])
def test_a_damaged_or_hostile_record_deletes_nothing(tmp_path, capsys, record):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    folder = tmp_path / "ncf"
    folder.mkdir()
    (folder / "ratings.csv").write_text("1,2,3,4\n")
    (folder / prepared.GENERATED_MANIFEST).write_text(record if isinstance(record, str) else json.dumps(record))
    assert main(["prepare", "ncf", "--data", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and prepared.GENERATED_MANIFEST in err[0], err
    assert victim.read_text() == "keep\n" and (folder / "ratings.csv").read_text() == "1,2,3,4\n"


@pytest.mark.slow
def test_another_workloads_mini_folder_is_not_generated_over(tmp_path, capsys):
    folder = tmp_path / "data"
    assert main(["prepare", "ncf", "--data", str(folder)]) == 0
    made = _snapshot(folder)
    assert main(["prepare", "dlrm", "--data", str(folder)]) == 2
    assert "holds the ncf mini dataset" in capsys.readouterr().err and _snapshot(folder) == made


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux1", "dlrm_dcnv2", "ncf"])
def test_an_interrupted_generation_leaves_nothing_and_the_next_one_succeeds(tmp_path, monkeypatch, name, capsys):
    """Issue 60, 12: an interrupted `prepare --data NEW` left half a dataset (FLUX's Arrow folders,
    DCNv2's day files) that the next prepare refused as not empty. The generator now writes into a
    temporary sibling renamed into place when complete."""
    workload = registry.get(name)
    source = type(workload.scale("mini").data)
    real_prepare = source.prepare

    def interrupted(self, data_dir, say):
        real_prepare(self, data_dir, say)  # every file written, then Ctrl-C before the rename
        raise KeyboardInterrupt

    folder = tmp_path / "new"
    monkeypatch.setattr(source, "prepare", interrupted)
    assert main(["prepare", name, "--data", str(folder)]) == 130
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(source, "prepare", real_prepare)
    assert main(["prepare", name, "--data", str(folder)]) == 0
    assert not jobs.data_problems(workload, "mini", folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
    assert str(folder) in capsys.readouterr().out and ".partial" not in str(list(folder.rglob("*")))


@pytest.mark.slow
def test_no_lock_file_is_left_in_or_beside_a_dataset(tmp_path):
    """Issue 60, 13: lock files were left inside every full dataset and beside every generated mini. The
    lock is now `flock` on the folder's own descriptor; the empty lock files older versions left go."""
    from tests.conftest import imagenet_folder

    full = imagenet_folder(tmp_path / "imagenet")
    (full / ".trainperf-lock").touch()  # left by an older trainperf
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(full)]) == 0
    mini = tmp_path / "mini" / "ncf"
    assert main(["prepare", "ncf", "--data", str(mini)]) == 0
    left = [p for p in tmp_path.rglob("*") if "lock" in p.name]
    assert left == []


def test_the_folder_lock_excludes_a_second_process_and_needs_no_write_access(tmp_path):
    import fcntl

    from trainperf.files import folder_lock

    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with folder_lock(folder) as locked:
            assert locked
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # what another process would take
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
        assert list(folder.iterdir()) == [] and sorted(tmp_path.iterdir()) == [folder]
    finally:
        folder.chmod(0o755)


def test_every_workload_whose_mini_writes_files_has_a_real_tree_here():
    assert {n for n in registry.names() if _writes_files(n)} == set(REAL_TREES)


@pytest.mark.parametrize("name", sorted(REAL_TREES))
def test_prepare_never_overwrites_a_folder_trainperf_did_not_make(tmp_path, name, capsys):
    marker = tmp_path / "home"
    made_marker = _tree(marker, ["notes.txt"])
    real = tmp_path / "real"
    made_real = _tree(real, REAL_TREES[name])
    for folder, made in ((marker, made_marker), (real, made_real)):
        assert main(["prepare", name, "--data", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(folder) in err[0] and "trainperf did not write" in err[0], err
        assert "--scale full" in err[0]
        assert _unchanged(folder, made)


@pytest.mark.parametrize("name", ["resnet", "ssd", "unet3d"])
def test_a_run_without_scale_full_leaves_the_real_dataset_alone(tmp_path, name, capsys):
    real = tmp_path / "real"
    made = _tree(real, REAL_TREES[name])
    assert main(["run", name, "--data", str(real), "--out", str(tmp_path / "run")]) == 2
    assert "--scale full" in capsys.readouterr().err
    assert _unchanged(real, made) and not (tmp_path / "run").exists()


def test_a_file_given_as_the_mini_folder_is_refused(tmp_path, capsys):
    target = tmp_path / "ratings.csv"
    target.write_text("keep\n")
    assert main(["prepare", "ncf", "--data", str(target)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert target.read_text() == "keep\n"


@pytest.mark.slow
def test_an_empty_or_trainperf_made_folder_is_generated_into(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["prepare", "ncf", "--data", str(empty)]) == 0
    assert (empty / prepared.GENERATED_MANIFEST).is_file()
    # Damaged, and trainperf's: generated again.
    victim = next(p for p in empty.rglob("*.csv"))
    victim.write_text("")
    assert main(["prepare", "ncf", "--data", str(empty)]) == 0
    assert not prepared.generated_problems(empty)


def test_stale_partials_inside_a_data_folder_are_removed(tmp_path):
    from trainperf.files import remove_stale_partials_around

    data = tmp_path / "criteo"
    (data / "prepared").mkdir(parents=True)
    dead = 2**22 + 12345  # above any pid a test machine hands out
    stale = [data / f".day_0.npy.{dead}.0123abcd.partial", data / "prepared" / f".x.{dead}.89abcdef.partial",
             tmp_path / f".criteo.{dead}.00000000.partial"]
    for path in stale:
        path.write_bytes(b"half of a large file")
    live = data / f".day_1.npy.{os.getpid()}.0123abcd.partial"
    live.write_bytes(b"being written")
    assert sorted(remove_stale_partials_around(data)) == sorted(stale)
    assert live.exists() and not any(p.exists() for p in stale)


def _prepare_in_child(folder: str, queue: multiprocessing.Queue) -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["prepare", "ncf", "--data", folder])
    queue.put((code, out.getvalue()))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_prepares_of_one_folder_at_once_both_succeed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    folder = str(tmp_path / "ncf")
    procs = [ctx.Process(target=_prepare_in_child, args=(folder, queue)) for _ in range(2)]
    for proc in procs:
        proc.start()
    outcomes = [queue.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [code for code, _ in outcomes] == [0, 0], outcomes
    assert not prepared.generated_problems(Path(folder))
    assert not registry.get("ncf").data_problems("mini", Path(folder))


@pytest.mark.parametrize("command,files", [("make-lora-base", ["config.json", "model.safetensors"]),
                                           ("make-phase1", ["phase1.pt", "vocab.txt"]),
                                           ("make-minigo-target", ["target.pt"])])
def test_make_commands_never_write_over_a_users_folder(tmp_path, command, files, capsys):
    """Issue 60, 2: `make-lora-base --out DIR` overwrote a user's config.json and model.safetensors."""
    folder = tmp_path / "mine"
    made = _tree(folder, files)
    assert main([command, "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder) in err[0] and "did not write" in err[0], err
    assert _unchanged(folder, made)


def test_make_lora_base_never_writes_into_the_installed_package(tmp_path, monkeypatch, capsys):
    """Issue 60, 3: without --out it replaced the shipped base inside the package. Now a new folder in the
    current one, trainperf's own (written again by the same command, nothing else)."""
    from trainperf.workloads.llama2_70b_lora import synthetic

    shipped = {p.name: p.read_bytes() for p in synthetic.BASE.iterdir()}
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["make-lora-base", "--steps", "2"]) == 0
        assert f"wrote {tmp_path / 'lora-base'}" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in synthetic.BASE.iterdir()} == shipped
    record = prepared.read_generated(tmp_path / "lora-base")
    assert record is not None and record.workload == "make-lora-base"
    assert set(record.files) == {"config.json", "model.safetensors", "base.json"}
    assert main(["prepare", "ncf", "--data", str(tmp_path / "lora-base")]) == 2  # another owner's folder
    assert "make-lora-base" in capsys.readouterr().err
