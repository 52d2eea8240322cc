"""The reference's multi-hot Criteo 1TB, as mlcommons/training `recommendation_v2/torchrec_dlrm` reads it.

Per day d (0-23), in one folder:
- `day_{d}_dense.npy`: float32 [N, 13], the integer features already transformed by the preprocessing
  (TorchRec's `criteo.py`: missing values 0, then log(x + 3));
- `day_{d}_labels.npy`: int32 [N, 1];
- `day_{d}_sparse_multi_hot.npz`: `np.savez` (stored, not compressed) of 26 int32 arrays named "0"-"25",
  feature j [N, multi_hot_sizes[j]]: the one-hot id in column 0, then the ids its fixed random bag adds
  (the reference's `materialize_synthetic_multihot_dataset.py`, uniform distribution).

Days 0-22 are the training set (shuffled together by the preprocessing: read in order); the evaluation set is
the first half of day 23 (rows [0, ceil(N / 2)): 89,137,319 rows), as the reference's `MultiHotCriteoIterDataPipe`
splits it. Every array is memory-mapped, the npz members at their offsets inside the zip (as the reference
does): nothing is read before a batch needs it. Anything wrong is one line naming the file."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.arrays import map_npy
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput

N_DENSE, N_SPARSE = 13, 26
TRAIN_DAYS, EVAL_DAY = 23, 23
TRAIN_SAMPLES = 4_195_197_692  # days 0-22 (TorchRec's criteo.py)
EVAL_SAMPLES = 89_137_319  # the first half of day 23's 178,274,637 rows (the closed rules check it)
# The reference's tables (README: --num_embeddings_per_feature, Criteo 1TB capped at 40,000,000 rows) and
# bag sizes (--multi_hot_sizes).
TABLE_SIZES = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282, 10,
               2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36)
MULTI_HOT_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def dense_file(data_dir: Path, day: int) -> Path:
    return data_dir / f"day_{day}_dense.npy"


def labels_file(data_dir: Path, day: int) -> Path:
    return data_dir / f"day_{day}_labels.npy"


def sparse_file(data_dir: Path, day: int) -> Path:
    return data_dir / f"day_{day}_sparse_multi_hot.npz"


def day_files(data_dir: Path, day: int) -> list[Path]:
    return [dense_file(data_dir, day), sparse_file(data_dir, day), labels_file(data_dir, day)]


def eval_rows(day_rows: int) -> int:
    """The evaluation half of the last day: its first ceil(N / 2) rows."""
    return day_rows // 2 + day_rows % 2


def _npy(path: Path, dtype: np.dtype, columns: int) -> np.ndarray:
    """A memory-mapped .npy of `dtype` and shape [N, columns]."""
    array = map_npy(path)
    if array.dtype != dtype or array.ndim != 2 or array.shape[1] != columns:
        raise TrainperfError(f"{path}: {array.dtype} {list(array.shape)}, expected {np.dtype(dtype)} [N, {columns}]")
    return array


def _npz_members(path: Path, hotness: Sequence[int]) -> list[np.ndarray]:
    """The 26 int32 members of a stored (uncompressed) npz, each memory-mapped where it lies in the zip."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise TrainperfError(f"{path}: missing") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise TrainperfError(f"{path}: not a readable .npz file ({str(exc)[:120]})") from None
    members = []
    with archive, path.open("rb") as fh:
        names = {info.filename: info for info in archive.infolist()}
        for j, hot in enumerate(hotness):
            info = names.get(f"{j}.npy")
            if info is None:
                raise TrainperfError(f"{path}: no array '{j}' (expected the 26 features '0'-'25')")
            if info.compress_type != zipfile.ZIP_STORED:
                raise TrainperfError(f"{path}: array '{j}' is compressed; the reader memory-maps stored arrays "
                                     "(write it with np.savez, not np.savez_compressed)")
            try:
                members.append(_member(fh, info, path, j, hot))
            except TrainperfError:
                raise
            except Exception as exc:  # noqa: BLE001 - numpy parses a header as a Python literal: any error is damage
                first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
                raise TrainperfError(f"{path}: array '{j}': damaged ({first})") from None
    return members


