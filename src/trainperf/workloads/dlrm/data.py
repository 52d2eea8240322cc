"""Criteo Terabyte for DLRM: raw `day_*` TSV parsing, the reference preprocessing to the binary
layout, a planted-teacher generator for mini, and the memory-mapped batch reader.

Raw format (one click-log line): label, 13 integer features, 26 categorical features as hex
strings, tab-separated; any feature may be empty. Preprocessing, as the MLPerf reference does it:
an empty field counts as 0, categorical = int(hex, 16) mod `max_ind_range` (40,000,000), negative
integers are clipped to 0, then every categorical feature is remapped to contiguous ids (here in
increasing order of the hashed value; `day_fea_count.npz` holds the table sizes). The output is the
reference's binary layout: 40 int32 per sample [label, 13 dense, 26 sparse] in
`terabyte_processed_{train,test,val}.bin`: days 0..D-2 train (rows shuffled within blocks), the first
half of the last day is `test` (the MLPerf evaluation set), its second half `val`. log(x+1) is
applied to the dense features at load time.

Parsing is vectorised over the raw bytes (numpy), never a Python loop per field; malformed input
stops with the file and line. Pass 1 (parse + hash) writes one resumable file per day; pass 2 remaps
into the final files. Every output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from trainperf import prepared
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput, write_json_atomic

N_DENSE, N_SPARSE = 13, 26
N_FIELDS = 1 + N_DENSE + N_SPARSE
MAX_IND_RANGE = 40_000_000
PREFIX = "terabyte_processed"
SPLITS = ("train", "test", "val")
COUNTS = "day_fea_count.npz"
MANIFEST = "trainperf_dlrm.json"
FORMAT_VERSION = 1
READ_BYTES = 64 << 20  # raw text parsed per block
SHUFFLE_ROWS = 1 << 20  # training rows are shuffled within blocks of this many
_TAB, _NL, _MINUS = 9, 10, 45
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
_DEC = np.full(256, 255, dtype=np.uint8)
_DEC[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)


def day_file(data_dir: Path, day: int) -> Path:
    """The raw day file: `day_N`, or `day_N.gz` as Criteo Terabyte is downloaded (read compressed,
    streaming; decompressing costs little beside parsing, see benchmarks/dlrm_preprocess.py)."""
    plain = data_dir / f"day_{day}"
    gz = plain.with_name(f"day_{day}.gz")
    return gz if not plain.is_file() and gz.is_file() else plain


def day_sources(data_dir: Path, days: int) -> dict[str, Path]:
    return {f"day_{day}": day_file(data_dir, day) for day in range(days)}


def output_file(data_dir: Path, split: str) -> Path:
    return data_dir / f"{PREFIX}_{split}.bin"


# -- parsing ------------------------------------------------------------------------------------
def _column_name(col: int) -> str:
    if col == 0:
        return "label"
    return f"integer feature I{col}" if col <= N_DENSE else f"categorical feature C{col - N_DENSE}"


def _positional(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, table: np.ndarray, base: int,
                dtype: type) -> tuple[np.ndarray, np.ndarray | None]:
    """The value of every field's digits in `base`, one digit position at a time over all fields
    (`table` maps a byte to its digit, 255 to "not a digit"). Returns the values and, when a field
    holds a non-digit, the mask of such fields (else None)."""
    value = np.zeros(starts.shape, dtype=dtype)
    for k in range(int(lengths.max(initial=0))):
        present = k < lengths
        digit = table[buf[np.where(present, starts + k, 0)]]
        bad = present & (digit == 255)
        if bad.any():
            return value, bad
        value = np.where(present, value * dtype(base) + digit.astype(dtype), value)
    return value, None


def parse_block(buf: np.ndarray, path: Path, first_line: int, max_ind_range: int = MAX_IND_RANGE) -> np.ndarray:
    """Parse whole lines (`buf`: uint8, every line ending in a newline) into an int32 [rows, 40] array
    of [label, dense clipped at 0, categorical hashed mod max_ind_range]."""
    seps = np.flatnonzero((buf == _TAB) | (buf == _NL))
    newlines = np.flatnonzero(buf[seps] == _NL)
    rows = newlines.size
    # Each line has exactly 39 tabs and one newline: its newline is separator number 40*k + 39.
    if seps.size != rows * N_FIELDS or not np.array_equal(newlines, np.arange(N_FIELDS - 1, seps.size, N_FIELDS)):
        fields = np.diff(np.r_[-1, newlines])
        bad = int(np.flatnonzero(fields != N_FIELDS)[0])
        raise TrainperfError(f"{path}:{first_line + bad}: expected {N_FIELDS} tab-separated fields (label, "
                             f"{N_DENSE} integer, {N_SPARSE} categorical), got {int(fields[bad])}")
    starts = np.r_[0, seps[:-1] + 1].reshape(rows, N_FIELDS)
    lengths = seps.reshape(rows, N_FIELDS) - starts
    out = np.empty((rows, N_FIELDS), dtype=np.int32)

    def fail(mask: np.ndarray, what: str) -> None:
        row, col = (int(i) for i in np.argwhere(mask)[0])
        cols = slice(0, 1) if what == "label" else (slice(1, 1 + N_DENSE) if what == "int" else
                                                      slice(1 + N_DENSE, N_FIELDS))
        col += cols.start
        start = int(starts[row, col])
        text = bytes(buf[start:start + min(int(lengths[row, col]), 40)]).decode("latin-1")
        expected = {"label": "0 or 1", "int": "an integer (or empty)",
                    "hex": "a hexadecimal string of at most 16 digits (or empty)"}[what]
        raise TrainperfError(f"{path}:{first_line + row}: {_column_name(col)} is {text!r}; expected {expected}")

    # label
    label_ok = (lengths[:, 0] == 1) & ((buf[starts[:, 0]] == ord("0")) | (buf[starts[:, 0]] == ord("1")))
    if not label_ok.all():
        fail(~label_ok[:, None], "label")
    out[:, 0] = buf[starts[:, 0]] - ord("0")

    # integers: optional minus sign, decimal digits; empty -> 0; negative -> 0 (clipped)
    st, ln = starts[:, 1:1 + N_DENSE], lengths[:, 1:1 + N_DENSE]
    negative = (ln > 0) & (buf[np.minimum(st, buf.size - 1)] == _MINUS)
    st, ln = st + negative, ln - negative
    if ln.max(initial=0) > 10 or ((ln == 0) & negative).any():
        fail((ln > 10) | ((ln == 0) & negative), "int")
    value, bad = _positional(buf, st, ln, _DEC, 10, np.int64)
    if bad is not None:
        fail(bad, "int")
    if (value > np.iinfo(np.int32).max).any():
        fail(value > np.iinfo(np.int32).max, "int")
    out[:, 1:1 + N_DENSE] = np.where(negative, 0, value)

    # categoricals: hex; empty -> 0; then mod max_ind_range
    st, ln = starts[:, 1 + N_DENSE:], lengths[:, 1 + N_DENSE:]
    if ln.max(initial=0) > 16:
        fail(ln > 16, "hex")
    value, bad = _positional(buf, st, ln, _HEX, 16, np.uint64)
    if bad is not None:
        fail(bad, "hex")
    out[:, 1 + N_DENSE:] = (value % np.uint64(max_ind_range)).astype(np.int32)
    return out


def iter_day(path: Path, max_ind_range: int = MAX_IND_RANGE,
             block_bytes: int = READ_BYTES) -> Iterator[np.ndarray]:
    """Yield parsed int32 [rows, 40] blocks of a raw day file, streaming (never the whole file)."""
    if not path.is_file():
        raise TrainperfError(f"{path}: missing (expected a Criteo Terabyte raw day file, tab-separated, "
                             "or the same gzip-compressed as day_N.gz)")
    line = 1
    carry = b""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        while True:
            try:
                chunk = fh.read(block_bytes)
            except (OSError, EOFError, zlib.error) as exc:  # a damaged or cut gzip stream
                raise TrainperfError(f"{path}: unreadable after line {line - 1} ({exc})") from None
            data = carry + chunk
            if not chunk:
                if data:
                    data += b"\n"  # the last line may lack its newline
                else:
                    break
                carry = b""
            else:
                cut = data.rfind(b"\n") + 1
                data, carry = data[:cut], data[cut:]
            if data:
                buf = np.frombuffer(data, dtype=np.uint8)
                block = parse_block(buf, path, line, max_ind_range)
                line += block.shape[0]
                yield block
            if not chunk:
                break
    if line == 1:
        raise TrainperfError(f"{path}: empty (expected tab-separated click-log lines)")


# -- preprocessing ------------------------------------------------------------------------------
def _hashed_file(data_dir: Path, day: int) -> Path:
    return data_dir / f"day_{day}.hashed.bin"


def _uniques_file(data_dir: Path, day: int) -> Path:
    return data_dir / f"day_{day}.uniques.npz"


def _done_file(data_dir: Path, day: int) -> Path:
    """The stamp of a day's finished pass 1: which source file it read (see trainperf.prepared)."""
    return data_dir / f"day_{day}.hashed.json"


