"""trainperf never deletes or overwrites what it did not write: a mini generator replaces the folder it
writes, so it writes only into a new or empty folder or one that trainperf made (its record of
generated files says so). Every workload whose mini writes files, through `prepare` and `run`; and the
leftovers and races around a data folder (stale temporary outputs inside it, two prepares at once)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from trainperf import prepared, registry
from trainperf.cli import main

# What a user's real dataset looks like where a mini would be written (a forgotten --scale full).
REAL_TREES = {
    "resnet": ["train/n01440764/n01440764_10026.JPEG", "val/n01440764/ILSVRC2012_val_00000293.JPEG"],
    "ssd": ["annotations/instances_val2017.json", "val2017/000000000139.jpg", "train2017/000000000009.jpg"],
    "retinanet": ["annotations/instances_val2017.json", "val2017/000000000139.jpg"],
    "maskrcnn": ["annotations/instances_train2017.json", "train2017/000000000009.jpg"],
    "unet3d": ["data/case_00000/imaging.nii.gz", "data/case_00000/segmentation.nii.gz"],
    "ncf": ["ml-20m/ratings.csv"],
    "dlrm": ["day_0", "day_1"],
    "dlrm_dcnv2": ["day_0_dense.npy", "day_0_sparse_multi_hot.npz", "day_0_labels.npy"],
    "bert": ["hdf5/eval_10k/eval.tfrecord", "phase1/model.ckpt-28252.index"],
    "rnnt": ["LibriSpeech/dev-clean/84/121123/84-121123-0000.flac"],
    "gnmt": ["train.tok.clean.bpe.32000.en", "newstest2014.tok.bpe.32000.de"],
    "transformer": ["wmt32k-train-00001-of-00100", "newstest2014.de"],
    "llama31_8b": ["c4-train.en_6_text_document.bin", "c4-train.en_6_text_document.idx"],
    "llama2_70b_lora": ["data/train-00000-of-00001.parquet", "base/model.safetensors"],
    "gpt_oss_20b": ["c4-train.en_6_text_document.bin", "c4-validation-91205-samples.en_text_document.idx"],
    "flux1": ["cc12m_preprocessed/state.json", "coco_preprocessed/data-00000-of-00030.arrow",
              "empty_encodings/t5_empty.npy"],
}


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
