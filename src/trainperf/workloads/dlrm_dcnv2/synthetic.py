"""The DLRM-DCNv2 mini: day files in the reference's multi-hot layout (data.py), labelled by a planted
teacher, so that the target sits between two measured bounds: the teacher's own AUC (no model can do better
on its labels) and a logistic regression on the dense features alone (what ignoring the tables gives).

The teacher draws, per row, one id per feature (Zipf-like popularity, as click logs have), a latent activity
that drives the dense counts and the click, per-id weights, and pairwise interactions of latent id vectors
between some features (what a cross network models). The one-hot ids then become bags as the reference's
`materialize_synthetic_multihot_dataset.py` makes them (uniform): the id in column 0, then ids drawn once per
table row from a fixed random table, so a bag is a function of its id."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import write_json_atomic
from trainperf.workloads.dlrm_dcnv2 import data

TEACHER = "mini_teacher.json"
DAYS, ROWS_PER_DAY = 5, 65_536  # days 0-3 train (262,144 rows), the first half of day 4 evaluates (32,768)
# Per-feature table sizes (a few tiny tables, as Criteo's 3-, 4- and 10-row ones, up to tens of thousands) and
# bag sizes: the reference's, capped at 8 ids so that the files stay small (97 ids a row, against 214).
TABLES = (2000, 800, 300, 3, 60, 20000, 4, 150, 10, 6000, 400, 40, 14, 2500, 90, 9000, 200, 25, 12, 15000, 500, 1000,
          36, 120, 3500, 80)
HOTNESS = tuple(min(h, 8) for h in data.MULTI_HOT_SIZES)


class Teacher:
    def __init__(self, seed: int, dim: int = 4) -> None:
        rng = np.random.default_rng(seed)
        # Rare values carry less of the signal than frequent ones: the weights shrink with the table's size.
        scale = rng.choice([0.0, 0.3, 0.6, 1.0], size=data.N_SPARSE, p=[0.2, 0.3, 0.3, 0.2])
        scale *= np.minimum(1.0, (500 / np.array(TABLES)) ** 0.25)
        self.weights = [rng.normal(0, s, n) for s, n in zip(scale, TABLES, strict=True)]
        self.latent = [rng.normal(0, 1 / np.sqrt(dim), (n, dim)) for n in TABLES]
        self.pairs = [(0, 1), (1, 2), (2, 7), (4, 10), (7, 11), (10, 14), (13, 16), (17, 20), (21, 23), (3, 6)]
        self.popularity = []
        for n in TABLES:
            p = 1.0 / np.arange(1, n + 1) ** 1.1
            self.popularity.append(p / p.sum())
        self.dense_mu = rng.uniform(0.5, 4.0, data.N_DENSE)
        self.dense_gain = rng.uniform(0.2, 0.9, data.N_DENSE)
        self.dense_missing = rng.choice([0.0, 0.05, 0.2, 0.45], size=data.N_DENSE)
        self.bias = -1.6
        # The multi-hot expansion: for each table row, the ids its bag adds (the reference seeds it with 0).
        bags = np.random.default_rng(0)
        self.bags = [bags.integers(0, n, (n, h - 1)) for n, h in zip(TABLES, HOTNESS, strict=True)]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
        """n rows: dense float32 [n, 13] (log(x + 3) of counts, missing ones 0, as the reference's preprocessing
        writes them), 26 bags int32 [n, h_j], labels int32 [n], the teacher's logits."""
        activity = rng.normal(size=n)
        ids = np.stack([rng.choice(t, size=n, p=p) for t, p in zip(TABLES, self.popularity, strict=True)], 1)
        logit = self.bias + 0.6 * activity
        for j in range(data.N_SPARSE):
            logit += self.weights[j][ids[:, j]]
        for a, b in self.pairs:
            logit += 1.5 * np.einsum("nd,nd->n", self.latent[a][ids[:, a]], self.latent[b][ids[:, b]])
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int32)
        counts = np.floor(np.exp(self.dense_mu + self.dense_gain * activity[:, None] + rng.normal(0, 0.7, (n, 13)))) - 1
        counts[rng.random((n, data.N_DENSE)) < self.dense_missing] = 0
        dense = np.log(counts + 3).astype(np.float32)
        sparse = [np.concatenate([ids[:, j:j + 1], self.bags[j][ids[:, j]]], axis=1).astype(np.int32)
                  for j in range(data.N_SPARSE)]
        return dense, sparse, labels, logit


def generate(data_dir: Path, days: int = DAYS, rows_per_day: int = ROWS_PER_DAY, seed: int = 0) -> dict[str, Any]:
    """Write day_0 ... day_{days-1} and record the two bounds on the evaluation half of the last day."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    teacher = Teacher(seed)
    rng = np.random.default_rng(seed + 1)
    train_dense, train_labels = [], []
    for day in range(days):
        dense, sparse, labels, logits = teacher.sample(rows_per_day, rng)
        data.write_day(data_dir, day, dense, sparse, labels)
        if day < days - 1:
            train_dense.append(dense)
            train_labels.append(labels)
    half = data.eval_rows(rows_per_day)
    eval_dense, eval_labels, eval_logits = dense[:half], labels[:half], logits[:half]
    dense_only = LogisticRegression(max_iter=1000).fit(np.concatenate(train_dense), np.concatenate(train_labels))
    stats = {"days": days, "rows_per_day": rows_per_day, "seed": seed,
             "positive_rate": float(eval_labels.mean()),
             "teacher_auc": float(roc_auc_score(eval_labels, eval_logits)),
             "dense_only_auc": float(roc_auc_score(eval_labels, dense_only.decision_function(eval_dense)))}
    write_json_atomic(data_dir / TEACHER, stats)
    return stats


class PlantedMultiHot(DataSource):
    """The mini's day files, generated once into the cache."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        if not (data_dir / TEACHER).is_file():
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare dlrm_dcnv2)"]
        return data.MultiHotDays(DAYS, HOTNESS).problems(data_dir)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        if not self.problems(data_dir):
            say(f"{data_dir}: already generated")
            return
        stats = generate(data_dir)
        say(f"wrote {DAYS} days of {ROWS_PER_DAY:,} rows to {data_dir} (the reference's multi-hot layout); on the "
            f"evaluation half: the teacher's AUC {stats['teacher_auc']:.4f}, dense features alone "
            f"{stats['dense_only_auc']:.4f}")

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data.labels_file(data_dir, DAYS - 1), data.eval_rows(ROWS_PER_DAY)


def bounds(data_dir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((data_dir / TEACHER).read_text())
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{data_dir / TEACHER}: unreadable ({exc})") from None
