"""`.npy` data read so that a damaged header cannot take the process down.

`np.load` trusts a header's shape: one claiming 2 TiB makes it allocate 2 TiB before it reads a byte (a
MemoryError traceback, or the kernel's OOM killer), and a header it cannot parse raises any of a dozen error
types. Here the header is parsed first, the data it claims is compared with the bytes that are there, and
only then is the array read; anything wrong is one TrainperfError naming `where`.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import IO

import numpy as np

from trainperf.errors import TrainperfError


def _header(fh: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(fh)
    except Exception as exc:  # noqa: BLE001 - numpy parses the header as a Python literal: any error is damage
        detail = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise TrainperfError(f"{where}: not readable as .npy data ({detail})") from None
    if dtype.hasobject:
        raise TrainperfError(f"{where}: .npy of Python objects (pickled), expected numbers")
    return tuple(int(n) for n in shape), bool(fortran), dtype


def _check_size(where: str, shape: tuple[int, ...], dtype: np.dtype, have: int) -> int:
    need = math.prod(shape) * dtype.itemsize
    if need > have:
        raise TrainperfError(f"{where}: its .npy header says {dtype} {list(shape)} ({need:,} bytes), it holds "
                             f"{have:,} bytes of data")
    return math.prod(shape)


def load_npy(source: bytes | Path, where: str | None = None) -> np.ndarray:
    """The array of `.npy` bytes or a `.npy` file, after its header has been checked against its size."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        where = where or "npy bytes"
        fh = io.BytesIO(source)
        shape, fortran, dtype = _header(fh, where)
        count = _check_size(where, shape, dtype, len(source) - fh.tell())
        array = np.frombuffer(source, dtype=dtype, count=count, offset=fh.tell()).copy()
        return array.reshape(shape, order="F" if fortran else "C")
    path = Path(source)
    where = where or str(path)
    try:
        with path.open("rb") as fh:
            shape, fortran, dtype = _header(fh, where)
            count = _check_size(where, shape, dtype, os.fstat(fh.fileno()).st_size - fh.tell())
            array = np.fromfile(fh, dtype=dtype, count=count)
    except OSError as exc:
        raise TrainperfError(f"{where}: cannot read ({exc.strerror or exc})") from None
    return array.reshape(shape, order="F" if fortran else "C")


def map_npy(path: Path) -> np.ndarray:
    """A .npy file memory-mapped read-only, or one line naming it: missing, or damaged (numpy parses a header
    as a Python literal, so any error there is damage)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise TrainperfError(f"{path}: missing") from None
    except Exception as exc:  # noqa: BLE001
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise TrainperfError(f"{path}: not a readable .npy file ({first})") from None
