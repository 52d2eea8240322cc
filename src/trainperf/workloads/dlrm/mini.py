"""The DLRM mini: day files in Criteo's raw TSV format, labelled by a planted teacher (a small
random DLRM whose AUC on the data is the best any model can reach), so the target means something."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainperf.files import AtomicOutput, write_json_atomic
from trainperf.workloads.dlrm.data import _MINUS, _NL, _TAB, N_DENSE, N_SPARSE, CriteoDays, day_file, preprocessed

TEACHER = "mini_teacher.json"
# Per-feature vocabulary sizes of the mini data: a few tiny tables (3, 4, 10 rows, as in Criteo) up to
# tens of thousands; the preprocessed table sizes follow from whatever the data then contains.
MINI_CARDINALITIES = (2000, 800, 300, 3, 60, 20000, 4, 150, 10, 6000, 400, 40, 14, 2500, 90, 9000, 200, 25,
                      12, 15000, 500, 1000, 36, 120, 3500, 80)
_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


def _render_int(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal text of int64 values as a [n, 11] byte matrix and the lengths."""
    negative = values < 0
    mag = np.abs(values)
    ndig = 1 + sum((mag >= 10 ** p).astype(np.int64) for p in range(1, 10))
    length = ndig + negative
    chars = np.zeros((values.size, 11), dtype=np.uint8)
    for k in range(11):
        i = k - negative  # digit index from the left
        digit = (mag // np.power(10, np.clip(ndig - 1 - i, 0, 9))) % 10
        chars[:, k] = np.where((k == 0) & negative, _MINUS, _DIGITS[digit])
    return chars, length


def _render_hex(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-digit lowercase hex of uint32 values (as Criteo writes them)."""
    v = values.astype(np.uint64)
    chars = np.stack([_DIGITS[(v >> np.uint64(4 * (7 - k))) & np.uint64(15)] for k in range(8)], axis=1)
    return chars, np.full(values.size, 8, dtype=np.int64)


def render_lines(fields: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """TSV bytes from per-column (chars [n, W], lengths [n]) pairs: tab between fields, newline after
    the last; a length of 0 is an empty field."""
    n, f = fields[0][1].size, len(fields)
    lengths = np.stack([length for _, length in fields], axis=1)
    widths = (lengths + 1).ravel()
    offsets = (np.cumsum(widths) - widths).reshape(n, f)
    out = np.empty(int(widths.sum()), dtype=np.uint8)
    ends = offsets + lengths
    out[ends.ravel()] = _TAB
    out[ends[:, -1]] = _NL
    for col, (chars, length) in enumerate(fields):
        for k in range(chars.shape[1]):
            present = k < length
            out[offsets[present, col] + k] = chars[present, k]
    return out.tobytes()


class _Teacher:
    """The planted model behind the mini data: per-value weights for every categorical feature,
    latent vectors whose dot products add pairwise interactions (what DLRM's interaction layer
    models), and a per-row activity that drives both the counts (dense features) and the click."""

    def __init__(self, seed: int, dim: int = 4) -> None:
        rng = np.random.default_rng(seed)
        self.cards = MINI_CARDINALITIES
        # Rare values carry less of the signal than frequent ones (as in click logs): the weight scale
        # shrinks with the vocabulary size.
        scale = rng.choice([0.0, 0.3, 0.6, 1.0], size=N_SPARSE, p=[0.2, 0.3, 0.3, 0.2])
        scale *= np.minimum(1.0, (500 / np.array(self.cards)) ** 0.25)
        self.weights = [rng.normal(0, s, c) for s, c in zip(scale, self.cards, strict=True)]
        self.latent = [rng.normal(0, 1 / np.sqrt(dim), (c, dim)) for c in self.cards]
        self.pairs = [(0, 1), (1, 2), (2, 7), (4, 10), (7, 11), (10, 14), (13, 16), (17, 20), (21, 23), (3, 6)]
        self.popularity = [1.0 / np.arange(1, c + 1) ** 1.1 for c in self.cards]
        for p in self.popularity:
            p /= p.sum()
        # Distinct raw 32-bit values per feature, written as hex (what hashing then maps mod 40M).
        self.raw = [rng.choice(np.unique(rng.integers(0, 2**32, 2 * c + 64, dtype=np.uint64)), c, replace=False)
                    for c in self.cards]
        self.dense_mu = rng.uniform(0.5, 4.0, N_DENSE)
        self.dense_gain = rng.uniform(0.2, 0.9, N_DENSE)
        self.dense_missing = rng.choice([0.0, 0.05, 0.2, 0.45], size=N_DENSE)
        self.sparse_missing = rng.choice([0.0, 0.0, 0.02, 0.3], size=N_SPARSE)
        self.bias = -1.6

    def sample(self, n: int, rng: np.random.Generator) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray,
                                                                 np.ndarray]:
        """n rows: their rendered columns, labels and the teacher's logits."""
        activity = rng.normal(size=n)
        ids = np.stack([rng.choice(c, size=n, p=p) for c, p in zip(self.cards, self.popularity, strict=True)], 1)
        present = rng.random((n, N_SPARSE)) >= self.sparse_missing
        logit = self.bias + 0.6 * activity
        for j in range(N_SPARSE):
            logit += np.where(present[:, j], self.weights[j][ids[:, j]], 0.0)
        for a, b in self.pairs:
            dot = np.einsum("nd,nd->n", self.latent[a][ids[:, a]], self.latent[b][ids[:, b]])
            logit += 1.5 * np.where(present[:, a] & present[:, b], dot, 0.0)
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        columns = [_render_int(labels)]
        for j in range(N_DENSE):
            count = np.floor(np.exp(self.dense_mu[j] + self.dense_gain[j] * activity + rng.normal(0, 0.7, n))) - 1
            if j == 1:
                count -= 3  # Criteo's I2 has small negative values (clipped to 0 by preprocessing)
            chars, length = _render_int(count.astype(np.int64))
            columns.append((chars, np.where(rng.random(n) < self.dense_missing[j], 0, length)))
        for j in range(N_SPARSE):
            chars, length = _render_hex(self.raw[j][ids[:, j]])
            columns.append((chars, np.where(present[:, j], length, 0)))
        return columns, labels, logit


def generate_days(data_dir: Path, days: int, rows_per_day: int, seed: int = 0) -> dict:
    """Write `day_0` … `day_{days-1}` in the raw Criteo TSV format from the planted teacher (see
    _Teacher) and record the teacher's own AUC on the evaluation rows (first half of the last day)."""
    from sklearn.metrics import roc_auc_score

    teacher = _Teacher(seed)
    rng = np.random.default_rng(seed + 1)
    data_dir.mkdir(parents=True, exist_ok=True)
    block = 100_000
    eval_labels, eval_logits = [], []
    test_rows = -(-rows_per_day // 2)
    for day in range(days):
        with AtomicOutput(day_file(data_dir, day)) as tmp, tmp.open("wb") as fh:
            for start in range(0, rows_per_day, block):
                n = min(block, rows_per_day - start)
                columns, labels, logits = teacher.sample(n, rng)
                fh.write(render_lines(columns))
                if day == days - 1 and start < test_rows:
                    keep = min(n, test_rows - start)
                    eval_labels.append(labels[:keep])
                    eval_logits.append(logits[:keep])
    labels, logits = np.concatenate(eval_labels), np.concatenate(eval_logits)
    stats = {"days": days, "rows_per_day": rows_per_day, "seed": seed, "positive_rate": float(labels.mean()),
             "teacher_auc": float(roc_auc_score(labels, logits))}
    write_json_atomic(data_dir / TEACHER, stats)
    return stats


class PlantedTeacherDays(CriteoDays):
    """The mini: day files of a planted teacher in Criteo's raw TSV format, then the reference's
    preprocessing."""

    generated = True

    def __init__(self, days: int, rows_per_day: int) -> None:
        super().__init__(days)
        self.rows_per_day = rows_per_day

    def again(self, data_dir: Path) -> str:
        return "trainperf prepare dlrm"

    def problems(self, data_dir: Path) -> list[str]:
        if not preprocessed(data_dir):
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare dlrm)"]
        return super().problems(data_dir)

    def write_days(self, data_dir: Path, say: Callable[[str], None]) -> None:
        if not all(day_file(data_dir, d).is_file() for d in range(self.days)):
            stats = generate_days(data_dir, self.days, self.rows_per_day)
            say(f"wrote {self.days} day files of {self.rows_per_day:,} rows to {data_dir} (Criteo raw TSV format); "
                f"teacher AUC on the eval half {stats['teacher_auc']:.4f}")
