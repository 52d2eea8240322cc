"""Pretraining batches: rows of the HDF5 shards (one sequence per row) turned into the tensors the
model reads, plain or packed (several sequences in one row).

Both layouts share one form, so one model and loss serve both: per-token `sequence_ids` (1, 2, … for
the sequences of a row, 0 for padding) give the block-diagonal attention mask, `position_ids` restart
at 0 for every sequence, `masked_lm_positions` index the row (padding slots point at token 0 with
label IGNORE), and `cls_positions` / `next_sentence_labels` hold one slot per sequence of a row.
The number of sequences rides along on the host (`PretrainingBatch.sequences`), so counting samples
never reads the device."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from trainperf.workloads.bert.model import IGNORE

# The HDF5 datasets of NVIDIA's prepared MLPerf BERT data (and of the reference TFRecords, less
# masked_lm_weights, which the padding of masked_lm_positions implies).
KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


@dataclass
class PretrainingBatch:
    tensors: dict[str, torch.Tensor]
    sequences: np.ndarray  # sequences in each row (host side)

    @property
    def samples(self) -> int:
        return int(self.sequences.sum())

    def split(self, parts: int) -> list[PretrainingBatch]:
        """Consecutive runs of rows (gradient-accumulation micro-batches)."""
        rows = len(self.sequences)
        cuts = np.array_split(np.arange(rows), min(parts, rows))
        return [PretrainingBatch({k: v[c[0]: c[-1] + 1] for k, v in self.tensors.items()}, self.sequences[c])
                for c in cuts if len(c)]


def real_lengths(rows: Mapping[str, np.ndarray]) -> np.ndarray:
    return rows["input_mask"].astype(bool).sum(axis=1)


def padding_fraction(lengths: np.ndarray, rows: int, seq_len: int) -> float:
    """The share of token slots that hold padding when `lengths` sequences fill `rows` rows."""
    return 1.0 - float(lengths.sum()) / (rows * seq_len) if rows else 0.0


def plain(rows: Mapping[str, np.ndarray], device: torch.device) -> PretrainingBatch:
    """One sequence per row, as the shards hold them."""
    ids = np.asarray(rows["input_ids"], dtype=np.int64)
    n, length = ids.shape
    positions = np.asarray(rows["masked_lm_positions"], dtype=np.int64)
    labels = np.where(positions > 0, np.asarray(rows["masked_lm_ids"], dtype=np.int64), IGNORE)
    arrays = {
        "input_ids": ids,
        "segment_ids": np.asarray(rows["segment_ids"], dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(length, dtype=np.int64), (n, length)),
        "sequence_ids": np.asarray(rows["input_mask"], dtype=np.int64),
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "cls_positions": np.zeros((n, 1), dtype=np.int64),
        "next_sentence_labels": np.asarray(rows["next_sentence_labels"], dtype=np.int64).reshape(n, 1),
    }
    return _to_device(arrays, np.ones(n, dtype=np.int64), device)


def pack_rows(lengths: np.ndarray, seq_len: int, max_per_row: int) -> list[list[int]]:
    """First-fit decreasing: sequences (by length) into rows of `seq_len` tokens, at most `max_per_row`
    each. Returns the sequence indices of every row."""
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order.tolist():
        length = int(lengths[i])
        for r, space in enumerate(free):
            if length <= space and len(rows[r]) < max_per_row:
                rows[r].append(i)
                free[r] -= length
                break
        else:
            rows.append([i])
            free.append(seq_len - length)
    return rows


def packed(rows: Mapping[str, np.ndarray], device: torch.device, max_per_row: int = 3) -> PretrainingBatch:
    """The same sequences packed several to a row (first-fit decreasing by real length)."""
    ids = np.asarray(rows["input_ids"], dtype=np.int64)
    n, length = ids.shape
    lengths = real_lengths(rows)
    layout = pack_rows(lengths, length, max_per_row)
    n_rows, preds = len(layout), rows["masked_lm_positions"].shape[1]
    out_ids = np.zeros((n_rows, length), dtype=np.int64)
    out_seg = np.zeros_like(out_ids)
    out_pos = np.zeros_like(out_ids)
    out_seq = np.zeros_like(out_ids)
    out_mpos = np.zeros((n_rows, max_per_row * preds), dtype=np.int64)
    out_mids = np.full_like(out_mpos, IGNORE)
    out_cls = np.zeros((n_rows, max_per_row), dtype=np.int64)
    out_nsp = np.full_like(out_cls, IGNORE)
    seg, mpos, mids = rows["segment_ids"], rows["masked_lm_positions"], rows["masked_lm_ids"]
    nsp = np.asarray(rows["next_sentence_labels"]).reshape(n)
    for r, members in enumerate(layout):
        start = 0
        for k, i in enumerate(members):
            size = int(lengths[i])
            span = slice(start, start + size)
            out_ids[r, span] = ids[i, :size]
            out_seg[r, span] = seg[i, :size]
            out_pos[r, span] = np.arange(size)
            out_seq[r, span] = k + 1
            valid = mpos[i] > 0
            slots = slice(k * preds, k * preds + int(valid.sum()))
            out_mpos[r, slots] = mpos[i][valid] + start
            out_mids[r, slots] = mids[i][valid]
            out_cls[r, k] = start
            out_nsp[r, k] = nsp[i]
            start += size
    arrays = {"input_ids": out_ids, "segment_ids": out_seg, "position_ids": out_pos, "sequence_ids": out_seq,
              "masked_lm_positions": out_mpos, "masked_lm_ids": out_mids, "cls_positions": out_cls,
              "next_sentence_labels": out_nsp}
    return _to_device(arrays, np.array([len(m) for m in layout], dtype=np.int64), device)


def _to_device(arrays: dict[str, np.ndarray], sequences: np.ndarray, device: torch.device) -> PretrainingBatch:
    pin = device.type == "cuda"
    tensors = {}
    for key, value in arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(value))
        tensors[key] = (t.pin_memory() if pin else t).to(device, non_blocking=pin)
    return PretrainingBatch(tensors, sequences)


def random_rows(n: int, seq_len: int, predictions: int, vocab: int, rng: np.random.Generator,
                min_fill: float = 0.3) -> dict[str, np.ndarray]:
    """Shard-like rows of random tokens with real lengths spread between min_fill and 1 of seq_len
    (synthetic benchmarks: padding like real data's, so packing has something to do)."""
    lengths = rng.integers(max(int(min_fill * seq_len), predictions + 3), seq_len + 1, size=n)
    cols = np.arange(seq_len)
    mask = (cols[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, vocab, size=(n, seq_len)) * mask
    segments = ((cols[None, :] >= lengths[:, None] // 2) * mask).astype(np.int64)
    positions = np.zeros((n, predictions), dtype=np.int64)
    labels = np.zeros_like(positions)
    for i, size in enumerate(lengths.tolist()):
        count = max(1, min(predictions, round(0.15 * size)))
        picks = np.sort(rng.choice(np.arange(1, size - 1), size=count, replace=False))
        positions[i, :count] = picks
        labels[i, :count] = rng.integers(5, vocab, size=count)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "masked_lm_positions": positions,
            "masked_lm_ids": labels, "next_sentence_labels": rng.integers(0, 2, size=n)}
