"""Length-bucketed, token-budgeted batches (fairseq's and the references' batching): sentences sorted
by length with random tie-breaks, cut into batches whose padded size (sentences x the longest side)
stays within a token budget, the batches shuffled. A global batch is a number of tokens; each process
takes a contiguous share of every global batch's sentences, so all take the same number of steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, rng: np.random.Generator,
                  multiple: int = 1) -> list[np.ndarray]:
    """Index arrays of sentences whose count x longest side (either language) <= max_tokens; a batch's
    sentence count is a multiple of `multiple` (the processes sharing it) where it can be. Sentences
    longer than the budget alone cannot be batched: the caller filters them first."""
    longest = np.maximum(src_lengths, tgt_lengths)
    if len(longest) and longest.max() > max_tokens:
        raise ValueError(f"a sentence of {int(longest.max())} tokens exceeds the batch budget of {max_tokens}")
    order = np.lexsort((rng.random(len(longest)), longest))  # by length, ties in random order
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        # The batch grows while (count + 1) x the next sentence's length fits: lengths only rise.
        end = start
        while end < n and (end - start + 1) * longest[order[end]] <= max_tokens:
            end += 1
        if multiple > 1 and end - start >= multiple:
            end = start + (end - start) // multiple * multiple
        batches.append(order[start:end])
        start = end
    rng.shuffle(batches)
    return batches


@dataclass
class Padding:
    """Real and padded tokens of a set of batches (both sides)."""

    real: int
    padded: int

    @property
    def fraction(self) -> float:
        return 1.0 - self.real / self.padded if self.padded else 0.0


def padding(batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> Padding:
    real = padded = 0
    for rows in batches:
        s, t = src_lengths[rows], tgt_lengths[rows]
        real += int(s.sum() + t.sum())
        padded += len(rows) * int(s.max() + t.max())
    return Padding(real, padded)


def shard(rows: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This process's contiguous share of a global batch's sentences."""
    size = -(-len(rows) // world)
    return rows[rank * size:(rank + 1) * size]


def bucketed_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_size: int, buckets: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """The GNMT reference's bucketing: sentences grouped into `buckets` equal-width ranges of their
    longer side, shuffled within each range, cut into batches of `batch_size` sentences, the batches
    shuffled. The buckets are laid end to end before cutting, so an epoch has exactly
    ceil(n / batch_size) batches whatever the lengths (at most buckets - 1 batches straddle two)."""
    longest = np.maximum(src_lengths, tgt_lengths)
    low, high = int(longest.min(initial=0)), int(longest.max(initial=0)) + 1
    width = max(1, -(-(high - low) // buckets))
    bucket = (longest - low) // width
    order = np.lexsort((rng.random(len(longest)), bucket))  # by bucket, random within
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches
