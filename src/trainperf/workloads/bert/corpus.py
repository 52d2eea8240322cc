"""Text to pretraining sequences, as the reference's create_pretraining_data does it, and the mini corpus.

Input text is in the reference's layout: one sentence per line, a blank line between documents. Each
document becomes sequences of at most `max_seq_length` WordPiece tokens: [CLS] A [SEP] B [SEP], where B
follows A in the document or, half of the time, comes from another document (next_sentence_label 1);
with probability short_seq_prob a shorter target length is drawn; 15 % of the tokens (at most
`max_predictions`) are masked: 80 % become [MASK], 10 % a random token, 10 % stay. The whole text is
processed `dupe_factor` times with different masks. The random stream is numpy's, seeded with the
reference's 12345, so the output is reproducible (not bit-identical to the TensorFlow script).

The mini corpus is English that ships with every Python: the docstrings of the standard library
(read from the source files with `ast`, nothing imported) and the help topics of `pydoc_data`.
Documents are assigned to training or to the held-out evaluation text by a hash of their content.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SEED = 12345  # the reference's mandatory random_seed


@dataclass(frozen=True)
class InstanceConfig:
    max_seq_length: int
    max_predictions: int
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    seed: int = SEED


# ---------------------------------------------------------------------------------------------
# the mini corpus
# ---------------------------------------------------------------------------------------------
_SKIP = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "idle_test"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def _sentences(text: str) -> list[str]:
    """Prose sentences of a docstring: paragraphs rejoined, code examples and tables dropped."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if any(line.lstrip().startswith((">>>", "...", "$ ")) or line.startswith("    ") for line in lines):
            continue
        joined = " ".join(line.strip() for line in lines if line.strip())
        if len(joined) < 20 or joined.count("=") > 3 or joined.count("|") > 2:
            continue
        out.extend(s.strip() for s in _SENTENCE_END.split(joined) if len(s.strip()) > 3)
    return out


def stdlib_documents(min_chars: int = 120) -> list[list[str]]:
    """The standard library's docstrings and pydoc help topics as documents (lists of sentences), in a
    fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    texts.append(doc)
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip it
        topics = {}
    texts.extend(topics[k] for k in sorted(topics))
    docs, seen = [], set()
    for text in texts:
        sentences = _sentences(text)
        key = "\n".join(sentences)
        if len(sentences) >= 2 and key not in seen:
            seen.add(key)
            docs.append(sentences)
    if not docs:
        raise TrainperfError(f"{root}: no standard-library docstrings found to build the mini BERT corpus")
    return docs


def held_out(document: Sequence[str], every: int) -> bool:
    """Whether a document belongs to the evaluation text (1 in `every`, by content hash)."""
    digest = hashlib.sha256("\n".join(document).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % every == 0


def write_text(path: Path, documents: Iterable[Sequence[str]]) -> None:
    """The reference's text layout: one sentence per line, a blank line after each document."""
    with open(path, "w", encoding="utf-8") as f:
        for doc in documents:
            f.write("\n".join(doc) + "\n\n")


def read_text(path: Path) -> list[list[str]]:
    """Documents of a text shard (blank-line separated, one sentence per line)."""
    docs: list[list[str]] = [[]]
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    docs[-1].append(line)
                elif docs[-1]:
                    docs.append([])
    except UnicodeDecodeError as exc:
        raise TrainperfError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return [d for d in docs if d]


# ---------------------------------------------------------------------------------------------
# vocabulary and tokenization (Hugging Face tokenizers' WordPiece)
# ---------------------------------------------------------------------------------------------
def train_vocabulary(documents: Iterable[Sequence[str]], size: int, out: Path) -> None:
    """An uncased WordPiece vocabulary (vocab.txt, BERT's format) learned from the documents."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=True, strip_accents=True)
    tokenizer.train_from_iterator((s for d in documents for s in d), vocab_size=size, min_frequency=2,
                                  special_tokens=list(SPECIAL), limit_alphabet=200)
    words = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    out.write_text("".join(w + "\n" for w, _ in words), encoding="utf-8")


def read_vocabulary(path: Path) -> list[str]:
    try:
        words = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainperfError(f"{path}: cannot read the vocabulary ({exc})") from None
    for token in SPECIAL:
        if token not in words:
            raise TrainperfError(f"{path}: not a BERT vocabulary (no {token} line)")
    return words


class Tokenizer:
    """vocab.txt's uncased WordPiece tokenizer (tokenizers), sentence -> ids."""

    def __init__(self, vocab: Path) -> None:
        from tokenizers import BertWordPieceTokenizer

        self.words = read_vocabulary(vocab)
        self.ids = {w: i for i, w in enumerate(self.words)}
        try:
            self._tok = BertWordPieceTokenizer(str(vocab), lowercase=True, strip_accents=True)
        except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exceptions on bad files
            raise TrainperfError(f"{vocab}: not a WordPiece vocabulary ({exc})") from None

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(sentences, add_special_tokens=False)]


