"""Atomic outputs: every file or folder trainperf writes as a whole (results, converted datasets,
generated data, reports) is written under a temporary sibling name and renamed into place when
complete, so an interrupted writer leaves the old output or nothing, never half of one.

One helper, `AtomicOutput`, does it for the whole project, so that every output gets the same
treatment: a unique temporary name (two writers do not collide), the permissions the user's umask
gives a new file or folder (a temporary file from `tempfile.mkstemp` would stay owner-only, which other
users and containers sharing a dataset folder cannot read), and the data flushed to disk before the
rename.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class AtomicOutput:
    """A file (or, with `directory=True`, a folder) written under a temporary sibling name and
    renamed into place only when the block completes:

        with AtomicOutput(path) as tmp:
            write_to(tmp)
    """

    def __init__(self, path: Path, directory: bool = False, replace: bool = True) -> None:
        self.path = Path(path)
        self.directory = directory
        # replace=False: a folder output only takes the place of a missing or empty folder (rename(2)
        # onto an empty folder is atomic); anything found there is left alone and the output refused.
        self.replace = replace
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.directory:
            self.tmp.mkdir()  # mode 0o777 less the umask, as any new folder
        return self.tmp

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            if not self.directory:
                if not self.tmp.exists():
                    self.tmp.touch()  # an empty output is still an output
                fd = os.open(self.tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(self.tmp, self.path)
                return
            try:
                os.replace(self.tmp, self.path)  # onto a missing or empty folder
            except OSError:
                if not self.replace or not self.path.is_dir() or self.path.is_symlink():
                    raise
                shutil.rmtree(self.path)
                os.replace(self.tmp, self.path)
        except BaseException:
            self._discard()
            raise

    def _discard(self) -> None:
        # Never raises: the error that made us discard (a read-only or full disk, say) is the one to
        # report, not a second one from cleaning up after it.
        if self.tmp.is_dir():
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)


_PARTIAL = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.partial$")


def is_partial(name: str) -> bool:
    """Whether a file name is one of AtomicOutput's temporary outputs."""
    return _PARTIAL.match(name) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_partials(folder: Path) -> list[Path]:
    """Remove the temporary outputs (`.NAME.<pid>.<id>.partial`) that a process killed before it could
    clean up left in `folder`; those of live processes (a prepare running beside us) stay."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _PARTIAL.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def remove_stale_partials_around(folder: Path) -> list[Path]:
    """`remove_stale_partials` where trainperf's writers put them for a data folder: beside it (a
    folder generated whole), in it (a converted day file) and in its direct subfolders (a prepared
    subset). No deeper: an ImageNet class folder holds a thousand files and no output of ours."""
    folder = Path(folder)
    removed = remove_stale_partials(folder.parent) + remove_stale_partials(folder)
    try:
        subfolders = [e for e in folder.iterdir() if e.is_dir() and not e.is_symlink()]
    except OSError:
        subfolders = []
    for sub in subfolders:
        removed += remove_stale_partials(sub)
    return removed


# Lock files that older trainperf versions left inside a full dataset and beside a generated folder.
LOCK_NAME = ".trainperf-lock"


def remove_old_lock_files(folder: Path) -> None:
    """Remove the empty lock files an older trainperf left in and beside a data folder (they hold nothing;
    trainperf now locks the folder itself). Silently keeps what it may not remove (a read-only volume)."""
    folder = Path(folder)
    for path in (folder / LOCK_NAME, folder.parent / f".{folder.name}{LOCK_NAME}"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
                path.unlink()


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[bool]:
    """An exclusive lock on preparing `folder`, held by one process at a time (a second `prepare` or `run`
    of the same data waits for the first, then finds its work done): `flock` on the folder's own
    descriptor. Nothing is created inside or beside the folder, so a dataset on a read-only or shared
    volume stays as its owner left it, and no lock file can outlive its process. The folder must exist.
    Yields False, without locking, where the folder cannot be opened (then nothing can be written there
    either)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with AtomicOutput(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str) -> None:
    with AtomicOutput(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def copy_atomic(source: Path, path: Path) -> None:
    with AtomicOutput(path) as tmp:
        shutil.copyfile(source, tmp)


def write_csv_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    """One row per dict, the first row's keys as the header."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify_manifest(folder: Path, names: tuple[str, ...], what: str, manifest_name: str = "base.json") -> None:
    """The files `names` of a shipped asset (a mini's base model, say) are the ones its manifest's `sha256` map
    names: a damaged or replaced file is one line, never a run that misses its calibrated target without a word."""
    from trainperf.errors import TrainperfError

    manifest = folder / manifest_name
    try:
        expected = json.loads(manifest.read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainperfError(f"{manifest}: unreadable manifest of {what} (reinstall trainperf)") from None
    for name in names:
        path = folder / name
        try:
            found = sha256(path)
        except OSError as exc:
            raise TrainperfError(f"{path}: cannot read {what} ({exc.strerror})") from None
        if found != expected.get(name):
            raise TrainperfError(f"{path}: SHA-256 differs from {manifest} (a damaged or replaced file: the mini's "
                                 "target was calibrated with the shipped one; reinstall trainperf)")
