"""Parallel text as the WMT files hold it (one sentence per line, the two sides in two files), read
with checks that name the file and line, and its subword-encoded form cached as arrays."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput

# Special ids of every trainperf subword vocabulary (the GNMT reference's order).
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def read_lines(path: Path) -> list[str]:
    """The file's lines without their line ends; a missing file or a line that is not UTF-8 is one
    line naming the file (and line)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TrainperfError(f"{path}: missing") from None
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TrainperfError(f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def read_parallel(source: Path, target: Path) -> tuple[list[str], list[str]]:
    """Both sides of a parallel file pair, which must have as many lines each."""
    src, tgt = read_lines(source), read_lines(target)
    if len(src) != len(tgt):
        raise TrainperfError(f"{source} has {len(src):,} lines but {target} has {len(tgt):,}: "
                             "the two sides of a parallel corpus must have one line per sentence each")
    return src, tgt


@dataclass
class Encoded:
    """Sentences of token ids, concatenated (`tokens`) with their start offsets (`offsets`, n + 1)."""

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def from_lists(cls, sentences: Sequence[Sequence[int]]) -> Encoded:
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter((t for s in sentences for t in s), dtype=np.int32, count=int(offsets[-1]))
        return cls(tokens, offsets)

    def save(self, folder: Path, name: str) -> None:
        np.save(folder / f"{name}.tokens.npy", self.tokens)
        np.save(folder / f"{name}.offsets.npy", self.offsets)

    @classmethod
    def load(cls, folder: Path, name: str) -> Encoded:
        try:
            return cls(np.load(folder / f"{name}.tokens.npy", mmap_mode="r"),
                       np.load(folder / f"{name}.offsets.npy"))
        except (OSError, ValueError) as exc:
            raise TrainperfError(f"{folder}: cannot read the encoded {name} ({exc}); run prepare again") from None


V = TypeVar("V")


@dataclass
class PreparedCorpus(Generic[V]):
    """A translation workload's prepared data: its vocabulary (of the workload's kind), the encoded
    training pairs, the encoded test sources with their raw references, and the pairs dropped."""

    vocab: V
    train_src: Encoded
    train_tgt: Encoded
    test_src: Encoded
    test_references: list[str]
    dropped: int


def pad_batch(data: Encoded, rows: np.ndarray, prefix: int | None = None, suffix: int | None = None) -> np.ndarray:
    """Sentences `rows` as a [n, longest] int64 array padded with PAD, each optionally after `prefix`
    and before `suffix` (BOS, EOS)."""
    lengths = data.lengths[rows]
    extra = (prefix is not None) + (suffix is not None)
    width = int(lengths.max(initial=0)) + extra
    out = np.full((len(rows), width), PAD, dtype=np.int64)
    start = 1 if prefix is not None else 0
    if prefix is not None:
        out[:, 0] = prefix
    cols = np.arange(width - extra)
    mask = cols[None, :] < lengths[:, None]
    positions = data.offsets[rows][:, None] + cols[None, :]
    out[:, start:width - (suffix is not None)][mask] = data.tokens[positions[mask]]
    if suffix is not None:
        out[np.arange(len(rows)), lengths + start] = suffix
    return out


# ---------------------------------------------------------------------------------------------
# subword vocabulary (sentencepiece)
# ---------------------------------------------------------------------------------------------
def train_vocabulary(sentences: Iterable[str], size: int, model_file: Path, max_sentences: int = 10_000_000
                     ) -> None:
    """One subword vocabulary shared by both languages (sentencepiece unigram), written atomically to
    `model_file`: pad 0, unk 1, bos 2, eos 3."""
    import io

    import sentencepiece as spm

    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=size, model_type="unigram",
            character_coverage=1.0, pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
            input_sentence_size=max_sentences, shuffle_input_sentence=True, hard_vocab_limit=False,
            minloglevel=2, num_threads=2)
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()[-1]
        raise TrainperfError(f"{model_file}: cannot build the vocabulary ({why})") from None
    with AtomicOutput(model_file) as tmp:
        tmp.write_bytes(buffer.getvalue())


class Vocabulary:
    """A sentencepiece model file: text <-> ids."""

    def __init__(self, model_file: Path) -> None:
        import sentencepiece as spm

        self.file = Path(model_file)
        if not self.file.is_file() or self.file.stat().st_size == 0:
            raise TrainperfError(f"{model_file}: missing or empty vocabulary (run prepare again)")
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=self.file.read_bytes())
        except RuntimeError:
            raise TrainperfError(f"{model_file}: not a sentencepiece model") from None
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD, UNK, BOS, EOS):
            raise TrainperfError(f"{model_file}: special ids must be pad 0, unk 1, bos 2, eos 3")

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(lines), num_threads=2)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.sp.decode([list(s) for s in ids])


def encode_lines(vocab: Vocabulary, lines: Sequence[str], say: Callable[[int, int], None] | None = None,
                 chunk: int = 200_000) -> list[list[int]]:
    """Encode in chunks, reporting progress (done, total)."""
    out: list[list[int]] = []
    for start in range(0, len(lines), chunk):
        out += vocab.encode(lines[start:start + chunk])
        if say is not None:
            say(min(start + chunk, len(lines)), len(lines))
    return out


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class NewstestSource(DataSource):
    """A WMT English-German dataset evaluated on newstest2014 (its German references counted)."""

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / "newstest2014.de", len(read_lines(data_dir / "newstest2014.de"))
