"""MovieLens-20m for NCF: the reference conversion, a planted-preference generator for mini, loading.

`ratings.csv` (header `userId,movieId,rating,timestamp`) is converted as the MLPerf reference does:
every rating is an implicit positive; users with >= 20 ratings are kept; user and item ids become
contiguous (in order of the original ids); each user's latest rating is held out as the test
positive; 999 negatives per user are drawn uniformly, with replacement, from the items that user
never rated (numpy seed 0). Outputs are tab-separated without header, as the reference writes them:
`train-ratings.csv` (user, item, 1), `test-ratings.csv` (user, item, 1), `test-negative.csv`
(999 item ids per user). They are written to temporary files and renamed into place when complete.
"""

from __future__ import annotations

import csv
import json
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Imported with the workload rather than inside the timed load (a library import is not training).
import pandas as pd

from trainperf import prepared
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError, shown
from trainperf.files import AtomicOutput, write_text_atomic

HEADER = ["userId", "movieId", "rating", "timestamp"]
OUTPUTS = ("train-ratings.csv", "test-ratings.csv", "test-negative.csv")
MANIFEST = "trainperf_ncf.json"
MIN_RATINGS = 20
NUM_EVAL_NEGATIVES = 999
FORMAT_VERSION = 1
# The conversion's parameters, recorded with its outputs (a change makes them stale).
PREPARATION = {"min_ratings": MIN_RATINGS, "eval_negatives": NUM_EVAL_NEGATIVES, "negatives_seed": 0,
               "repeated_pairs": "latest kept"}


def read_ratings(path: Path, say: Callable[[str], None] = print) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stream ratings.csv into compact arrays, rejecting malformed lines with their file and line.

    Read as pandas reads a CSV: a UTF-8 byte-order mark (what spreadsheet programs write as
    "CSV UTF-8") is accepted, and so are Windows line ends."""
    if not path.is_file():
        raise TrainperfError(f"{path}: missing (expected MovieLens ratings.csv: {','.join(HEADER)})")
    users, items, stamps = array("q"), array("q"), array("q")
    lineno = 1
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header != HEADER:
                got = shown(",".join(header)) if header else "nothing"
                raise TrainperfError(f"{path}:1: expected the header {','.join(HEADER)}, got {got}")
            for row in reader:
                lineno = reader.line_num
                _parse_rating(row, path, lineno, users, items, stamps)
                if len(users) % 5_000_000 == 0:
                    say(f"  read {len(users):,} ratings")
        except UnicodeDecodeError:
            # Text is decoded in blocks, so the error's position says nothing of the line: find it.
            line, byte = first_non_utf8_line(path)
            raise TrainperfError(f"{path}:{line}: not UTF-8 text (byte {byte:#04x})") from None
        except csv.Error as exc:
            raise TrainperfError(f"{path}:{reader.line_num}: not a CSV line ({exc})") from None
    if not users:
        raise TrainperfError(f"{path}: no ratings after the header")
    return (np.frombuffer(users, dtype=np.int64), np.frombuffer(items, dtype=np.int64),
            np.frombuffer(stamps, dtype=np.int64))


def first_non_utf8_line(path: Path) -> tuple[int, int]:
    """(line number, offending byte) of the first line of `path` that is not UTF-8."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return lineno, raw[exc.start]
    return 0, 0


def _parse_rating(row: list[str], path: Path, lineno: int, users: array, items: array, stamps: array) -> None:
    if len(row) != 4:
        raise TrainperfError(f"{path}:{lineno}: expected 4 fields (userId,movieId,rating,timestamp), got {len(row)}")
    try:
        user, item, rating, stamp = int(row[0]), int(row[1]), float(row[2]), int(row[3])
        if min(user, item) < 0:
            raise ValueError("negative id")
        users.append(user)
        items.append(item)
        stamps.append(stamp)
    except (ValueError, OverflowError):  # not a number, or beyond 64-bit ids
        raise TrainperfError(f"{path}:{lineno}: expected integer ids >= 0, a numeric rating and an integer "
                             f"timestamp, got {shown(','.join(row))}") from None
    if not 0 <= rating <= 5:
        raise TrainperfError(f"{path}:{lineno}: rating {shown(row[2])} outside 0-5")


def sample_negatives(rated_keys: np.ndarray, n_users: int, n_items: int, count: int,
                     rng: np.random.RandomState) -> np.ndarray:
    """`count` items per user, uniform with replacement over the items the user never rated.

    Vectorised rejection sampling: draw for every unfilled slot, keep the draws that are not in the
    user's rated set (a sorted array of user * n_items + item keys), repeat for the rest."""
    out = np.empty((n_users, count), dtype=np.int64)
    todo = np.arange(n_users * count)
    while todo.size:
        users = todo // count
        draws = rng.randint(0, n_items, size=todo.size)
        keys = users * n_items + draws
        pos = np.searchsorted(rated_keys, keys)
        pos[pos == rated_keys.size] = 0
        ok = rated_keys[pos] != keys
        out.reshape(-1)[todo[ok]] = draws[ok]
        todo = todo[~ok]
    return out


