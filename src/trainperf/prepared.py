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
from collections.abc import Mapping
from pathlib import Path
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


# -- generated (mini) data: every file's size, recorded once generated ---------------------------------
GENERATED_MANIFEST = ".trainperf-generated.json"


def record_generated(folder: Path) -> None:
    """After generating a mini dataset: the size of every file in it, so that a damaged copy (a folder
    deleted, a file truncated) is found before it trains silently on less."""
    from trainperf.files import write_json_atomic

    sizes = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != GENERATED_MANIFEST and not p.name.startswith(".")}
    write_json_atomic(folder / GENERATED_MANIFEST, {"files": sizes})


def generated_problems(folder: Path) -> list[str]:
    """One line when generated data no longer matches what was generated (files missing or resized);
    none when it does, or when nothing was recorded (data generated before trainperf recorded it)."""
    import json

    path = folder / GENERATED_MANIFEST
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["files"]
        assert isinstance(recorded, dict)
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return [f"{path}: unreadable record of the generated files"]
    changed = []
    for name, size in recorded.items():
        try:
            now = (folder / name).stat().st_size
        except OSError:
            changed.append(f"{name} missing")
            continue
        if now != size:
            changed.append(f"{name} is {now:,} bytes, was {size:,}")
    if not changed:
        return []
    return [f"{folder}: {len(changed)} of {len(recorded)} generated files missing or changed since generated "
            f"({changed[0]}{', …' if len(changed) > 1 else ''})"]