class _ValueSet:
    """The distinct values of one categorical feature in a day: sorted arrays while they are few
    (cheap for small files), a bitmap over [0, max_ind_range) once they are many (linear time for
    the 190M-row days of the real data). Both give the same sorted result."""

    def __init__(self, max_ind_range: int) -> None:
        self.max_ind_range = max_ind_range
        self.parts: list[np.ndarray] = []
        self.pending = 0
        self.bitmap: np.ndarray | None = None

    def add(self, values: np.ndarray) -> None:
        if self.bitmap is not None:
            self.bitmap[values] = True
            return
        self.parts.append(np.unique(values))
        self.pending += self.parts[-1].size
        if self.pending > self.max_ind_range // 16:
            self.bitmap = np.zeros(self.max_ind_range, dtype=bool)
            for part in self.parts:
                self.bitmap[part] = True
            self.parts = []

    def values(self) -> np.ndarray:
        if self.bitmap is not None:
            return np.flatnonzero(self.bitmap).astype(np.int32)
        return np.unique(np.concatenate(self.parts)).astype(np.int32) if self.parts else np.zeros(0, np.int32)


class _Reporter:
    """Progress of the in-process path: says the rows parsed every `every_s` seconds."""

    def __init__(self, say: Callable[[str], None], every_s: float) -> None:
        self.say, self.every_s, self.last = say, every_s, time.perf_counter()

    def put(self, item: tuple[int, int]) -> None:
        if time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            day, rows = item
            self.say(f"  day_{day}: {rows:,} rows parsed so far")


