"""SCROLLS GovReport as MLPerf's LoRA reference trains on it: the Hugging Face dataset
`regisss/scrolls_gov_report_preprocessed_mlperf_2` (mlcommons/training `llama2_70b_lora`: its scripts read
it with `load_dataset("parquet")`), already tokenized with Llama 2's tokenizer, in a dataset folder:

- `data/train-00000-of-00001.parquet`: 3,901 rows;
- `data/validation-00000-of-00001.parquet`: 173 rows;

each row `input_ids` (the prompt "### Summarize the following text:" with the report, then the summary)
and `labels` (the same ids, -100 where the loss is not taken), of up to 8,192 tokens.

A batch is one int64 tensor [rows, 2, seq_len]: ids and labels, padded to the recipe's sequence length
(padding ids 0, labels -100). The loss is the mean cross-entropy of every labelled next token of the batch;
the evaluation the mean over the samples of each one's mean over its labelled tokens (Hugging Face's
Trainer at the reference's evaluation batch of one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract import DataParts, EpochView, EvalPartial, RuntimeContext
from trainperf.errors import TrainperfError, shown
from trainperf.workloads.common.llm.data import lockstep_rows

TRAIN = "data/train-00000-of-00001.parquet"
VALID = "data/validation-00000-of-00001.parquet"
IGNORE = -100


def read_rows(path: Path, vocab_size: int, seq_len: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every row's ids and labels, checked: the columns, equal lengths within seq_len, ids in the vocabulary,
    labels an id or -100, at least one label a row. One line naming the file otherwise."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=None)
    except FileNotFoundError:
        raise TrainperfError(f"{path}: missing") from None
    except Exception as exc:  # pyarrow's errors for a damaged file
        raise TrainperfError(f"{path}: not a parquet file ({type(exc).__name__}: "
                             f"{shown(str(exc), 200)})") from None
    import pyarrow as pa

    missing = [c for c in ("input_ids", "labels") if c not in table.column_names]
    if missing:
        raise TrainperfError(f"{path}: no column {', '.join(missing)} (found {', '.join(table.column_names)})")
    for name in ("input_ids", "labels"):
        kind = table.schema.field(name).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type) \
                or (pa.types.is_unsigned_integer(kind.value_type) and kind.value_type.bit_width > 32):
            raise TrainperfError(f"{path}: column {name} is {kind}, expected lists of integer token ids")
        column = table.column(name)
        if column.null_count or any(chunk.values.null_count for chunk in column.chunks):
            raise TrainperfError(f"{path}: column {name} holds nulls, expected token ids in every row")
    ids, labels = [], []
    for i, (row_ids, row_labels) in enumerate(zip(table.column("input_ids").to_pylist(),
                                                  table.column("labels").to_pylist(), strict=True)):
        if not isinstance(row_ids, list) or not isinstance(row_labels, list):
            raise TrainperfError(f"{path}: row {i}: input_ids and labels must be lists of token ids")
        a, b = np.asarray(row_ids, dtype=np.int64), np.asarray(row_labels, dtype=np.int64)
        if a.size != b.size or not 2 <= a.size <= seq_len:
            raise TrainperfError(f"{path}: row {i}: {a.size} ids and {b.size} labels, expected equal lengths "
                                 f"from 2 to {seq_len}")
        if a.min() < 0 or a.max() >= vocab_size:
            raise TrainperfError(f"{path}: row {i}: token id outside the vocabulary of {vocab_size}")
        kept = b != IGNORE
        if not kept[1:].any() or b[kept].min() < 0 or b[kept].max() >= vocab_size:
            raise TrainperfError(f"{path}: row {i}: labels must be token ids or -100, with one at least "
                                 "after the first position")
        if (b[kept] != a[kept]).any():
            raise TrainperfError(f"{path}: row {i}: labels differ from input_ids where kept (Hugging Face's "
                                 "labels are the ids themselves; the model shifts them)")
        ids.append(a)
        labels.append(b)
    if not ids:
        raise TrainperfError(f"{path}: no rows")
    return ids, labels


def write_rows(path: Path, ids: list[np.ndarray], labels: list[np.ndarray]) -> None:
    """Rows as the reference's dataset holds them (the mini's generator), written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"input_ids": pa.array([a.tolist() for a in ids], type=pa.list_(pa.int32())),
                      "attention_mask": pa.array([[1] * len(a) for a in ids], type=pa.list_(pa.int8())),
                      "labels": pa.array([b.tolist() for b in labels], type=pa.list_(pa.int64()))})
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial)
    partial.replace(path)