# ---------------------------------------------------------------------------------------------
# instances
# ---------------------------------------------------------------------------------------------
def _truncate(a: list[int], b: list[int], limit: int, rng: np.random.Generator) -> None:
    """Trim the longer side, from the front or back at random, until the pair fits (as the reference)."""
    while len(a) + len(b) > limit:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def create_instances(documents: list[list[list[int]]], cfg: InstanceConfig, vocab_size: int, special: dict[str, int],
                     dupe_offset: int = 0) -> dict[str, np.ndarray]:
    """Pretraining rows from tokenized documents (lists of sentences of ids), in the shards' format."""
    rng = np.random.default_rng([cfg.seed, dupe_offset])
    cls, sep, mask, pad = special["[CLS]"], special["[SEP]"], special["[MASK]"], special["[PAD]"]
    reserved = set(special.values())
    max_tokens = cfg.max_seq_length - 3
    rows: list[tuple[list[int], list[int], list[int], list[int], int]] = []
    for _ in range(cfg.dupe_factor):
        for d, doc in enumerate(documents):
            target = max_tokens if rng.random() >= cfg.short_seq_prob else int(rng.integers(2, max_tokens + 1))
            chunk: list[list[int]] = []
            length = 0
            i = 0
            while i < len(doc):
                chunk.append(doc[i])
                length += len(doc[i])
                if i == len(doc) - 1 or length >= target:
                    if chunk:
                        cut = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
                        a = [t for s in chunk[:cut] for t in s]
                        b: list[int] = []
                        is_random = len(chunk) == 1 or rng.random() < 0.5
                        if is_random and len(documents) > 1:
                            other = int(rng.integers(0, len(documents) - 1))
                            other += other >= d
                            odoc = documents[other]
                            start = int(rng.integers(0, len(odoc)))
                            for s in odoc[start:]:
                                b.extend(s)
                                if len(b) >= target - len(a):
                                    break
                            i -= len(chunk) - cut  # the unused sentences start the next chunk
                        else:
                            is_random = False
                            b = [t for s in chunk[cut:] for t in s]
                        _truncate(a, b, max_tokens, rng)
                        if a and b:
                            tokens = [cls, *a, sep, *b, sep]
                            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                            positions, labels = _mask(tokens, cfg, vocab_size, reserved, mask, rng)
                            rows.append((tokens, segments, positions, labels, int(is_random)))
                    target = max_tokens if rng.random() >= cfg.short_seq_prob else int(rng.integers(2, max_tokens + 1))
                    chunk, length = [], 0
                i += 1
    order = rng.permutation(len(rows))
    n, seq, preds = len(rows), cfg.max_seq_length, cfg.max_predictions
    out = {"input_ids": np.full((n, seq), pad, dtype=np.int32), "input_mask": np.zeros((n, seq), dtype=np.int8),
           "segment_ids": np.zeros((n, seq), dtype=np.int8),
           "masked_lm_positions": np.zeros((n, preds), dtype=np.int32),
           "masked_lm_ids": np.zeros((n, preds), dtype=np.int32),
           "next_sentence_labels": np.zeros(n, dtype=np.int8)}
    for r, k in enumerate(order.tolist()):
        tokens, segments, positions, labels, nsp = rows[k]
        out["input_ids"][r, : len(tokens)] = tokens
        out["input_mask"][r, : len(tokens)] = 1
        out["segment_ids"][r, : len(tokens)] = segments
        out["masked_lm_positions"][r, : len(positions)] = positions
        out["masked_lm_ids"][r, : len(labels)] = labels
        out["next_sentence_labels"][r] = nsp
    return out


def _mask(tokens: list[int], cfg: InstanceConfig, vocab_size: int, reserved: set[int], mask_id: int,
          rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Mask tokens in place; returns (sorted positions, original ids)."""
    candidates = [i for i, t in enumerate(tokens) if t not in reserved]
    count = min(cfg.max_predictions, max(1, round(len(tokens) * cfg.masked_lm_prob)))
    picks = sorted(rng.permutation(candidates)[:count].tolist())
    labels = []
    for i in picks:
        labels.append(tokens[i])
        draw = rng.random()
        if draw < 0.8:
            tokens[i] = mask_id
        elif draw < 0.9:
            tokens[i] = int(rng.integers(len(SPECIAL), vocab_size))
    return picks, labels