def _hash_day(data_dir: Path, day: int, max_ind_range: int, progress: Any = None) -> int:
    """Pass 1 for one day: parse and hash into `day_N.hashed.bin` and note the values each
    categorical feature takes. Skipped when a previous run finished this day (resumable).
    `progress` (a queue) receives (day, rows parsed so far) after every block."""
    hashed, uniques, done = _hashed_file(data_dir, day), _uniques_file(data_dir, day), _done_file(data_dir, day)
    source = {f"day_{day}": day_file(data_dir, day)}
    params = {"max_ind_range": max_ind_range}
    if hashed.is_file() and uniques.is_file() and _read_json(done) is not None and \
            prepared.stale(_read_json(done), source, FORMAT_VERSION, params, where=done) is None:
        return hashed.stat().st_size // (4 * N_FIELDS)
    # Stamped before reading: a day file changed during the pass is seen as changed next time.
    stamp = prepared.stamp(source, FORMAT_VERSION, params)
    seen = [_ValueSet(max_ind_range) for _ in range(N_SPARSE)]
    rows = 0
    with AtomicOutput(hashed) as tmp, tmp.open("wb") as fh:
        for block in iter_day(day_file(data_dir, day), max_ind_range):
            block.tofile(fh)
            for j in range(N_SPARSE):
                seen[j].add(block[:, 1 + N_DENSE + j])
            rows += block.shape[0]
            if progress is not None:
                progress.put((day, rows))
    with AtomicOutput(uniques) as tmp:
        with tmp.open("wb") as fh:
            np.savez(fh, **{f"c{j}": s.values() for j, s in enumerate(seen)})
    write_json_atomic(done, stamp)  # last: this day's intermediates are complete, from this source
    return rows


