"""Prepared data tied to its sources.

A preparation (a converted MovieLens, a preprocessed Criteo, a list of unreadable images) records a
stamp: the trainperf format version, the preparation's parameters and a fingerprint of every source
file or folder. A prepared output whose stamp no longer matches is stale: `prepare` redoes it, and
`run` refuses it with one line naming the source that changed — never silently training on old data.

Fingerprints: a file's size, and a SHA-256 of its content when it is small (so a copy with a new
modification time is still the same file), or of its first and last MiB plus its modification time
when it is large (a Criteo day file holds ~50 GB: hashing it whole would take minutes); a folder's
entry names and modification time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

HASH_WHOLE_BELOW = 64 << 20
EDGE_BYTES = 1 << 20


def fingerprint(path: Path) -> dict[str, Any]:
    """What identifies a source's content (see the module doc); {"missing": True} when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return {"missing": True}
    if path.is_dir():
        from trainperf.files import LOCK_NAME, is_partial

        # trainperf's own lock and temporary outputs do not change what a folder holds
        names = sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME and not is_partial(p.name))
        return {"entries": len(names), "names_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        if st.st_size <= HASH_WHOLE_BELOW:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
            return {"size": st.st_size, "sha256": digest.hexdigest()}
        digest.update(fh.read(EDGE_BYTES))
        fh.seek(st.st_size - EDGE_BYTES)
        digest.update(fh.read(EDGE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "edges_sha256": digest.hexdigest()}


def stamp(sources: Mapping[str, Path], format_version: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """The record a preparation keeps beside its outputs."""
    return {"format_version": format_version, "params": dict(params),
            "sources": {name: fingerprint(Path(path)) for name, path in sources.items()}}


def _describe(was: dict[str, Any], now: dict[str, Any]) -> str:
    if now.get("missing"):
        return "gone"
    if "entries" in was or "entries" in now:
        return f"changed (entries: {was.get('entries')} -> {now.get('entries')})"
    if was.get("size") != now.get("size"):
        return f"changed (size {was.get('size'):,} -> {now.get('size'):,} bytes)"
    return "changed (same size, other content)"


def stale(recorded: Any, sources: Mapping[str, Path], format_version: int, params: Mapping[str, Any],
          where: Path) -> str | None:
    """None when `recorded` (a stamp) still describes `sources`; else why not, as one phrase that
    starts with the file at fault (a changed source, or `where` the prepared data is)."""
    if not isinstance(recorded, dict):
        return f"{where}: prepared by an older trainperf (no record of its sources)"
    if recorded.get("format_version") != format_version:
        return f"{where}: prepared in format {recorded.get('format_version')}, this trainperf reads {format_version}"
    if recorded.get("params") != dict(params):
        return f"{where}: prepared with {recorded.get('params')}, now {dict(params)}"
    before = recorded.get("sources") or {}
    if set(before) != set(sources):
        return f"{where}: prepared from {', '.join(sorted(before)) or 'nothing'}, now {', '.join(sorted(sources))}"
    for name, path in sources.items():
        now = fingerprint(Path(path))
        if now != before[name]:
            return f"{path}: {_describe(before[name], now)} since the data was prepared"
    return None


# -- generated (mini) data: the record its generator writes ----------------------------------------------
# A mini folder is trainperf's only when this record says so: written by the generator, inside the
# temporary folder it generates into, naming exactly the files it wrote. A folder without it (a user's
# real dataset given to a mini) is never adopted, and a regeneration deletes only the files it names.
GENERATED_MANIFEST = ".trainperf-generated.json"
GENERATOR = "trainperf"


@dataclass(frozen=True)
class GeneratedRecord:
    """What a generator wrote into a folder: its files (relative POSIX paths, sizes) and folders."""

    workload: str | None  # None: recorded by an older trainperf, which also recorded folders it had not made
    files: dict[str, int]
    dirs: tuple[str, ...] = ()

    @property
    def by_generator(self) -> bool:
        return self.workload is not None


def record_generated(folder: Path, workload: str) -> None:
    """Called by the generator on the folder it has just written (nothing else in it): the size of every
    file and every folder it made, so that damage shows and a regeneration deletes only these."""
    from trainperf.files import write_json_atomic

    files, dirs = {}, []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink():
            dirs.append(rel)
        elif rel != GENERATED_MANIFEST:
            files[rel] = path.lstat().st_size
    write_json_atomic(folder / GENERATED_MANIFEST, {"generator": GENERATOR, "workload": workload,
                                                    "files": files, "dirs": dirs})


def _inside(rel: Any) -> bool:
    """A recorded name that stays inside its folder (a damaged or hostile record names nothing else)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return not PurePosixPath(rel).is_absolute() and ".." not in parts and "." not in parts


def read_generated(folder: Path) -> GeneratedRecord | None:
    """The folder's record of generated files; None when there is none. A record that cannot be read,
    or names a file outside its folder, raises TrainperfError naming it."""
    import json

    from trainperf.errors import TrainperfError

    path = folder / GENERATED_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: unreadable record of the generated files ({type(exc).__name__})") from None
    files, dirs = (data.get("files"), data.get("dirs", [])) if isinstance(data, dict) else (None, None)
    ok = (isinstance(files, dict) and all(_inside(k) and type(v) is int for k, v in files.items())
          and isinstance(dirs, list) and all(_inside(d) for d in dirs))
    workload = data.get("workload") if ok and data.get("generator") == GENERATOR else None
    if not ok or (workload is not None and not isinstance(workload, str)):
        raise TrainperfError(f"{path}: not a record of generated files trainperf wrote")
    return GeneratedRecord(workload=workload, files=dict(files), dirs=tuple(dirs))


def generated_problems(folder: Path) -> list[str]:
    """One line when a folder's generated files no longer match their record (missing or resized), or
    when it has no record (nothing says trainperf generated it); none when they match."""
    from trainperf.errors import TrainperfError

    try:
        record = read_generated(folder)
    except TrainperfError as exc:
        return [str(exc)]
    if record is None:
        return [f"{folder}: no record that trainperf generated it ({GENERATED_MANIFEST})"]
    changed = []
    for name, size in record.files.items():
        try:
            now = (folder / name).lstat().st_size
        except OSError:
            changed.append(f"{name} missing")
            continue
        if now != size:
            changed.append(f"{name} is {now:,} bytes, was {size:,}")
    if not changed:
        return []
    return [f"{folder}: {len(changed)} of {len(record.files)} generated files missing or changed since generated "
            f"({changed[0]}{', …' if len(changed) > 1 else ''})"]


def foreign_files(folder: Path, record: GeneratedRecord | None) -> list[str]:
    """What `folder` holds that its record does not name (relative paths, sorted): files a user put there,
    or the whole content of a folder without a record. trainperf's own temporary outputs are not counted."""
    from trainperf.files import is_partial

    named = set(record.files) if record is not None else set()
    dirs = set(record.dirs) if record is not None else set()
    dirs |= {str(PurePosixPath(f).parent) for f in named}
    found = []
    stack = [folder]
    while stack:
        here = stack.pop()
        try:
            entries = list(here.iterdir())
        except OSError:
            continue
        for entry in entries:
            rel = entry.relative_to(folder).as_posix()
            if rel == GENERATED_MANIFEST or is_partial(entry.name) or rel in named:
                continue
            if entry.is_dir() and not entry.is_symlink():
                if rel in dirs or any(n.startswith(rel + "/") for n in named):
                    stack.append(entry)
                    continue
            found.append(rel)
    return sorted(found)


def clear_generated(folder: Path, record: GeneratedRecord) -> None:
    """Delete what a generator wrote (the files its record names, then its emptied folders, then the
    record), and nothing else: a folder holding anything more stays, and so does that."""
    import contextlib

    for name in record.files:
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    made = set(record.dirs) | {str(PurePosixPath(f).parent) for f in record.files}
    for rel in sorted((d for d in made if d != "."), key=lambda d: d.count("/"), reverse=True):
        with contextlib.suppress(OSError):
            (folder / rel).rmdir()  # only when empty
    (folder / GENERATED_MANIFEST).unlink(missing_ok=True)


# -- folders trainperf writes whole (mini datasets, the make-* commands' assets) --------------------------
def owned_target(folder: Path, owner: str, option: str, unowned: Callable[[list[str], str], str],
                 what: str = "output", legacy_ok: bool = False) -> GeneratedRecord | None:
    """Whether trainperf may write `owner`'s folder at `folder`: a missing or empty folder, or one it wrote
    before for the same owner (its record says so) holding nothing else. Anything else is one line
    (TrainperfError) before anything is written; `unowned(foreign, shown)` words the refusal of a folder
    holding what trainperf did not write. Returns the record of what trainperf wrote there, if any.
    `legacy_ok`: a record from an older trainperf (no owner) counts as trainperf's."""
    from trainperf.errors import TrainperfError

    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir() or folder.is_symlink():
        raise TrainperfError(f"{option} {folder}: exists and is not a folder; trainperf writes its {what} only into "
                             "a new or empty folder")
    record = read_generated(folder)
    if record is not None and not record.by_generator and not legacy_ok:
        raise TrainperfError(f"{option} {folder}: its {GENERATED_MANIFEST} does not say trainperf wrote it for "
                             f"{owner}; name a new or empty folder")
    if record is not None and record.workload not in (None, owner):
        raise TrainperfError(f"{option} {folder}: holds the {record.workload} {what}, not {owner}'s; name another "
                             "folder")
    try:
        foreign = foreign_files(folder, record)
    except OSError as exc:
        raise TrainperfError(f"{option} {folder}: cannot list it ({exc.strerror})") from None
    if not foreign:
        return record
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    if record is not None:
        raise TrainperfError(
            f"{option} {folder}: trainperf's {what}, but it also holds {len(foreign)} entr"
            f"{'y' if len(foreign) == 1 else 'ies'} trainperf did not write ({shown}); trainperf deletes only what "
            "it wrote: move those out, or name another folder")
    raise TrainperfError(f"{option} {folder}: {unowned(foreign, shown)}")


def write_owned(folder: Path, owner: str, write: Callable[[Path, Callable[[str], None]], Any],
                say: Callable[[str], None], check: Callable[[], GeneratedRecord | None],
                needed: Callable[[], bool] = lambda: True, option: str = "--out") -> None:
    """Write `owner`'s folder whole: `write(tmp, say)` fills a temporary sibling, the record of what it
    wrote goes inside it, and it is renamed onto the missing or empty folder. What trainperf wrote there
    before (its record) is deleted first, nothing else: `check()` (owned_target) refuses any other folder,
    again under the lock. An interrupted write leaves only the temporary folder, which the next one
    removes; a folder made only to be locked is removed again. `needed()`, under the lock, says whether
    there is still anything to write (another process may have written it meanwhile)."""
    import contextlib

    from trainperf.errors import TrainperfError
    from trainperf.files import AtomicOutput, folder_lock, remove_old_lock_files, remove_stale_partials_around

    check()
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainperfError(f"{option} {folder}: cannot create it ({exc.strerror})") from None
    try:
        with folder_lock(folder):
            remove_old_lock_files(folder)
            for stale in remove_stale_partials_around(folder):
                say(f"removed {stale}, left by a process that was killed")
            if not needed():
                return
            record = check()
            if record is not None:
                clear_generated(folder, record)
            output = AtomicOutput(folder, directory=True, replace=False)

            def said(line: str) -> None:  # the writer sees its temporary folder; the user, the folder
                say(line.replace(str(output.tmp), str(folder)))

            try:
                with output as tmp:
                    write(tmp, said)
                    record_generated(tmp, owner)
            except OSError as exc:
                raise TrainperfError(f"{option} {folder}: cannot write it ({exc.strerror or exc})") from None
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # made for the lock, still empty: nothing is left behind
        raise
