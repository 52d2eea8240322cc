"""Megatron's indexed dataset (`.bin` + `.idx`), the format NeMo and Megatron-LM train from and the one
MLPerf's LLM references prepare C4 in: the `.bin` holds every document's token ids back to back, the
`.idx` says where each starts.

`.idx`, little-endian: the 9-byte magic b"MMIDIDX\\x00\\x00", a u64 version (1), a u8 dtype code (the
table below), a u64 count of sequences, a u64 count of document boundaries, then int32 sequence lengths
(in tokens), int64 sequence offsets (in bytes into the `.bin`), int64 document boundaries (indices into
the sequences: 0 first, the sequence count last). A text corpus has one sequence per document.

Everything read is checked against the `.bin`'s size before a token is used: a damaged or mismatched
pair is refused in one line naming the file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES: dict[int, type[np.generic]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                                        6: np.float64, 7: np.float32, 8: np.uint16}
CODES = {np.dtype(t): code for code, t in DTYPES.items()}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8


def token_dtype(vocab_size: int) -> np.dtype:
    """Megatron's choice: uint16 where the vocabulary fits it, else int32 (Llama 3.1's 128,256 ids)."""
    return np.dtype(np.uint16 if vocab_size < 65_500 else np.int32)


class IndexedDataset:
    """A `.bin`/`.idx` pair opened read-only (memory-mapped): documents as arrays of token ids."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = Path(prefix)
        self.idx_path = self.prefix.with_name(self.prefix.name + ".idx")
        self.bin_path = self.prefix.with_name(self.prefix.name + ".bin")
        for path in (self.idx_path, self.bin_path):
            if not path.is_file():
                raise TrainperfError(f"{path}: missing (an indexed dataset is a .bin and an .idx of one name)")
        where = str(self.idx_path)
        # The header first, and the file's size against it: an .idx is never read whole before it is known
        # to be one (a 40 GB file of something else would be read into memory); its arrays are mapped.
        with self.idx_path.open("rb") as fh:
            head = fh.read(_HEADER)
            idx_size = os.fstat(fh.fileno()).st_size
        if len(head) < _HEADER or head[:len(MAGIC)] != MAGIC:
            raise TrainperfError(f"{where}: not a Megatron indexed-dataset index (expected the magic "
                                 f"{MAGIC!r} and a {_HEADER}-byte header)")
        version, code, count, boundaries = struct.unpack_from("<QBQQ", head, len(MAGIC))
        if version != VERSION:
            raise TrainperfError(f"{where}: index version {version}, expected {VERSION}")
        if code not in DTYPES:
            raise TrainperfError(f"{where}: token dtype code {code}, expected one of {sorted(DTYPES)}")
        self.dtype = np.dtype(DTYPES[code])
        expected = _HEADER + count * 4 + count * 8 + boundaries * 8
        if idx_size != expected:
            raise TrainperfError(f"{where}: {idx_size:,} bytes, but its header ({count:,} sequences, "
                                 f"{boundaries:,} document boundaries) needs {expected:,}")
        at = _HEADER
        self.lengths = _mapped(self.idx_path, np.int32, count, at)
        at += count * 4
        self.offsets = _mapped(self.idx_path, np.int64, count, at)
        at += count * 8
        self.documents = _mapped(self.idx_path, np.int64, boundaries, at)
        size = self.bin_path.stat().st_size
        if count:
            if (self.lengths < 0).any():
                raise TrainperfError(f"{where}: a negative sequence length")
            ends = self.offsets + self.lengths.astype(np.int64) * self.dtype.itemsize
            if self.offsets[0] != 0 or (self.offsets[1:] != ends[:-1]).any():
                raise TrainperfError(f"{where}: sequence offsets do not follow their lengths (a damaged index)")
            if ends[-1] != size:
                raise TrainperfError(f"{self.bin_path}: {size:,} bytes, but {where} places "
                                     f"{int(ends[-1]):,} bytes of {self.dtype} tokens in it")
        elif size:
            raise TrainperfError(f"{self.bin_path}: {size:,} bytes, but {where} lists no sequences")
        if boundaries and (self.documents[0] != 0 or self.documents[-1] != count
                           or (np.diff(self.documents) < 0).any()):
            raise TrainperfError(f"{where}: document boundaries must rise from 0 to the sequence count {count:,}")
        self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r") if size else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    def document(self, i: int) -> np.ndarray:
        start = int(self.offsets[i]) // self.dtype.itemsize
        return np.asarray(self.tokens[start:start + int(self.lengths[i])])

    def check_vocabulary(self, vocab_size: int) -> None:
        """Every token id an integer below the model's vocabulary (read in chunks: a C4 shard is gigabytes)."""
        self.check_integers()
        chunk = 1 << 24
        for start in range(0, self.tokens.shape[0], chunk):
            part = np.asarray(self.tokens[start:start + chunk])
            if part.size and (int(part.max()) >= vocab_size or int(part.min()) < 0):
                bad = start + int(np.flatnonzero((part >= vocab_size) | (part < 0))[0])
                raise TrainperfError(f"{self.bin_path}: token id {int(self.tokens[bad]):,} (token {bad:,}) outside "
                                     f"the vocabulary of {vocab_size:,}")

    def check_integers(self) -> None:
        """Token ids are integers: an index of float tokens (Megatron's format allows the dtype) is refused."""
        if self.dtype.kind not in "iu":
            raise TrainperfError(f"{self.idx_path}: token dtype {self.dtype}, expected integers (token ids)")