def _member(fh: Any, info: zipfile.ZipInfo, path: Path, j: int, hot: int) -> np.ndarray:
    """Member `j` of a stored npz, memory-mapped where its data lies in the zip."""
    # The member's data follows its local header: 30 bytes, then its name and extra field.
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise TrainperfError(f"{path}: array '{j}': damaged zip header")
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    fh.seek(start)
    version = np.lib.format.read_magic(fh)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(fh)
    if dtype != np.int32 or fortran or len(shape) != 2 or shape[1] != hot:
        raise TrainperfError(f"{path}: array '{j}' is {dtype} {list(shape)}, expected int32 [N, {hot}] "
                             f"(feature {j}'s multi-hot size)")
    offset = fh.tell()
    if offset + shape[0] * shape[1] * 4 > start + info.file_size or info.file_size != info.compress_size:
        raise TrainperfError(f"{path}: array '{j}' is shorter than its header says")
    if offset + shape[0] * shape[1] * 4 > path.stat().st_size:
        raise TrainperfError(f"{path}: array '{j}' is cut short (the file ends before its data)")
    return np.memmap(path, dtype=np.int32, mode="r", offset=offset, shape=tuple(shape))


@dataclass
class Day:
    """One day's three files, memory-mapped."""

    dense: np.ndarray  # float32 [N, 13]
    sparse: list[np.ndarray]  # 26 x int32 [N, h_j]
    labels: np.ndarray  # int32 [N, 1]

    @property
    def rows(self) -> int:
        return int(self.labels.shape[0])


def open_day(data_dir: Path, day: int, hotness: Sequence[int]) -> Day:
    dense = _npy(dense_file(data_dir, day), np.dtype(np.float32), N_DENSE)
    labels = _npy(labels_file(data_dir, day), np.dtype(np.int32), 1)
    sparse = _npz_members(sparse_file(data_dir, day), hotness)
    for path, rows in ((dense_file(data_dir, day), dense.shape[0]),
                       *((sparse_file(data_dir, day), a.shape[0]) for a in sparse)):
        if rows != labels.shape[0]:
            raise TrainperfError(f"{path}: {rows:,} rows where {labels_file(data_dir, day).name} has "
                                 f"{labels.shape[0]:,}")
    return Day(dense, sparse, labels)


class Rows:
    """Days laid end to end: rows [start, stop) of them as (dense float32 [n, 13], ids int32 [n, sum(h)] with the
    features side by side, labels float32 [n]); ids checked against the tables' sizes (an id out of range would
    read another table's memory in FBGEMM's kernels, or fail without saying where)."""

    def __init__(self, data_dir: Path, days: list[tuple[int, Day]], table_sizes: Sequence[int],
                 stop: int | None = None) -> None:
        self.data_dir, self.days = data_dir, days
        self.starts = np.cumsum([0] + [d.rows for _, d in days])
        self.total = int(self.starts[-1]) if stop is None else min(int(self.starts[-1]), stop)
        self.hotness = [a.shape[1] for a in days[0][1].sparse] if days else []
        self.limits = np.repeat(np.asarray(table_sizes, dtype=np.int64), self.hotness)

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = []
        d = int(np.searchsorted(self.starts, start, side="right")) - 1
        position = start
        while position < stop:
            number, day = self.days[d]
            lo = position - int(self.starts[d])
            hi = min(day.rows, stop - int(self.starts[d]))
            ids = np.concatenate([a[lo:hi] for a in day.sparse], axis=1)
            bad = (ids < 0) | (ids >= self.limits)
            if bad.any():
                row, col = map(int, np.argwhere(bad)[0])
                feature = int(np.searchsorted(np.cumsum(self.hotness), col, side="right"))
                raise TrainperfError(f"{sparse_file(self.data_dir, number)}: row {lo + row:,}, feature {feature}: id "
                                     f"{int(ids[row, col])} outside its table of {int(self.limits[col]):,} rows")
            dense = np.asarray(day.dense[lo:hi])
            if not np.isfinite(dense).all():
                row = int(np.argwhere(~np.isfinite(dense))[0][0])
                raise TrainperfError(f"{dense_file(self.data_dir, number)}: row {lo + row:,}: a dense value is not "
                                     "finite (the reference's log(x + 3) of a value below -2?)")
            labels = np.asarray(day.labels[lo:hi, 0])
            if ((labels != 0) & (labels != 1)).any():
                row = int(np.argwhere((labels != 0) & (labels != 1))[0][0])
                raise TrainperfError(f"{labels_file(self.data_dir, number)}: row {lo + row:,}: label "
                                     f"{int(labels[row])}, expected 0 or 1")
            parts.append((dense, ids, labels))
            position += hi - lo
            d += 1
        dense, ids, labels = (np.concatenate(columns) for columns in zip(*parts, strict=True))
        return dense, ids, labels.astype(np.float32)


