"""BLEU by sacrebleu, set to reproduce each MLPerf reference's scorer.

- Transformer: the reference scores with its own copy of tensor2tensor's BLEU (compute_bleu.py and
  utils/metrics.py): both sides lowercased (the uncased score is the one compared with the target),
  split on Unicode punctuation and symbols except punctuation next to digits (the mteval-v14
  "international" tokenization), corpus BLEU-4 where an order with no match counts 1 / (2^k x its
  n-grams) for the k-th such order (NIST's geometric smoothing), and the standard brevity penalty.
  That is sacrebleu with lowercase=True, tokenize="intl", smooth_method="exp" (tested against an
  independent implementation of the reference's algorithm on fixed strings).
- GNMT: the reference runs sacrebleu itself (`-lc --tokenize intl`, default exponential smoothing) on
  the detokenized output against the raw newstest2014.de.

Both are logged as a fraction (BLEU / 100), as the 0.7.0 rules expect (eval_accuracy >= 0.25 / 0.24).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

SCORERS = {
    "transformer": {"lowercase": True, "tokenize": "intl", "smooth_method": "exp"},
    "gnmt": {"lowercase": True, "tokenize": "intl", "smooth_method": "exp"},
}


def bleu(hypotheses: Sequence[str], references: Sequence[str], scorer: str) -> float:
    """Corpus BLEU (0-100) of `hypotheses` against one reference each (force: sacrebleu only warns
    when many lines end in a detached full stop; the score is the same)."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=True,
                                     **SCORERS[scorer]).score)


def bleu_fraction(combined: dict[str, Any], references: Sequence[str], scorer: str) -> float:
    """An EvalPartial metric: `combined["translations"]` holds (sentence index, text) pairs from every
    process; BLEU / 100 over the whole test set in its order."""
    found = dict(combined["translations"])
    if len(found) != len(references):
        raise ValueError(f"{len(found)} translations for {len(references)} test sentences")
    return bleu([found[i] for i in range(len(references))], references, scorer) / 100.0


def metric(references: Sequence[str], scorer: str) -> functools.partial:
    """The EvalPartial metric for a test set: picklable, so that it can run in a worker process."""
    return functools.partial(bleu_fraction, references=list(references), scorer=scorer)
