"""Yambda-5B as the reference's trainer reads it (mlcommons/training PR #889, `recommendation_v4/`,
`generative_recommenders/dlrm_v4/datasets/yambda.py`).

Under the data folder (the reference's `DLRM_DATA_PATH`):
- `processed_5b/hstu_cache_L4086/`: the trainer's flat event store, one `.npy` a column over every training
  event, users contiguous and each user's events in time order: `flat_uid`, `flat_item_ids`, `flat_timestamps`,
  `flat_event_types` (int64; 0 listen, 1 like, 2 dislike, 3 unlike, 4 undislike), `flat_played_ratio`
  (float32, percent), `flat_is_organic` (int8), `flat_is_listen_plus`, `flat_is_like`, `flat_is_skip` (bool);
  `user_start`, `user_end` (int64, indexed by uid, -1 for none) and `unique_uids`; `positions_L4086.npy` (the
  anchors: flat positions of the listens with at least 4,086 earlier events of their user) and
  `anchor_ts_L4086.npy` (their timestamps); `store_meta.json` ({num_users, total_events}) and `_READY`, written
  last. This is the folder MLCommons' prepared copy holds (227 GB; the reference builds it from
  `train_sessions.parquet` on its first run).
- `processed_5b/item_popularity.npy`: one count per item (its length must equal the mappings' item count).
- `shared_metadata/artist_item_mapping.parquet`, `album_item_mapping.parquet`: item_id -> artist_id, album_id.

A sample is one anchor (a listen): its label is listen_plus (played >= 50 %), its history the last 1,362 of
each of the three pools (listen_plus, like, skip) among the 20,000 events before it, merged back into time
order and tagged by pool (bits 1, 2, 4); its context the user id and seven crossed ids (xxhash64 of the
anchor's keys, modulo each table's rows). Training reads days of anchors (86,400 s from the first anchor's
time) in order, 299 of them; the evaluation is day 299, every anchor of it. Anything wrong in the folder is
one line naming the file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.arrays import map_npy
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError

PROCESSED, METADATA = "processed_5b", "shared_metadata"
HISTORY_LENGTH = 4086  # the reference's HISTORY_LENGTH = MIN_HISTORY (config_common.sh, yambda_5b.gin)
SCAN_WINDOW = 20_000  # how far back the history is looked for (DLRMv4YambdaDataset's scan_window)
WINDOW_SECONDS = 86_400
MAX_WINDOWS = 100_000  # of a day: anything wider is not a time in seconds
TRAIN_WINDOWS, EVAL_WINDOW = 299, 299  # NUM_TRAIN_TS = 299 days from START_TS = 0, EVAL_HOLDOUT_TS = 299
TRAIN_SAMPLES = 2_290_835_423  # the anchors of days 0-298 (closed_dlrmv4.yaml checks it)
EVAL_SAMPLES = 2_058_204  # the anchors of day 299
LISTEN, LIKE = 0, 1
LISTEN_PLUS_PERCENT = 50
LP_BIT, LIKE_BIT, SKIP_BIT = 1, 2, 4

# The crossed features: name, the anchor's keys hashed together, rows, salt (configs.py YAMBDA_5B_CROSS_SPECS).
CROSS_SPECS: tuple[tuple[str, tuple[str, ...], int, int], ...] = (
    ("user_x_artist", ("uid", "artist_id"), 100_000_000, 0),
    ("user_x_album", ("uid", "album_id"), 40_000_000, 0),
    ("user_x_hour", ("uid", "hour_of_day"), 24_000_000, 0),
    ("item_x_hour", ("item_id", "hour_of_day"), 40_000_000, 0),
    ("artist_x_hour", ("artist_id", "hour_of_day"), 32_000_000, 0),
    ("user_x_is_organic", ("uid", "is_organic"), 2_000_000, 0),
    ("user_x_artist_x_hour", ("uid", "artist_id", "hour_of_day"), 40_000_000, 0),
)
# The id tables (configs.py get_embedding_table_config("yambda-5b")): items, artists, albums, users.
ID_TABLES = {"item_id": 9_390_624, "artist_id": 1_293_395, "album_id": 3_367_692, "uid": 1_000_001}

COLUMNS: dict[str, Any] = {
    "flat_uid": np.int64, "flat_item_ids": np.int64, "flat_timestamps": np.int64, "flat_event_types": np.int64,
    "flat_played_ratio": np.float32, "flat_is_organic": np.int8, "flat_is_listen_plus": np.bool_,
    "flat_is_like": np.bool_, "flat_is_skip": np.bool_,
}
USER_INDEX = ("user_start", "user_end", "unique_uids")


def cache_dir(data_dir: Path, history: int = HISTORY_LENGTH) -> Path:
    return data_dir / PROCESSED / f"hstu_cache_L{history}"


def anchors_name(history: int) -> str:
    return f"positions_L{history}.npy"


def anchor_ts_name(history: int) -> str:
    return f"anchor_ts_L{history}.npy"


def mapping_files(data_dir: Path) -> tuple[Path, Path]:
    return (data_dir / METADATA / "artist_item_mapping.parquet", data_dir / METADATA / "album_item_mapping.parquet")


def popularity_file(data_dir: Path) -> Path:
    return data_dir / PROCESSED / "item_popularity.npy"


_P1, _P2, _P3, _P4, _P5 = (np.uint64(v) for v in (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                                  0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def cross_hashes(columns: Sequence[np.ndarray], rows: int, salt: int = 0) -> np.ndarray:
    """xxhash64 (seed = salt) of each row's keys side by side as little-endian int64s, modulo `rows`: the
    reference's `xxhash_cross` (bit-identical to Primus-DLRM's cross_hash_nway), many rows at once. XXH64 written
    out for inputs of whole 8-byte lanes shorter than 32 bytes (the specification's short-input path), in
    numpy's wrapping uint64; tests/workloads/test_dlrmv4.py holds it equal to the xxhash package."""
    if not 1 <= len(columns) <= 3:
        raise ValueError("cross_hashes: 1 to 3 keys (inputs under 32 bytes)")
    with np.errstate(over="ignore"):
        h = np.full(len(columns[0]), np.uint64(salt) + _P5 + np.uint64(8 * len(columns)), dtype=np.uint64)
        for column in columns:
            lane = np.ascontiguousarray(column, dtype=np.int64).view(np.uint64)
            h ^= _rotl(lane * _P2, 31) * _P1
            h = _rotl(h, 27) * _P1 + _P4
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return (h % np.uint64(rows)).astype(np.int64)


def _npy(path: Path, dtype: Any, ndim: int = 1) -> np.ndarray:
    array = map_npy(path)
    if array.dtype != np.dtype(dtype) or array.ndim != ndim:
        raise TrainperfError(f"{path}: {array.dtype} {list(array.shape)}, expected {np.dtype(dtype)} with {ndim} "
                             "dimension(s)")
    return array


def _mapping(path: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["item_id", column])
    except FileNotFoundError:
        raise TrainperfError(f"{path}: missing") from None
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file or a missing column vary
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise TrainperfError(f"{path}: not a parquet file with columns item_id and {column} ({first})") from None
    items = table.column("item_id").to_numpy(zero_copy_only=False)
    values = table.column(column).to_numpy(zero_copy_only=False)
    if not (np.issubdtype(items.dtype, np.integer) and np.issubdtype(values.dtype, np.integer)):
        raise TrainperfError(f"{path}: item_id and {column} must be integers ({items.dtype}, {values.dtype})")
    if len(items) and (items.min() < 0 or values.min() < 0):
        raise TrainperfError(f"{path}: negative ids")
    return items.astype(np.int64), values.astype(np.int64)


class Store:
    """The flat event store and its anchors, memory-mapped read-only, checked when opened."""

    def __init__(self, data_dir: Path, history: int = HISTORY_LENGTH, scan_window: int = SCAN_WINDOW,
                 window_seconds: int = WINDOW_SECONDS, max_seq_len: int = 4096,
                 cross_specs: Sequence[tuple[str, tuple[str, ...], int, int]] = CROSS_SPECS,
                 id_rows: Sequence[int] | None = None) -> None:
        self.dir = cache_dir(data_dir, history)
        self.id_rows = tuple(id_rows) if id_rows is not None else None  # items, artists, albums, users
        ready = self.dir / "_READY"
        if not ready.is_file():
            raise TrainperfError(f"{ready}: missing (the event store is incomplete: the reference writes _READY last)")
        meta_path = self.dir / "store_meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            self.num_users, self.total_events = int(meta["num_users"]), int(meta["total_events"])
        except FileNotFoundError:
            raise TrainperfError(f"{meta_path}: missing") from None
        except (ValueError, KeyError, TypeError):
            raise TrainperfError(f"{meta_path}: expected JSON with integer num_users and total_events") from None
        self.columns = {name: _npy(self.dir / f"{name}.npy", dtype) for name, dtype in COLUMNS.items()}
        for name, column in self.columns.items():
            if len(column) != self.total_events:
                raise TrainperfError(f"{self.dir / (name + '.npy')}: {len(column):,} events, store_meta.json says "
                                     f"{self.total_events:,}")
        self.user_start, self.user_end, self.unique_uids = (_npy(self.dir / f"{n}.npy", np.int64) for n in USER_INDEX)
        if len(self.unique_uids) != self.num_users or len(self.user_end) != len(self.user_start):
            raise TrainperfError(f"{self.dir / 'unique_uids.npy'}: {len(self.unique_uids):,} users, store_meta.json "
                                 f"says {self.num_users:,}")
        self.anchors = _npy(self.dir / anchors_name(history), np.int64)
        self.anchor_ts = _npy(self.dir / anchor_ts_name(history), np.int64)
        if len(self.anchor_ts) != len(self.anchors):
            raise TrainperfError(f"{self.dir / anchor_ts_name(history)}: {len(self.anchor_ts):,} times for "
                                 f"{len(self.anchors):,} anchors")
        if len(self.anchors) == 0:
            raise TrainperfError(f"{self.dir / anchors_name(history)}: no anchors")
        if self.anchors.min() < 0 or self.anchors.max() >= self.total_events:
            raise TrainperfError(f"{self.dir / anchors_name(history)}: positions outside the {self.total_events:,} "
                                 "events")
        # Plain arrays over the same mapped pages: numpy's memmap subclass costs more per slice than the slice.
        self.plain = {name: np.asarray(column) for name, column in self.columns.items()}
        self.pools = (self.plain["flat_is_listen_plus"], self.plain["flat_is_like"], self.plain["flat_is_skip"])
        self.anchors_plain, self.user_start_plain = np.asarray(self.anchors), np.asarray(self.user_start)
        self.history_length, self.scan_window, self.window_seconds = history, scan_window, window_seconds
        self.per_pool = max(1, history // 3)
        self.cross_specs = tuple(cross_specs)
        self.budget = max_seq_len - 1 - (1 + len(self.cross_specs))  # one candidate, the contextual slots
        self.t_min, t_max = int(self.anchor_ts.min()), int(self.anchor_ts.max())
        if (t_max - self.t_min) // window_seconds > MAX_WINDOWS:
            raise TrainperfError(f"{self.dir / anchor_ts_name(history)}: the anchors span "
                                 f"{(t_max - self.t_min) // window_seconds:,} windows of {window_seconds} s (times in "
                                 "seconds expected; Yambda-5B spans 300 days)")
        artist_path, album_path = mapping_files(data_dir)
        artist_items, artists = _mapping(artist_path, "artist_id")
        album_items, albums = _mapping(album_path, "album_id")
        self.num_items = int(max(artist_items.max(initial=-1), album_items.max(initial=-1)) + 1)
        if self.num_items > 16 * (len(artist_items) + len(album_items)) + 1_000_000:
            raise TrainperfError(f"{artist_path.parent}: item ids up to {self.num_items - 1:,} for "
                                 f"{len(artist_items):,} mapped items (the preprocessing's ids are dense)")
        popularity = popularity_file(data_dir)
        if popularity.is_file() and len(_npy(popularity, np.int64)) != self.num_items:
            raise TrainperfError(f"{popularity}: {len(_npy(popularity, np.int64)):,} items, the mappings in "
                                 f"{artist_path.parent} describe {self.num_items:,} (not from the same preprocessing)")
        # Items beyond the mappings read artist and album 0, as the reference's lookups do.
        self.item_artist = np.zeros(max(self.num_items, 1), dtype=np.int64)
        self.item_artist[artist_items] = artists
        self.item_album = np.zeros(max(self.num_items, 1), dtype=np.int64)
        self.item_album[album_items] = albums
        if self.id_rows is not None:
            for path, ids, rows in ((artist_path, self.item_artist, self.id_rows[1]),
                                    (album_path, self.item_album, self.id_rows[2])):
                if ids.max(initial=0) >= rows:
                    raise TrainperfError(f"{path}: id {int(ids.max()):,} outside the {rows:,} rows of its table")

    def window_counts(self) -> np.ndarray:
        """Anchors per day-window from the first anchor's time: window w holds times in
        [t_min + w * W, t_min + (w + 1) * W)."""
        counts = np.zeros(0, dtype=np.int64)
        for start in range(0, len(self.anchor_ts), 1 << 24):  # a pass in chunks: 2.3 G anchors at full scale
            days = (np.asarray(self.anchor_ts[start:start + (1 << 24)]) - self.t_min) // self.window_seconds
            found = np.bincount(days)
            if len(found) > len(counts):
                counts = np.pad(counts, (0, len(found) - len(counts)))
            counts[:len(found)] += found
        return counts

    def window(self, w: int) -> np.ndarray:
        """The indices (into the anchors) of window w, in the store's order (user-major), as the reference's
        `window_indices` returns them."""
        lo, hi = self.t_min + w * self.window_seconds, self.t_min + (w + 1) * self.window_seconds
        parts = []
        for start in range(0, len(self.anchor_ts), 1 << 24):
            chunk = np.asarray(self.anchor_ts[start:start + (1 << 24)])
            parts.append(np.flatnonzero((chunk >= lo) & (chunk < hi)) + start)
        return np.concatenate(parts).astype(np.int64)

    def history(self, pos: int, first: int) -> np.ndarray:
        """The flat positions of an anchor's history: the last `per_pool` of each pool among the events in
        [first, pos), merged back into time order, the oldest cut to the sequence's budget (the reference's
        interleaved strategy)."""
        lp, like, skip = self.pools
        keep = np.concatenate([np.flatnonzero(lp[first:pos])[-self.per_pool:],
                               np.flatnonzero(like[first:pos])[-self.per_pool:],
                               np.flatnonzero(skip[first:pos])[-self.per_pool:]])
        keep.sort()
        return keep[-self.budget:] + first

    def batch(self, indices: np.ndarray) -> Batch:
        """Anchors `indices` (into the anchors) as the reference's `_build_sample` makes them, side by side."""
        c = self.plain
        pos = self.anchors_plain[np.asarray(indices, dtype=np.int64)]
        uid = c["flat_uid"][pos]
        if len(uid) and (uid.min() < 0 or uid.max() >= len(self.user_start_plain)
                         or self.user_start_plain[uid].min() < 0):
            raise TrainperfError(f"{self.dir / 'flat_uid.npy'}: an anchor's user is not in user_start.npy")
        first = np.maximum(self.user_start_plain[uid], pos - self.scan_window)
        histories = [self.history(int(p), int(f)) for p, f in zip(pos, first, strict=True)]
        lengths = np.array([len(h) for h in histories], dtype=np.int64)
        flat = np.concatenate(histories) if histories else np.zeros(0, dtype=np.int64)
        lp, like, skip = self.pools
        items, times = c["flat_item_ids"][flat], c["flat_timestamps"][flat]
        top = len(self.item_artist) - 1
        item = c["flat_item_ids"][pos]
        known = (item >= 0) & (item <= top)
        artist = np.where(known, self.item_artist[np.clip(item, 0, top)], 0)
        album = np.where(known, self.item_album[np.clip(item, 0, top)], 0)
        ts = c["flat_timestamps"][pos]
        ends = np.cumsum(lengths) - 1
        query = np.where(lengths > 0, times[np.maximum(ends, 0)] if len(times) else ts, ts)
        label = (c["flat_event_types"][pos] == LISTEN) & (c["flat_played_ratio"][pos] >= LISTEN_PLUS_PERCENT)
        keys = {"uid": uid, "item_id": item, "artist_id": artist, "album_id": album, "hour_of_day": (ts // 3600) % 24,
                "is_organic": c["flat_is_organic"][pos].astype(np.int64)}
        context = np.stack([uid] + [cross_hashes([keys[k] for k in names], rows, salt)
                                    for _, names, rows, salt in self.cross_specs], 1)
        actions = lp[flat] * LP_BIT + like[flat] * LIKE_BIT + skip[flat] * SKIP_BIT

        if self.id_rows is not None:  # an id past its table would index outside it on the device
            for what, ids, rows, source in (("item", np.r_[items, item], self.id_rows[0], "flat_item_ids.npy"),
                                            ("user", uid, self.id_rows[3], "flat_uid.npy")):
                if len(ids) and (ids.min() < 0 or ids.max() >= rows):
                    bad = int(ids.min() if ids.min() < 0 else ids.max())
                    raise TrainperfError(f"{self.dir / source}: {what} id {bad:,} outside the {rows:,} rows of its "
                                         "table")

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

        return Batch(context=t(context), lengths=t(lengths), items=t(items),
                     artists=t(self.item_artist[np.clip(items, 0, top)]),
                     albums=t(self.item_album[np.clip(items, 0, top)]), actions=t(actions), times=t(times),
                     candidates=t(np.stack([item, artist, album], 1)), query_time=t(query),
                     labels=torch.from_numpy(label.astype(np.float32)))


@dataclass
class Batch:
    """Samples side by side: the histories jagged (lengths and their values one after another)."""

    context: torch.Tensor  # int64 [B, C]
    lengths: torch.Tensor  # int64 [B]
    items: torch.Tensor  # int64 [sum(lengths)]
    artists: torch.Tensor
    albums: torch.Tensor
    actions: torch.Tensor
    times: torch.Tensor
    candidates: torch.Tensor  # int64 [B, 3]: item, artist, album
    query_time: torch.Tensor  # int64 [B]
    labels: torch.Tensor  # float32 [B]

    def to(self, device: torch.device) -> Batch:
        pinned = device.type == "cuda"
        return Batch(**{k: (v.pin_memory() if pinned else v).to(device, non_blocking=pinned)
                        for k, v in vars(self).items()})

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def split(self, parts: int) -> list[Batch]:
        """`parts` batches of consecutive rows (equal where they divide; fewer if it is smaller), each with its
        histories' values."""
        if parts <= 1:
            return [self]
        rows = [part for part in torch.tensor_split(torch.arange(len(self)), parts) if len(part)]
        ends = torch.cumsum(self.lengths, 0).tolist()  # the host's: a split happens outside the timed step
        out = []
        for part in rows:
            first, last = int(part[0]), int(part[-1]) + 1
            lo, hi = (ends[first - 1] if first else 0), ends[last - 1]
            out.append(Batch(**{k: (v[lo:hi] if k in JAGGED else v[first:last]) for k, v in vars(self).items()}))
        return out


JAGGED = ("items", "artists", "albums", "actions", "times")


class YambdaCache(DataSource):
    """The real Yambda-5B, as the reference's trainer reads it (the prepared copy's folders)."""

    def __init__(self, history: int = HISTORY_LENGTH) -> None:
        self.history = history

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        """The anchors of the evaluation day, counted from their times in one chunked pass: the store's last
        day, as the reference's is (EVAL_HOLDOUT_TS 299, Yambda-5B's last; the mini's last of its 24). A store
        of fewer days than Yambda-5B's needs a recipe whose `eval_window` is its last day."""
        store = Store(data_dir, self.history)
        counts = store.window_counts()
        return store.dir / anchor_ts_name(self.history), int(counts[-1]) if len(counts) else 0

    def problems(self, data_dir: Path) -> list[str]:
        found = []
        folder = cache_dir(data_dir, self.history)
        names = [*(f"{n}.npy" for n in (*COLUMNS, *USER_INDEX)), anchors_name(self.history),
                 anchor_ts_name(self.history), "store_meta.json", "_READY"]
        found += [f"{folder / n}: missing" for n in names if not (folder / n).is_file()]
        found += [f"{p}: missing" for p in mapping_files(data_dir) if not p.is_file()]
        return found

    def prepare(self, data_dir: Path, say: Any) -> None:
        missing = self.problems(data_dir)
        if missing:
            raise TrainperfError(f"{missing[0]} (the trainer's event store: MLCommons' prepared copy of Yambda-5B, "
                                 "or the reference's first run over processed_5b/train_sessions.parquet, builds it)")
        Store(data_dir, self.history)  # every array's header, length and the mappings checked
        say(f"{cache_dir(data_dir, self.history)}: ready")