def convert(ratings_csv: Path, out_dir: Path, say: Callable[[str], None] = print) -> dict:
    """The reference conversion (see module doc). Returns the manifest it writes (with a stamp of
    ratings.csv: a later change of it makes the conversion stale, see `staleness`)."""
    source_stamp = prepared.stamp({"ratings.csv": ratings_csv}, FORMAT_VERSION, PREPARATION)
    users_orig, items_orig, stamps = read_ratings(ratings_csv, say)
    uniq_users, user_counts = np.unique(users_orig, return_counts=True)
    keep_users = uniq_users[user_counts >= MIN_RATINGS]
    mask = np.isin(users_orig, keep_users)
    users_orig, items_orig, stamps = users_orig[mask], items_orig[mask], stamps[mask]
    if users_orig.size == 0:
        raise TrainperfError(f"{ratings_csv}: no user has {MIN_RATINGS} or more ratings")
    user_ids, users = np.unique(users_orig, return_inverse=True)
    item_ids, items = np.unique(items_orig, return_inverse=True)
    n_users, n_items = int(users.max()) + 1, int(item_ids.size)
    # Per user in time order (stable: ties keep file order); the last rating is the test positive.
    order = np.lexsort((stamps, users))
    users, items = users[order], items[order]
    # A (user, item) rated more than once keeps its latest rating only, as the reference's set of
    # (user, item) pairs does: the test positive is then never also a training positive.
    keys = users * n_items + items
    _, latest = np.unique(keys[::-1], return_index=True)  # first in reverse = latest in time order
    keep = np.sort(keys.size - 1 - latest)
    repeats = keys.size - keep.size
    if repeats:
        users, items = users[keep], items[keep]
        say(f"{ratings_csv}: {repeats:,} repeated rating(s) of the same userId,movieId dropped (the latest kept)")
    last = np.r_[users[1:] != users[:-1], True]
    test_users, test_items = users[last], items[last]
    train_users, train_items = users[~last], items[~last]
    rated = np.unique(users * n_items + items)
    per_user = np.bincount(rated // n_items, minlength=n_users)
    if per_user.max() >= n_items:  # rejection sampling would never end
        user = int(user_ids[np.argmax(per_user)])
        raise TrainperfError(f"{ratings_csv}: user {user} rated every one of the {n_items} items: no negatives can "
                             "be drawn for the evaluation")
    negatives = sample_negatives(rated, n_users, n_items, NUM_EVAL_NEGATIVES, np.random.RandomState(0))
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_tsv(out_dir / OUTPUTS[0], np.stack([train_users, train_items, np.ones_like(train_users)], 1))
    _write_tsv(out_dir / OUTPUTS[1], np.stack([test_users, test_items, np.ones_like(test_users)], 1))
    _write_tsv(out_dir / OUTPUTS[2], negatives)
    manifest = {"format_version": FORMAT_VERSION, "source": str(ratings_csv), "users": n_users, "items": n_items,
                "train_ratings": int(train_users.size), "test_ratings": int(test_users.size),
                "prepared_from": source_stamp, "repeats_dropped": int(repeats)}
    write_text_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=2))
    say(f"converted {users_orig.size:,} ratings: {n_users:,} users, {n_items:,} items, "
        f"{train_users.size:,} train positives, {n_users:,} test users x {NUM_EVAL_NEGATIVES} negatives")
    return manifest


def _write_tsv(path: Path, table: np.ndarray) -> None:
    with AtomicOutput(path) as tmp:
        np.savetxt(tmp, table, fmt="%d", delimiter="\t")


def staleness(manifest: dict, ratings_csv: Path) -> str | None:
    """None while the conversion still describes `ratings_csv` (see trainperf.prepared)."""
    return prepared.stale(manifest.get("prepared_from"), {"ratings.csv": ratings_csv}, FORMAT_VERSION, PREPARATION,
                          where=ratings_csv.parent / MANIFEST)


def converted(out_dir: Path) -> dict | None:
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format_version") != FORMAT_VERSION or not all((out_dir / f).is_file() for f in OUTPUTS):
        return None
    return manifest


