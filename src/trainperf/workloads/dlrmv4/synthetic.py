"""The dlrmv4 mini: a music-streaming log in the trainer's own format (data.py: the flat event store, its
anchors, the artist and album mappings, the item popularity), drawn from a hidden listener model, so that the
target sits between two measured bounds: the model's own AUC on the evaluation day (no predictor can beat
the probabilities the labels were drawn from) and a popularity baseline (each item's listen_plus rate in the
training days).

The hidden model: items belong to albums and albums to artists, each with a latent vector (an item near its
album, an album near its artist). A user has a taste vector that drifts slowly day by day, listens in
sessions, picks mostly from the artists near the current taste and otherwise from the popular catalogue, and
plays an item through (listen_plus) with probability sigmoid(gain * taste . item + user bias + item bias). So
a user's history of full plays and skips says what their next listen will be (the candidate's artist among
the history's full plays and skips): what HSTU's attention over the history is for. Likes follow full plays
of well-liked items; a few dislikes are scattered."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic
from trainperf.workloads.dlrmv4 import data

USERS, ARTISTS, ALBUMS_PER_ARTIST, ITEMS_PER_ALBUM = 500, 30, 2, 6
DAYS = 24  # windows 0-22 train, day 23 evaluates
HISTORY = 30  # the mini's history length (10 a pool): anchors need 30 earlier events, as the reference's 4,086
DIM, GAIN = 6, 3.0
START = 1_700_000_000  # the first day's midnight (seconds), any: only differences matter
TRUTH = "mini_truth.json"  # the bounds measured on the generated data
ID_ROWS = (ARTISTS * ALBUMS_PER_ARTIST * ITEMS_PER_ALBUM, ARTISTS, ARTISTS * ALBUMS_PER_ARTIST, USERS + 1)
# The crossed tables: a few thousand rows each (the reference's 2-100 M scaled to the mini's users and items).
CROSS_ROWS = (20_000, 8_000, 8_000, 8_000, 2_000, 2_000, 20_000)


class Listeners:
    """The hidden model's parameters for one dataset seed."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.artists = rng.normal(0, 1, (ARTISTS, DIM)) / np.sqrt(DIM)
        albums = ARTISTS * ALBUMS_PER_ARTIST
        self.album_artist = np.repeat(np.arange(ARTISTS), ALBUMS_PER_ARTIST)
        self.albums = self.artists[self.album_artist] + rng.normal(0, 0.4, (albums, DIM)) / np.sqrt(DIM)
        self.item_album = np.repeat(np.arange(albums), ITEMS_PER_ALBUM)
        self.items = self.albums[self.item_album] + rng.normal(0, 0.4, (len(self.item_album), DIM)) / np.sqrt(DIM)
        self.item_bias = rng.normal(0, 0.4, len(self.item_album))
        pop = 1.0 / np.arange(1, len(self.item_album) + 1) ** 0.9
        self.popularity = rng.permutation(pop / pop.sum())
        self.taste = rng.normal(0, 1, (USERS, DIM)) / np.sqrt(DIM) * 1.6
        self.user_bias = rng.normal(0.3, 0.5, USERS)
        self.activity = rng.gamma(2.0, 1.0, USERS)  # sessions a day, on average
        self.organic = rng.uniform(0.2, 0.8, USERS)

    @property
    def num_items(self) -> int:
        return len(self.item_album)

    def affinity(self, taste: np.ndarray, user: int, items: np.ndarray) -> np.ndarray:
        return GAIN * self.items[items] @ taste + self.user_bias[user] + self.item_bias[items]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def generate(seed: int = 0) -> tuple[dict[str, np.ndarray], Listeners, np.ndarray]:
    """Every event, users in order and each user's in time order (the store's columns), the model, and each
    event's true listen_plus probability (for the bounds)."""
    model, rng = Listeners(seed), np.random.default_rng(seed + 1)
    per_artist = ALBUMS_PER_ARTIST * ITEMS_PER_ALBUM  # an artist's items are contiguous
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("uid", "item", "ts", "type", "ratio", "organic", "p")}
    for user in range(USERS):
        taste = model.taste[user].copy()
        for day in range(DAYS):
            taste = 0.95 * taste + 0.05 * model.taste[user] + rng.normal(0, 0.05, DIM)  # slow drift
            for _ in range(rng.poisson(model.activity[user]) + (day == 0) * 2):
                start = START + day * 86_400 + int(rng.integers(6 * 3600, 23 * 3600))
                current = taste
                n = int(rng.integers(4, 16))
                near = np.exp(model.artists @ current * 4)
                near /= near.sum()
                organic = rng.random(n) < model.organic[user]
                own = rng.choice(ARTISTS, n, p=near) * per_artist + rng.integers(0, per_artist, n)
                picked = np.where(organic, own, rng.choice(model.num_items, n, p=model.popularity))
                p = _sigmoid(model.affinity(current, user, picked))
                full = rng.random(n) < p
                kind = np.where(rng.random(n) < 0.08 * full * (p > 0.7), data.LIKE,
                                np.where(rng.random(n) < 0.01, 2, data.LISTEN))
                ratio = np.where(full, rng.uniform(50, 100, n), rng.uniform(0, 49.9, n)).astype(np.float32)
                ratio[kind != data.LISTEN] = np.nan  # likes and dislikes carry no played ratio
                ts = start + np.cumsum(rng.integers(60, 300, n))
                ts -= ts % 5  # Yambda's timestamps are rounded to 5 s
                for key, value in (("uid", np.full(n, user)), ("item", picked), ("ts", ts), ("type", kind),
                                   ("ratio", ratio), ("organic", organic.astype(np.int8)), ("p", p)):
                    rows[key].append(value)
    cat = {k: np.concatenate(v) for k, v in rows.items()}
    ratio = np.nan_to_num(cat["ratio"], nan=0.0).astype(np.float32)
    listen = cat["type"] == data.LISTEN
    columns = {"flat_uid": cat["uid"].astype(np.int64), "flat_item_ids": cat["item"].astype(np.int64),
               "flat_timestamps": cat["ts"].astype(np.int64), "flat_event_types": cat["type"].astype(np.int64),
               "flat_played_ratio": ratio, "flat_is_organic": cat["organic"].astype(np.int8),
               "flat_is_listen_plus": listen & (ratio >= data.LISTEN_PLUS_PERCENT),
               "flat_is_like": cat["type"] == data.LIKE,
               "flat_is_skip": listen & (ratio < data.LISTEN_PLUS_PERCENT)}
    return columns, model, cat["p"]


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The exact ROC AUC (ties counted half), by ranks."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(average, counts)
    positives = labels.astype(bool)
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class GeneratedYambda(DataSource):
    """The mini's folder: data.py's layout at HISTORY events of history, from the hidden listener model."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        found = data.YambdaCache(HISTORY).problems(data_dir)
        if not found and not (data_dir / TRUTH).is_file():
            found.append(f"{data_dir / TRUTH}: missing")
        return found

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data.YambdaCache(HISTORY).eval_set(data_dir)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        if (data_dir / data.PROCESSED).exists() and data.YambdaCache(HISTORY).problems(data_dir):
            raise TrainperfError(f"{data_dir / data.PROCESSED}: a partial event store is there; remove it first")
        say(f"generating the dlrmv4 mini's listening log ({USERS:,} users, {DAYS} days) in {data_dir}")
        columns, model, truth = generate(0)
        anchors = write_store(data_dir, columns, HISTORY, model.album_artist[model.item_album], model.item_album)
        write_json_atomic(data_dir / TRUTH, bounds(data_dir, columns, anchors, truth))
        say(f"{len(columns['flat_uid']):,} events, {len(anchors):,} anchors")


def write_store(data_dir: Path, columns: dict[str, np.ndarray], history: int, item_artist: np.ndarray,
                item_album: np.ndarray) -> np.ndarray:
    """The trainer's store of these events (users contiguous, each in time order) as the reference's builder
    writes it: the columns, the users' index, the anchors (listens after `history` events of their user) and
    their times, store_meta.json, then _READY; the mappings of items 0.. to artists and albums and the items'
    popularity beside it. The anchors."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = data.cache_dir(data_dir, history)
    folder.mkdir(parents=True, exist_ok=True)
    (data_dir / data.METADATA).mkdir(parents=True, exist_ok=True)
    uid = columns["flat_uid"]
    starts = np.flatnonzero(np.r_[True, np.diff(uid) != 0])
    uids = uid[starts]
    user_start = np.full(int(uids.max()) + 1, -1, dtype=np.int64)
    user_end = user_start.copy()
    user_start[uids], user_end[uids] = starts, np.r_[starts[1:], len(uid)]
    anchors = np.flatnonzero((np.arange(len(uid)) - user_start[uid] >= history)
                             & (columns["flat_event_types"] == data.LISTEN))
    for name, values in {**columns, "user_start": user_start, "user_end": user_end, "unique_uids": uids,
                         data.anchors_name(history)[:-4]: anchors.astype(np.int64),
                         data.anchor_ts_name(history)[:-4]: columns["flat_timestamps"][anchors]}.items():
        np.save(folder / f"{name}.npy", values)
    items = np.arange(len(item_artist), dtype=np.uint32)
    artist_path, album_path = data.mapping_files(data_dir)
    pq.write_table(pa.table({"item_id": items, "artist_id": np.asarray(item_artist, dtype=np.uint32)}), artist_path)
    pq.write_table(pa.table({"item_id": items, "album_id": np.asarray(item_album, dtype=np.uint32)}), album_path)
    known = columns["flat_item_ids"][(columns["flat_item_ids"] >= 0) & (columns["flat_item_ids"] < len(items))]
    np.save(data.popularity_file(data_dir), np.bincount(known, minlength=len(items)).astype(np.int64))
    (folder / "store_meta.json").write_text(json.dumps({"num_users": int(len(uids)), "total_events": int(len(uid))}),
                                            encoding="utf-8")
    (folder / "_READY").touch()  # last, as the reference's builder writes it
    return anchors


def bounds(data_dir: Path, columns: dict[str, np.ndarray], anchors: np.ndarray, truth: np.ndarray) -> dict:
    """The evaluation day's AUC of the hidden model's probabilities (the best any predictor reaches) and of
    the items' training listen_plus rates (the popularity baseline)."""
    store_ts = columns["flat_timestamps"][anchors]
    t_min = int(store_ts.min())
    day = (store_ts - t_min) // data.WINDOW_SECONDS
    evaluated, trained = anchors[day == DAYS - 1], anchors[day < DAYS - 1]
    labels = columns["flat_is_listen_plus"][evaluated]
    items = columns["flat_item_ids"]
    plays = np.bincount(items[trained], minlength=int(items.max()) + 1)
    full = np.bincount(items[trained], weights=columns["flat_is_listen_plus"][trained], minlength=len(plays))
    rate = (full + 1) / (plays + 2)
    return {"eval_anchors": int(len(evaluated)), "train_anchors": int(len(trained)),
            "hidden_model_auc": round(_auc(truth[evaluated], labels), 4),
            "popularity_auc": round(_auc(rate[items[evaluated]], labels), 4),
            "listen_plus_share": round(float(labels.mean()), 4)}