def open_split(data_dir: Path, split: str, hotness: Sequence[int], table_sizes: Sequence[int],
               train_days: int) -> Rows:
    """"train": days 0 .. train_days - 1 end to end; "eval": the first half of day `train_days`."""
    if split == "train":
        return Rows(data_dir, [(d, open_day(data_dir, d, hotness)) for d in range(train_days)], table_sizes)
    day = open_day(data_dir, train_days, hotness)
    return Rows(data_dir, [(train_days, day)], table_sizes, stop=eval_rows(day.rows))


def write_day(data_dir: Path, day: int, dense: np.ndarray, sparse: Sequence[np.ndarray], labels: np.ndarray) -> None:
    """One day's three files in the reference's layout, each written atomically."""
    with AtomicOutput(dense_file(data_dir, day)) as tmp, tmp.open("wb") as fh:
        np.save(fh, np.ascontiguousarray(dense, dtype=np.float32))
    with AtomicOutput(sparse_file(data_dir, day)) as tmp, tmp.open("wb") as fh:
        np.savez(fh, **{str(j): np.ascontiguousarray(a, dtype=np.int32) for j, a in enumerate(sparse)})
    with AtomicOutput(labels_file(data_dir, day)) as tmp, tmp.open("wb") as fh:
        np.save(fh, np.ascontiguousarray(labels, dtype=np.int32).reshape(-1, 1))


def days_present(data_dir: Path) -> int:
    """How many consecutive days from day 0 have their labels file."""
    day = 0
    while labels_file(data_dir, day).is_file():
        day += 1
    return day


class MultiHotDays(DataSource):
    """The reference's materialized multi-hot Criteo 1TB: checked, never downloaded or converted (the reference's
    scripts write it from the Criteo click logs: `process_Criteo_1TB_Click_Logs_dataset.sh`, then
    `materialize_synthetic_multihot_dataset.py --multi_hot_sizes ... --multi_hot_distribution_type uniform`)."""

    def __init__(self, days: int, hotness: Sequence[int]) -> None:
        self.days, self.hotness = days, tuple(hotness)

    def problems(self, data_dir: Path) -> list[str]:
        missing = [path for d in range(self.days) for path in day_files(data_dir, d) if not path.is_file()]
        if missing:
            return [f"{missing[0]}: missing ({len(missing)} of the {3 * self.days} day files; the reference's "
                    "materialized multi-hot dataset: day_{0..23}_dense.npy, _labels.npy, _sparse_multi_hot.npz)"]
        return []

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        problems = self.problems(data_dir)
        if problems:
            raise TrainperfError("; ".join(problems))
        total = 0
        for d in range(self.days):
            day = open_day(data_dir, d, self.hotness)
            total += day.rows if d < self.days - 1 else 0
            say(f"{sparse_file(data_dir, d)}: {day.rows:,} rows, bags of {sum(self.hotness)} ids")
        say(f"{data_dir}: {total:,} training rows (days 0-{self.days - 2}), {self._eval_rows(data_dir):,} evaluation "
            f"rows (the first half of day {self.days - 1})")

    def _eval_rows(self, data_dir: Path) -> int:
        return eval_rows(int(_npy(labels_file(data_dir, self.days - 1), np.dtype(np.int32), 1).shape[0]))

    def verify(self, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]) -> list[str] | None:
        """Every id of every day against its table, every dense value finite (a full pass over ~0.9 TB)."""
        bad: list[str] = []
        for d in range(self.days):
            rows = Rows(data_dir, [(d, open_day(data_dir, d, self.hotness))], TABLE_SIZES)
            step = 1 << 20
            for start in range(0, rows.total, step):
                try:
                    rows.read(start, min(rows.total, start + step))
                except TrainperfError as exc:
                    bad.append(str(exc))
                    break
            progress(d + 1, self.days, len(bad))
        return bad

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return labels_file(data_dir, self.days - 1), self._eval_rows(data_dir)