def manifest_sizes(manifest: Any, path: Path) -> tuple[int, int]:
    """(users, items) of a conversion manifest, or a one-line error naming the file."""
    try:
        if manifest["format_version"] != FORMAT_VERSION:
            raise ValueError(f"format_version {manifest['format_version']}, expected {FORMAT_VERSION}")
        return int(manifest["users"]), int(manifest["items"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainperfError(f"{path}: not a trainperf NCF manifest ({exc}); run trainperf prepare ncf again") from None


def load(out_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train user/item pairs [N, 2], test users [U], test positives [U], test negatives [U, 999])."""
    def table(name: str) -> np.ndarray:
        path = out_dir / name
        try:
            return pd.read_csv(path, sep="\t", header=None, dtype=np.int64).to_numpy()
        except (OSError, ValueError) as exc:
            raise TrainperfError(f"{path}: cannot read ({str(exc).splitlines()[0]})") from None

    train, test, negatives = (table(name) for name in OUTPUTS)
    if negatives.shape[1] != NUM_EVAL_NEGATIVES or negatives.shape[0] != test.shape[0]:
        raise TrainperfError(f"{out_dir / OUTPUTS[2]}: expected {test.shape[0]} rows of {NUM_EVAL_NEGATIVES} items")
    return train[:, :2], test[:, 0], test[:, 1], negatives


def generate_ratings(path: Path, n_users: int = 3000, n_items: int = 1000, dim: int = 8, seed: int = 0,
                     affinity_weight: float = 6.0, popularity_exponent: float = 1.2) -> int:
    """A synthetic ratings.csv in exactly the ml-20m format, from a planted preference model: users and
    items with latent factors, Zipf-like item popularity, a long-tailed number of ratings per user
    (>= 20), increasing timestamps per user and half-star ratings from the affinity. Returns rows."""
    rng = np.random.default_rng(seed)
    user_f = rng.normal(size=(n_users, dim))
    item_f = rng.normal(size=(n_items, dim))
    popularity = np.log(1.0 / np.arange(1, n_items + 1) ** popularity_exponent)
    rng.shuffle(popularity)
    counts = np.minimum(20 + rng.lognormal(mean=2.5, sigma=0.9, size=n_users).astype(int), n_items // 2)
    movie_ids = np.sort(rng.choice(np.arange(1, 20 * n_items), size=n_items, replace=False))
    rows = 0
    with AtomicOutput(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(HEADER)
        for u in range(n_users):
            affinity = item_f @ user_f[u] / np.sqrt(dim)
            logits = affinity_weight * affinity + popularity
            # Gumbel top-k: a sample without replacement with probabilities softmax(logits).
            chosen = np.argsort(-(logits + rng.gumbel(size=n_items)))[: counts[u]]
            stamps = 946_684_800 + rng.integers(0, 400_000_000) + np.cumsum(rng.exponential(86_400, counts[u]))
            stars = np.clip(np.round((3.5 + affinity[chosen] + rng.normal(0, 0.5, counts[u])) * 2) / 2, 0.5, 5.0)
            for item, stamp, star in zip(chosen, stamps.astype(np.int64), stars, strict=True):
                writer.writerow([u + 1, int(movie_ids[item]), f"{star:.1f}", int(stamp)])
            rows += int(counts[u])
    return rows


def converted_dir(data_dir: Path) -> Path:
    """The folder holding ratings.csv (the conversion is cached beside it, as the reference does): DIR
    itself, or DIR/ml-20m when the user points at the folder the zip was extracted into."""
    return data_dir / "ml-20m" if (data_dir / "ml-20m").is_dir() else data_dir


class MovieLens(DataSource):
    """ml-20m's ratings.csv, converted beside itself into the reference's train and test files."""

    def again(self, data_dir: Path) -> str:
        return f"trainperf prepare ncf --scale full --data {data_dir}"

    def problems(self, data_dir: Path) -> list[str]:
        root = converted_dir(data_dir)
        manifest = converted(root)
        if manifest:
            why = staleness(manifest, root / "ratings.csv")
            return [f"{why}; run {self.again(data_dir)}"] if why else []
        if not (root / "ratings.csv").is_file():
            return [f"{root / 'ratings.csv'}: missing (expected ml-20m/ratings.csv with header "
                    "userId,movieId,rating,timestamp)"]
        return [f"{root}: ratings.csv not converted yet ({self.again(data_dir)})"]

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        root = converted_dir(data_dir)
        manifest = converted(root)
        if manifest:
            why = staleness(manifest, root / "ratings.csv")
            if why is None:
                say(f"{root}: already converted")
                return
            say(f"{why}: converting again")
        root.mkdir(parents=True, exist_ok=True)
        self.write_ratings(root, say)
        convert(root / "ratings.csv", root, say)

    def write_ratings(self, root: Path, say: Callable[[str], None]) -> None:
        """Nothing to write: the user's ratings.csv is the source."""

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return {"ratings.csv": converted_dir(data_dir) / "ratings.csv"}

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        root = converted_dir(data_dir)  # one test item per user: empty only with no user at all
        manifest = converted(root)
        return (root / MANIFEST, int(manifest["users"])) if manifest else None


class PlantedRatings(MovieLens):
    """The mini: a planted-preference ratings.csv in ml-20m's format, then the reference's conversion."""

    generated = True

    def __init__(self, users: int, items: int) -> None:
        self.users, self.items = users, items

    def again(self, data_dir: Path) -> str:
        return "trainperf prepare ncf"

    def problems(self, data_dir: Path) -> list[str]:
        if not converted(converted_dir(data_dir)):
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare ncf)"]
        return super().problems(data_dir)

    def write_ratings(self, root: Path, say: Callable[[str], None]) -> None:
        if not (root / "ratings.csv").is_file():
            rows = generate_ratings(root / "ratings.csv", self.users, self.items)
            say(f"wrote {rows:,} synthetic ratings to {root / 'ratings.csv'} (ml-20m format)")