def _hash_days_in_processes(data_dir: Path, days: int, max_ind_range: int, workers: int,
                            say: Callable[[str], None], report_every_s: float) -> list[int]:
    """Pass 1 with one process per day file at a time; workers report the rows they parsed through a
    queue, because a real day file (~190M rows) takes a process half an hour."""
    rows_per_day, parsed = [0] * days, [0] * days
    t0 = last_report = time.perf_counter()
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with context.Manager() as manager, ProcessPoolExecutor(workers, mp_context=context) as pool:
        progress = manager.Queue()
        futures = {pool.submit(_hash_day, data_dir, day, max_ind_range, progress): day for day in range(days)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            while not progress.empty():
                day, rows = progress.get()
                parsed[day] = max(parsed[day], rows)
            for future in finished:
                day = futures[future]
                rows_per_day[day] = parsed[day] = future.result()
                say(f"  day_{day}: {rows_per_day[day]:,} rows parsed and hashed")
            if pending and time.perf_counter() - last_report >= report_every_s:
                last_report = time.perf_counter()
                say(f"  {sum(parsed):,} rows parsed so far ({sum(parsed) / (last_report - t0):,.0f} rows/s)")
    return rows_per_day


def preprocess(data_dir: Path, days: int, say: Callable[[str], None] = print,
               max_ind_range: int = MAX_IND_RANGE, seed: int = 0, workers: int | None = None,
               report_every_s: float = 30.0) -> dict:
    """The reference preprocessing of `day_0` … `day_{days-1}` (see module doc). Returns the manifest."""
    if days < 2:
        raise TrainperfError(f"dlrm preprocessing needs >= 2 day files (train days + one eval day), got {days}")
    missing = [str(day_file(data_dir, d)) for d in range(days) if not day_file(data_dir, d).is_file()]
    if missing:
        raise TrainperfError(f"{missing[0]}: missing (expected day_0 … day_{days - 1} in {data_dir}, each "
                             "plain or gzip-compressed as day_N.gz)")
    source_stamp = prepared.stamp(day_sources(data_dir, days), FORMAT_VERSION, preparation(days, max_ind_range, seed))
    t0 = time.perf_counter()
    # Pass 1, one process per day file (they are independent): parse, hash, note the values seen.
    workers = max(1, min(days, workers or os.cpu_count() or 1))
    say(f"parsing {days} day files with {workers} process{'es' if workers > 1 else ''}")
    if workers == 1:  # in this process (simplest to debug)
        rows_per_day = []
        for day in range(days):
            rows_per_day.append(_hash_day(data_dir, day, max_ind_range, _Reporter(say, report_every_s)))
            say(f"  day_{day}: {rows_per_day[-1]:,} rows parsed and hashed")
    else:
        rows_per_day = _hash_days_in_processes(data_dir, days, max_ind_range, workers, say, report_every_s)
    # Contiguous ids per feature over all days: position in the sorted set of hashed values.
    # (A bitmap once the values are many: 24 days x up to 40M values per feature at full scale.)
    vocab = []
    for j in range(N_SPARSE):
        union = _ValueSet(max_ind_range)
        for day in range(days):
            with np.load(_uniques_file(data_dir, day)) as z:
                union.add(z[f"c{j}"])
        vocab.append(union.values())
    counts = np.array([v.size for v in vocab], dtype=np.int32)
    remaps = [_Remap(v, max_ind_range) for v in vocab]
    rng = np.random.default_rng(seed)
    last = days - 1
    test_rows = -(-rows_per_day[last] // 2)  # the first half (rounded up) of the last day
    with AtomicOutput(output_file(data_dir, "train")) as train_tmp, train_tmp.open("wb") as train_fh:
        for day in range(last):
            for block in _remapped_blocks(data_dir, day, remaps):
                block[:] = block[rng.permutation(block.shape[0])]
                block.tofile(train_fh)
            say(f"  day_{day}: remapped into {output_file(data_dir, 'train').name}")
        with AtomicOutput(output_file(data_dir, "test")) as test_tmp, test_tmp.open("wb") as test_fh, \
                AtomicOutput(output_file(data_dir, "val")) as val_tmp, val_tmp.open("wb") as val_fh:
            done = 0
            for block in _remapped_blocks(data_dir, last, remaps):
                cut = min(max(test_rows - done, 0), block.shape[0])
                block[:cut].tofile(test_fh)
                block[cut:].tofile(val_fh)
                done += block.shape[0]
    with AtomicOutput(data_dir / COUNTS) as tmp, tmp.open("wb") as fh:
        np.savez(fh, counts=counts)
    seconds = time.perf_counter() - t0
    total = int(sum(rows_per_day))
    manifest = {"format_version": FORMAT_VERSION, "days": days, "max_ind_range": max_ind_range,
                "rows_per_day": [int(r) for r in rows_per_day], "train_samples": int(sum(rows_per_day[:last])),
                "test_samples": int(test_rows), "val_samples": int(rows_per_day[last] - test_rows),
                "table_sizes": counts.tolist(), "seconds": round(seconds, 2),
                "rows_per_s": round(total / max(seconds, 1e-9)), "prepared_from": source_stamp}
    write_json_atomic(data_dir / MANIFEST, manifest)
    for day in range(days):  # the intermediate files only served resuming
        _hashed_file(data_dir, day).unlink(missing_ok=True)
        _uniques_file(data_dir, day).unlink(missing_ok=True)
        _done_file(data_dir, day).unlink(missing_ok=True)
    say(f"preprocessed {total:,} rows from {days} day files in {seconds:.1f} s ({total / seconds:,.0f} rows/s); "
        f"train {manifest['train_samples']:,}, test {manifest['test_samples']:,}, val {manifest['val_samples']:,}")
    return manifest


class _Remap:
    """Hashed value -> contiguous id for one feature: a binary search in the sorted vocabulary while
    it is small, a lookup table over [0, max_ind_range) once it is large (at full scale a search in
    a 40M-value vocabulary costs ~1.7 s per million rows, the table ~0.03 s)."""

    def __init__(self, vocab: np.ndarray, max_ind_range: int) -> None:
        self.vocab = vocab
        self.table: np.ndarray | None = None
        if vocab.size > max_ind_range // 64:
            self.table = np.zeros(max_ind_range, dtype=np.int32)
            self.table[vocab] = np.arange(vocab.size, dtype=np.int32)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        return self.table[values] if self.table is not None else np.searchsorted(self.vocab, values)


def _remapped_blocks(data_dir: Path, day: int, remaps: list[_Remap]) -> Iterator[np.ndarray]:
    hashed = np.memmap(_hashed_file(data_dir, day), dtype=np.int32, mode="r").reshape(-1, N_FIELDS)
    for start in range(0, hashed.shape[0], SHUFFLE_ROWS):
        block = np.array(hashed[start:start + SHUFFLE_ROWS])
        for j, remap in enumerate(remaps):
            col = 1 + N_DENSE + j
            block[:, col] = remap(block[:, col])
        yield block


def preparation(days: int, max_ind_range: int = MAX_IND_RANGE, seed: int = 0) -> dict[str, int]:
    """The preprocessing's parameters, recorded with its outputs (a change makes them stale)."""
    return {"days": days, "max_ind_range": max_ind_range, "shuffle_seed": seed}


def staleness(manifest: dict, data_dir: Path, days: int) -> str | None:
    """None while the preprocessed files still describe the day files (see trainperf.prepared)."""
    return prepared.stale(manifest.get("prepared_from"), day_sources(data_dir, days), FORMAT_VERSION,
                          preparation(days, manifest.get("max_ind_range", MAX_IND_RANGE)), where=data_dir / MANIFEST)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def manifest_table_sizes(manifest: Any, path: Path) -> list[int]:
    """The embedding table sizes of a preprocessing manifest, or a one-line error naming the file."""
    try:
        if manifest["format_version"] != FORMAT_VERSION:
            raise ValueError(f"format_version {manifest['format_version']}, expected {FORMAT_VERSION}")
        return [int(n) for n in manifest["table_sizes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainperfError(f"{path}: not a trainperf DLRM manifest ({exc}); run trainperf prepare dlrm again") \
            from None


def preprocessed(data_dir: Path) -> dict | None:
    """The manifest of a completed preprocessing in `data_dir`, or None."""
    try:
        manifest = json.loads((data_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format_version") != FORMAT_VERSION:
        return None
    if not all(output_file(data_dir, s).is_file() for s in SPLITS) or not (data_dir / COUNTS).is_file():
        return None
    return manifest


# -- reading ------------------------------------------------------------------------------------
def open_split(data_dir: Path, split: str) -> np.ndarray:
    """A read-only memory map of a split as [rows, 40] int32 (nothing is read until sliced)."""
    path = output_file(data_dir, split)
    size = path.stat().st_size if path.is_file() else -1
    if size < 0 or size % (4 * N_FIELDS):
        raise TrainperfError(f"{path}: missing or not a whole number of {N_FIELDS}-int32 samples "
                             "(re-run trainperf prepare dlrm)")
    if size == 0:
        return np.zeros((0, N_FIELDS), dtype=np.int32)
    return np.memmap(path, dtype=np.int32, mode="r").reshape(-1, N_FIELDS)


class CriteoDays(DataSource):
    """Criteo Terabyte's day files (day_0 ... day_N-1, plain or gzip), preprocessed once beside them as the
    reference preprocesses them."""

    def __init__(self, days: int) -> None:
        self.days = days

    def again(self, data_dir: Path) -> str:
        return f"trainperf prepare dlrm --scale full --data {data_dir}"

    def problems(self, data_dir: Path) -> list[str]:
        manifest = preprocessed(data_dir)
        if manifest:
            why = staleness(manifest, data_dir, self.days)
            return [f"{why}; run {self.again(data_dir)}"] if why else []
        missing = [day_file(data_dir, d) for d in range(self.days) if not day_file(data_dir, d).is_file()]
        if missing:
            return [f"{missing[0]}: missing (Criteo Terabyte needs day_0 … day_{self.days - 1} in {data_dir}, "
                    "plain or gzip-compressed as day_N.gz)"]
        return [f"{data_dir}: day files not preprocessed yet ({self.again(data_dir)})"]

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        manifest = preprocessed(data_dir)
        if manifest:
            why = staleness(manifest, data_dir, self.days)
            if why is None:
                say(f"{data_dir}: already preprocessed")
                return
            say(f"{why}: preprocessing again")
        self.write_days(data_dir, say)
        preprocess(data_dir, self.days, say)

    def write_days(self, data_dir: Path, say: Callable[[str], None]) -> None:
        """Nothing to write: the user's day files are the source."""

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return day_sources(data_dir, self.days)

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        manifest = preprocessed(data_dir) or {}
        return data_dir / MANIFEST, int(manifest.get("test_samples", 0))
