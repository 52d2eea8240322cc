"""Batched beam search for the translation models.

A model supplies a `Stepper` for a batch of source sentences: `step(tokens)` gives the next-token
log-probabilities of every hypothesis from all its tokens so far (a model with an incremental cache
reads only the last column and its cached keys/values or LSTM states), and `keep(index)` reorders
or shrinks its state to the hypotheses that survive. Hypotheses are scored as GNMT and tensor2tensor
do: log-probability / ((5 + length) / 6)^alpha (+ a coverage penalty for GNMT). A sentence is done
when `beam` hypotheses have ended (fairseq's early stop) or at its maximum length; done sentences
leave the batch, so a long sentence never keeps the short ones' rows busy.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


class Stepper(Protocol):
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [N, t] -> (log-probabilities [N, V], attention over the source [N, S] or None)."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep the hypotheses `index` (rows of the current N), in that order."""


def length_penalty(length: int | torch.Tensor, alpha: float, constant: float = 5.0) -> float | torch.Tensor:
    return ((constant + length) / (constant + 1.0)) ** alpha


def coverage_penalty(coverage: torch.Tensor, source_mask: torch.Tensor, beta: float) -> torch.Tensor:
    """GNMT's: beta * sum over source words of log(min(attention received, 1))."""
    clipped = coverage.clamp(min=1e-10, max=1.0).log() * source_mask
    return beta * clipped.sum(-1)


def beam_search(stepper: Stepper, batch: int, beam: int, max_lengths: torch.Tensor, bos: int, eos: int,
                alpha: float = 0.6, lp_constant: float = 5.0, coverage: float = 0.0,
                source_mask: torch.Tensor | None = None) -> list[list[int]]:
    """The best hypothesis of each of `batch` sentences (token ids without BOS/EOS). The stepper's
    rows must start as `batch * beam` rows, sentence-major (each sentence's beams together).
    max_lengths [batch]: tokens each sentence may generate, its EOS included."""
    device = max_lengths.device
    alive = torch.arange(batch, device=device)  # original sentence of each active sentence
    tokens = torch.full((batch * beam, 1), bos, dtype=torch.long, device=device)
    scores = torch.zeros(batch, beam, device=device)
    scores[:, 1:] = -math.inf  # all beams start identical: only the first one may expand
    cover = torch.zeros(batch * beam, source_mask.shape[1], device=device) if coverage and source_mask is not None \
        else None
    masks = source_mask.repeat_interleave(beam, 0).float() if cover is not None else None
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    limit = int(max_lengths.max().item()) if batch else 0
    for t in range(limit):
        logp, attention = stepper.step(tokens)
        n = alive.numel()
        vocab = logp.shape[-1]
        logp = logp.float().view(n, beam, vocab)
        if cover is not None and attention is not None:
            cover = cover + attention.float()
        last = (max_lengths[alive] == t + 1)  # sentences that must end now
        if last.any():
            forced = torch.full_like(logp[last], -math.inf)
            forced[..., eos] = logp[last][..., eos]
            logp[last] = forced
        candidates = (scores.unsqueeze(-1) + logp).view(n, beam * vocab)
        top_scores, top_index = candidates.topk(min(2 * beam, beam * vocab), dim=1)
        source_beam, token = top_index // vocab, top_index % vocab
        ended = token == eos
        # Finalise the hypotheses that end among the top `beam` candidates.
        final = ended & (torch.arange(top_scores.shape[1], device=device) < beam) & (top_scores > -math.inf)
        if final.any():
            rows, cols = final.nonzero(as_tuple=True)
            hyp_rows = rows * beam + source_beam[rows, cols]
            normalised = top_scores[rows, cols] / length_penalty(t + 1, alpha, lp_constant)
            if cover is not None:
                normalised = normalised + coverage_penalty(cover[hyp_rows], masks[hyp_rows], coverage)
            for r, h, s in zip(rows.tolist(), hyp_rows.tolist(), normalised.tolist(), strict=True):
                finished[int(alive[r])].append((s, tokens[h, 1:].tolist()))
        # The best `beam` candidates that did not end continue.
        continuing = top_scores.masked_fill(ended, -math.inf)
        next_scores, pick = continuing.topk(beam, dim=1)
        next_beam, next_token = source_beam.gather(1, pick), token.gather(1, pick)
        done = torch.tensor([len(finished[int(s)]) >= beam for s in alive.tolist()], device=device) | last
        done |= ~torch.isfinite(next_scores).any(1)
        keep = (~done).nonzero(as_tuple=True)[0]
        if keep.numel() == 0:
            break
        rows = (keep.unsqueeze(1) * beam + next_beam[keep]).reshape(-1)
        tokens = torch.cat([tokens[rows], next_token[keep].reshape(-1, 1)], dim=1)
        scores = next_scores[keep]
        alive = alive[keep]
        if cover is not None:
            cover, masks = cover[rows], masks[rows]
        stepper.keep(rows)
    return [max(hyps, key=lambda h: h[0])[1] if hyps else [] for hyps in finished]


def greedy_search(stepper: Stepper, batch: int, max_lengths: torch.Tensor, bos: int, eos: int) -> list[list[int]]:
    """Each sentence's most likely next token at every step, until EOS or its maximum length."""
    device = max_lengths.device
    tokens = torch.full((batch, 1), bos, dtype=torch.long, device=device)
    out: list[list[int]] = [[] for _ in range(batch)]
    alive = torch.arange(batch, device=device)
    for t in range(int(max_lengths.max().item()) if batch else 0):
        logp, _ = stepper.step(tokens)
        best = logp.argmax(-1)
        best = torch.where(max_lengths[alive] == t + 1, torch.full_like(best, eos), best)
        for i, token in zip(alive.tolist(), best.tolist(), strict=True):
            if token != eos:
                out[i].append(token)
        keep = (best != eos).nonzero(as_tuple=True)[0]
        if keep.numel() == 0:
            break
        tokens = torch.cat([tokens[keep], best[keep].unsqueeze(1)], dim=1)
        alive = alive[keep]
        stepper.keep(keep)
    return out