def _mapped(path: Path, dtype: type[np.generic], count: int, offset: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def write(prefix: Path, documents: list[np.ndarray], dtype: np.dtype) -> None:
    """Write documents as a `.bin`/`.idx` pair, each file atomically (the `.bin` first: an `.idx` never
    names a `.bin` that is not complete)."""
    prefix = Path(prefix)
    dtype = np.dtype(dtype)
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    offsets = np.zeros(len(documents), dtype=np.int64)
    if len(documents) > 1:
        offsets[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * dtype.itemsize
    bounds = np.arange(len(documents) + 1, dtype=np.int64)
    with AtomicOutput(prefix.with_name(prefix.name + ".bin")) as tmp:
        with open(tmp, "wb") as out:
            for doc in documents:
                out.write(np.asarray(doc, dtype=dtype).tobytes())
    with AtomicOutput(prefix.with_name(prefix.name + ".idx")) as tmp:
        with open(tmp, "wb") as out:
            out.write(MAGIC + struct.pack("<QBQQ", VERSION, CODES[dtype], len(documents), len(bounds)))
            out.write(lengths.tobytes() + offsets.tobytes() + bounds.tobytes())


class Samples:
    """Fixed-length training samples cut from a corpus as Megatron's GPT dataset cuts them: the
    documents of each epoch in a shuffled order, concatenated, cut every `seq_len` tokens into samples of
    seq_len + 1 (the last token is the next sample's first: the labels of the last position), the samples
    then shuffled. The orders are drawn from `seed` and the epoch, so a seed gives one sequence of batches."""

    def __init__(self, data: IndexedDataset, seq_len: int, seed: int, shuffle: bool = True,
                 vocab_size: int | None = None) -> None:
        self.data, self.seq_len, self.seed, self.shuffle = data, seq_len, seed, shuffle
        self.vocab_size = vocab_size  # each sample's ids checked against it (a host-side max: no device read)
        total = data.total_tokens
        self.per_epoch = (total - 1) // seq_len if total > seq_len else 0
        if self.per_epoch == 0:
            raise TrainperfError(f"{data.bin_path}: {total:,} tokens cannot make one sample of {seq_len + 1:,}")
        self._epoch: int | None = None

    def _arrange(self, epoch: int) -> None:
        if self._epoch == epoch:
            return
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.data)) if self.shuffle else np.arange(len(self.data))
        lengths = self.data.lengths[order].astype(np.int64)
        self._order, self._ends = order, np.cumsum(lengths)
        self._samples = rng.permutation(self.per_epoch) if self.shuffle else np.arange(self.per_epoch)
        self._epoch = epoch

    def sample(self, epoch: int, i: int) -> np.ndarray:
        """The i-th sample of an epoch: seq_len + 1 token ids (int64)."""
        self._arrange(epoch)
        start = int(self._samples[i]) * self.seq_len
        stop = start + self.seq_len + 1
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        doc = int(np.searchsorted(self._ends, start, side="right"))
        filled = 0
        while filled < out.size:
            doc_start = int(self._ends[doc - 1]) if doc else 0
            tokens = self.data.document(int(self._order[doc]))
            lo = start + filled - doc_start
            take = min(out.size - filled, tokens.size - lo, stop - start - filled)
            out[filled:filled + take] = tokens[lo:lo + take]
            filled += take
            doc += 1
        if self.vocab_size is not None and (int(out.max()) >= self.vocab_size or int(out.min()) < 0):
            # On the host, in the loader: an embedding indexed past its table is a device-side assert on a GPU.
            bad = int(out[(out >= self.vocab_size) | (out < 0)][0])
            raise TrainperfError(f"{self.data.bin_path}: token id {bad:,} outside the model's vocabulary of "
                                 f"{self.vocab_size:,} (`trainperf prepare --scale full --verify` checks every token)")
        return out


class Blend:
    """Training samples drawn from several corpora in equal shares, as Megatron's BlendedDataset draws them
    for equal weights: sample k of an epoch is sample k // n of corpus k % n. One corpus: its samples."""

    def __init__(self, parts: list[Samples]) -> None:
        if not parts:
            raise ValueError("Blend: at least one corpus")  # a programming error in a declaration
        self.parts = parts
        self.per_epoch = len(parts) * min(part.per_epoch for part in parts)

    def sample(self, epoch: int, i: int) -> np.ndarray:
        n = len(self.parts)
        return self.parts[i % n].sample(epoch, i // n)