def stack(ids: list[np.ndarray], labels: list[np.ndarray], rows: list[int], seq_len: int) -> torch.Tensor:
    out = np.zeros((len(rows), 2, seq_len), dtype=np.int64)
    out[:, 1, :] = IGNORE
    for j, i in enumerate(rows):
        out[j, 0, :ids[i].size] = ids[i]
        out[j, 1, :labels[i].size] = labels[i]
    return torch.from_numpy(out)


def _token_losses(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The whole row in, as Hugging Face's model takes it (the last position's prediction has no label): the
    # sequence stays a multiple of the tensor-parallel processes that sequence parallelism splits it among.
    logits = model(batch[:, 0])[:, :-1]
    labels = batch[:, 1, 1:]
    losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                             reduction="none").view(labels.shape)
    return losses, (labels != IGNORE)


def summary_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The mean over the batch's rows of each row's mean cross-entropy of its labelled next tokens.

    The reference (`scripts/train.py`, Hugging Face's Trainer) trains one row per device and the devices'
    gradients are averaged, so every row of a global batch weighs the same whatever its summary's length. A
    micro-batch of several rows (fewer devices than the global batch) keeps that weighting: the mean of the
    rows' means, never one mean over all their tokens, which would favour the long summaries.
    """
    return sample_losses(model, batch).mean()


def sample_losses(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Each sample's mean cross-entropy over its labelled tokens [rows]."""
    losses, kept = _token_losses(model, batch)
    return losses.sum(dim=1) / kept.sum(dim=1).clamp(min=1)


def eval_loss(totals: dict[str, Any]) -> float:
    return float(totals["loss"]) / max(1.0, float(totals["samples"]))


class GovReport:
    def __init__(self, recipe: Any, data_dir: Path, ctx: RuntimeContext) -> None:
        self.recipe, self.ctx = recipe, ctx
        vocab, seq = recipe.model.vocab_size, recipe.seq_len
        self.train = read_rows(data_dir / TRAIN, vocab, seq)
        self.valid = read_rows(data_dir / VALID, vocab, seq)
        if len(self.valid[0]) < recipe.eval_samples:
            raise TrainperfError(f"{data_dir / VALID}: {len(self.valid[0])} rows, the evaluation needs "
                                 f"{recipe.eval_samples}")
        self.steps_per_epoch = len(self.train[0]) // recipe.global_batch_size
        if self.steps_per_epoch < 1:
            raise TrainperfError(f"{data_dir / TRAIN}: {len(self.train[0])} rows, fewer than one global batch of "
                                 f"{recipe.global_batch_size}")

    def train_batches(self, view: EpochView) -> Iterator[torch.Tensor]:
        recipe, ctx = self.recipe, self.ctx
        order = np.random.default_rng([ctx.stream_seed("samples"), view.epoch]).permutation(len(self.train[0]))
        per_rank = ctx.batch_share(recipe.global_batch_size)
        for step in range(self.steps_per_epoch):
            first = step * recipe.global_batch_size + ctx.data_rank * per_rank
            rows = [int(i) for i in order[first:first + per_rank]]
            yield stack(*self.train, rows, recipe.seq_len).to(ctx.device)

    def evaluate(self, forward: Callable[[Any], Any]) -> EvalPartial:
        recipe, ctx = self.recipe, self.ctx
        loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        samples = torch.zeros((), dtype=torch.float64, device=ctx.device)
        for rows, counted in lockstep_rows(ctx, recipe.eval_samples, recipe.eval_batch_size):
            losses = forward(stack(*self.valid, list(rows), recipe.seq_len).to(ctx.device))
            if counted:
                loss += losses.double().sum()
                samples += losses.numel()
        return EvalPartial(metric=eval_loss, sums={"loss": loss, "samples": samples})


def data_parts(recipe: Any, data_dir: Path, ctx: RuntimeContext) -> DataParts:
    data = GovReport(recipe, data_dir, ctx)
    return DataParts(train_batches=data.train_batches, steps_per_epoch=data.steps_per_epoch,
                     train_samples=len(data.train[0]), eval_samples=recipe.eval_samples, evaluate=data.evaluate)
