"""`trainperf prepare unet3d --scale full --data DIR`: the raw KiTS19 cases (DIR/case_XXXXX/imaging.nii.gz
and segmentation.nii.gz, as neheller/kits19 downloads them) preprocessed as the reference does, in
parallel processes, into DIR/case_XXXXX_x.npy and _y.npy beside them; resumable (a case whose two files
exist is kept), each file written under a temporary name and renamed into place; then every file
checked against the reference's MD5 checksums."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput
from trainperf.workloads.unet3d import data as unet3d_data

RAW_CASES = 210  # case_00000 ... case_00209 are labelled; the rest of KiTS19 is its unlabelled test set


def _save(path: Path, array: np.ndarray) -> None:
    with AtomicOutput(path) as tmp, tmp.open("wb") as fh:
        np.save(fh, array, allow_pickle=False)


def preprocess_one(case_dir: Path, out: Path) -> str:
    image, label = unet3d_data.preprocess_case(case_dir)
    case = case_dir.name
    _save(out / f"{case}_y.npy", label)
    _save(out / f"{case}_x.npy", image)
    return case


def prepare_full(root: Path, say: Callable[[str], None], workers: int | None = None) -> None:
    raw = sorted(p for p in root.glob("case_*") if p.is_dir() and re.fullmatch(r"case_\d{5}", p.name)
                 and int(p.name[5:]) < RAW_CASES) if root.is_dir() else []
    todo = [p for p in raw if not ((root / f"{p.name}_x.npy").is_file() and (root / f"{p.name}_y.npy").is_file())]
    if raw:
        say(f"{root}: {len(raw)} raw cases, {len(raw) - len(todo)} already preprocessed")
    if todo:
        workers = workers or max(1, min(len(todo), os.cpu_count() or 1))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(preprocess_one, p, root): p for p in todo}
            for n, future in enumerate(as_completed(futures), 1):
                future.result()  # a bad case raises TrainperfError naming it
                say(f"preprocessed {futures[future].name} ({n}/{len(todo)})")
    cases = unet3d_data.list_cases(root)
    if not cases:
        raise TrainperfError(f"{root}: neither raw KiTS19 cases (case_XXXXX/imaging.nii.gz) nor preprocessed ones "
                             "(case_XXXXX_x.npy)")
    unet3d_data.split(cases, unet3d_data.EVAL_CASES)
    sums = unet3d_data.checksums()
    files = [p for pair in cases.values() for p in pair]
    same = sum(1 for p in files if sums.get(p.name) == unet3d_data.md5(p))
    say(f"{root}: {len(cases)} cases; {same} of {len(files)} files match the reference's MD5 checksums"
        + ("" if same == len(files) else " (files preprocessed with another torch build differ in rounding: "
           "the split and shapes are what matter)"))


class KiTS19(DataSource):
    """KiTS19 preprocessed as the reference preprocesses it (case_XXXXX_x.npy / _y.npy), the evaluation
    cases held out by name."""

    def __init__(self, evaluation_cases: tuple[str, ...]) -> None:
        self.evaluation_cases = evaluation_cases

    def problems(self, data_dir: Path) -> list[str]:
        try:
            unet3d_data.split(unet3d_data.list_cases(data_dir), self.evaluation_cases)
        except TrainperfError as exc:
            return [str(exc)]
        return []

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        prepare_full(data_dir, say)
