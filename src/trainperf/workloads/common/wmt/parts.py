"""What both translation workloads do with their prepared arrays: training batches as tensors, and
each process's share of the test set decoded to text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainperf.workloads.common.wmt.text import BOS, EOS, PAD, Encoded, pad_batch


def training_batch(src: Encoded, tgt: Encoded, rows: np.ndarray, device: torch.device,
                   source_lengths: bool = False, shape: tuple[int, int] | None = None) -> tuple[Any, ...]:
    """(source + EOS, BOS + target, target + EOS), padded, on the device; with `source_lengths`, then
    the sources' lengths as a list of ints: known here on the host, they need no read-back from the
    device in the step (a packed LSTM wants them on the host), and DDP leaves a list where it is.
    With `shape` (rows, length): every array padded to it (a shape bucket), the extra rows empty
    pairs that the loss ignores (see `pad_to`), and the sources' lengths a device tensor."""
    arrays = (pad_batch(src, rows, suffix=EOS), pad_batch(tgt, rows, prefix=BOS), pad_batch(tgt, rows, suffix=EOS))
    if shape is not None:
        arrays = pad_to(*arrays, shape=shape)
    batch = tuple(torch.from_numpy(a).to(device, non_blocking=True) for a in arrays)
    if source_lengths:
        lengths = (arrays[0] != PAD).sum(1)
        # A bucketed batch is for a compiled step, whose guards would specialise on every int of a list.
        batch += (torch.from_numpy(lengths).to(device, non_blocking=True) if shape is not None else lengths.tolist(),)
    return batch


def pad_to(src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, shape: tuple[int, int]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch padded to `shape` (rows, length) with PAD columns and with empty rows: a source of EOS alone
    (attention over an all-PAD source would have no key and give NaN) and a target of PAD, which the loss's
    ignore_index drops, so the padded batch's loss and gradients are the unpadded one's."""
    rows, length = shape
    if src.shape[0] > rows or max(src.shape[1], tgt_in.shape[1]) > length:
        raise ValueError(f"a batch of {src.shape[0]} x {max(src.shape[1], tgt_in.shape[1])} tokens does not fit "
                         f"its bucket {rows} x {length}")
    out = []
    for array, first in ((src, EOS), (tgt_in, BOS), (tgt_out, PAD)):
        padded = np.full((rows, length), PAD, dtype=array.dtype)
        padded[:array.shape[0], :array.shape[1]] = array
        padded[array.shape[0]:, 0] = first
        out.append(padded)
    return out[0], out[1], out[2]


def test_share(lengths: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This process's test sentences: sorted by length and dealt round-robin, so that every process
    decodes a similar mix and each batch holds sentences of similar length."""
    return np.argsort(lengths, kind="stable")[rank::world]


def translate_share(test_src: Encoded, order: np.ndarray, batch_size: int,
                    forward: Callable[[torch.Tensor], list[list[int]]],
                    to_text: Callable[[list[list[int]]], Sequence[str]], device: torch.device,
                    max_source: int | None = None) -> list[tuple[int, str]]:
    """(test sentence index, translation) for the sentences `order`, decoded `batch_size` at a time;
    sources longer than `max_source` tokens are cut (the model's positions)."""
    found: list[tuple[int, str]] = []
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        src = pad_batch(test_src, rows, suffix=EOS)
        if max_source is not None:
            src = src[:, :max_source]
        found += zip(rows.tolist(), to_text(forward(torch.from_numpy(src).to(device))), strict=True)
    return found


def random_tokens(rows: int, length: int, vocab: int, device: torch.device, seed: int) -> torch.Tensor:
    """Random word ids (no specials) for synthetic batches: warm-up and throughput runs only."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(EOS + 1, vocab, (rows, length), device=device, generator=gen)


def synthetic_training_batch(rows: int, length: int, vocab: int, device: torch.device,
                             source_lengths: bool | str = False) -> tuple[Any, ...]:
    """(source, BOS + target, target) of `rows` random sentences of `length` tokens (and the sources'
    lengths, as `training_batch`: a list, or with "tensor" a device tensor, as a bucketed batch has)."""
    src, tgt = random_tokens(rows, length, vocab, device, 0), random_tokens(rows, length, vocab, device, 1)
    batch = (src, torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1), tgt)
    if source_lengths == "tensor":
        return batch + (torch.full((rows,), length, dtype=torch.int64, device=device),)
    return batch + ([length] * rows,) if source_lengths else batch
