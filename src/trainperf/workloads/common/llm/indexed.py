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
    """Fixed-length samples cut from a corpus exactly as Megatron-Core's `GPTDataset` cuts them (its
    `_build_document_sample_shuffle_indices`, `helpers.cpp`'s `build_sample_idx`; the same seed gives the
    same sequence of samples, tested against megatron-core itself):

    - enough epochs of the corpus for `num_samples` samples of seq_len + 1 tokens (the last token is the next
      sample's first: the labels of the last position), at least one;
    - the document index: the corpus's documents once per epoch, shuffled together across the epochs by
      `numpy.random.RandomState(seed)` (the final epoch shuffled on its own when fewer than 80 % of its samples
      are asked for);
    - the documents concatenated in that order, cut every seq_len tokens (the last partial sample dropped);
    - the samples' order shuffled by the same random state (the samples of a separate final epoch on their own).

    With `shuffle=False` the documents and samples stay in file order (Megatron built without its shuffles,
    as the 405B reference's validation set is). Large indices are computed once and kept in trainperf's cache
    (as Megatron keeps them beside the data), memory-mapped by every process that needs them."""

    def __init__(self, data: IndexedDataset, seq_len: int, seed: int, num_samples: int | None = None,
                 shuffle: bool = True, vocab_size: int | None = None) -> None:
        self.data, self.seq_len, self.seed, self.shuffle = data, seq_len, seed, shuffle
        self.vocab_size = vocab_size  # each sample's ids checked against it (a host-side max: no device read)
        lengths = np.asarray(data.lengths)
        tokens = int(lengths.sum(dtype=np.int64))
        if tokens <= seq_len:
            raise TrainperfError(f"{data.bin_path}: {tokens:,} tokens cannot make one sample of {seq_len + 1:,}")
        # One pass over the corpus, and the passes the samples asked for need (Megatron's `_get_num_epochs`).
        self.samples_per_epoch = (tokens - 1) // seq_len
        self.epochs = 1 if num_samples is None else max(1, -(-(num_samples * seq_len + 1) // tokens))
        self.requested = num_samples
        self.documents, self.starts, self.order = _cached_indices(self, lengths, tokens)
        self.per_epoch = int(self.starts.shape[0]) - 1

    def __len__(self) -> int:
        return self.per_epoch

    def description(self) -> str:
        """What the indices depend on (their cache's key): the corpus (its files' sizes and times, a digest of
        its documents' lengths, so that a corpus prepared again in place is never read with another's order),
        the sequence length, the seed, the samples asked for, the shuffles."""
        import hashlib

        files = ", ".join(f"{path.resolve()} {path.stat().st_size} bytes, modified {path.stat().st_mtime_ns} ns"
                          for path in (self.data.idx_path, self.data.bin_path))
        lengths = hashlib.sha256(np.ascontiguousarray(self.data.lengths).tobytes()).hexdigest()[:16]
        return (f"GPTDataset indices v1: {files}; {len(self.data)} documents, lengths {lengths}; seq_len "
                f"{self.seq_len}, seed {self.seed}, samples {self.requested}, shuffle {self.shuffle}")

    def build(self, lengths: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the document index, each sample's start as (position in the document index, offset), the sample
        order), as megatron-core builds them."""
        epochs, seq_len = self.epochs, self.seq_len
        separate = False
        if epochs > 1 and self.requested is not None:
            before_final = ((epochs - 1) * tokens - 1) // seq_len
            separate = self.requested - before_final < int(0.80 * self.samples_per_epoch)
        state = np.random.RandomState(self.seed)
        docs = np.arange(len(lengths), dtype=np.int32)
        if separate:
            # The 405B reference's no-shuffle patch (its mcore.patch on Megatron-Core 0.10) passes its switch to
            # neither call here, so a separated final epoch shuffles the documents even of an unshuffled set.
            documents = np.concatenate([_document_index(docs, epochs - 1, state, True),
                                        _document_index(docs, 1, state, True)])
        else:
            documents = _document_index(docs, epochs, state, self.shuffle)
        starts = _sample_index(lengths, documents, seq_len, (epochs * tokens - 1) // seq_len)
        total = starts.shape[0] - 1
        first = ((epochs - 1) * tokens - 1) // seq_len if separate else total
        return documents, starts, _shuffle_index(first, total, state, self.shuffle)

    def sample(self, i: int) -> np.ndarray:
        """The i-th sample: seq_len + 1 token ids (int64)."""
        k = int(self.order[i])
        (begin, offset), (end, stop) = self.starts[k], self.starts[k + 1]
        parts = []
        for j in range(int(begin), int(end) + 1):
            document = self.data.document(int(self.documents[j]))
            lo = int(offset) if j == begin else 0
            hi = int(stop) + 1 if j == end else document.size
            parts.append(document[lo:hi])
        out = np.concatenate(parts).astype(np.int64, copy=False)
        if self.vocab_size is not None and (int(out.max()) >= self.vocab_size or int(out.min()) < 0):
            # On the host, in the loader: an embedding indexed past its table is a device-side assert on a GPU.
            bad = int(out[(out >= self.vocab_size) | (out < 0)][0])
            raise TrainperfError(f"{self.data.bin_path}: token id {bad:,} outside the model's vocabulary of "
                                 f"{self.vocab_size:,} (`trainperf prepare --scale full --verify` checks every token)")
        return out


def _document_index(docs: np.ndarray, epochs: int, state: np.random.RandomState, shuffle: bool) -> np.ndarray:
    index = np.tile(docs, epochs)  # int32 as `docs` (no second copy: the index can be billions of entries)
    if shuffle:
        state.shuffle(index)
    return index


def _shuffle_index(first: int, total: int, state: np.random.RandomState, shuffle: bool) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    if not shuffle:
        return np.arange(total, dtype=dtype)
    state.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    state.shuffle(tail)
    return np.concatenate([head, tail])


# Document-index entries summed at a time when the samples' starts are found.
INDEX_CHUNK = 1 << 22


def _sample_index(lengths: np.ndarray, documents: np.ndarray, seq_len: int, samples: int) -> np.ndarray:
    """Where each sample starts (and the last one ends), as (position in `documents`, token offset in that
    document): sample k starts at token k x seq_len of the documents concatenated in that order. Computed a
    chunk of the document index at a time (the full index is billions of tokens: never one array of them)."""
    wide = max(len(documents), int(lengths.max())) >= 2**31
    out = np.empty((samples + 1, 2), dtype=np.int64 if wide else np.int32)
    chunk, done, before = INDEX_CHUNK, 0, 0
    for start in range(0, len(documents), chunk):
        ends = np.cumsum(lengths[documents[start:start + chunk]], dtype=np.int64) + before
        # The samples starting in this chunk's tokens [before, ends[-1]): k x seq_len for k from `done` on.
        stop = min(samples + 1, int(-(-int(ends[-1]) // seq_len)))
        if stop > done:
            positions = np.arange(done, stop, dtype=np.int64) * seq_len
            where = np.searchsorted(ends, positions, side="right")
            out[done:stop, 0] = start + where
            out[done:stop, 1] = positions - np.where(where > 0, ends[np.maximum(where - 1, 0)], before)
            done = stop
        before = int(ends[-1])
        if done == samples + 1:
            break
    if done != samples + 1:  # the caller asks for the samples the tokens hold: never an unset row
        raise ValueError(f"_sample_index: {samples + 1} starts asked, {done} found")
    return out


# Indices of more entries than this are kept in the cache; smaller ones are cheaper to build than to read.
CACHED_ENTRIES = 1 << 22


def _cached_indices(samples: Samples, lengths: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices from trainperf's cache (memory-mapped), built there first if absent: by one process at a time
    (a lock), so that the processes of a node build a large index once, as Megatron's rank 0 does."""
    import fcntl
    import hashlib

    from trainperf.paths import cache_root

    if samples.epochs * len(lengths) < CACHED_ENTRIES:
        return samples.build(lengths, tokens)
    description = samples.description()
    folder = cache_root() / "megatron-indices" / hashlib.sha256(description.encode()).hexdigest()[:20]
    names = ("document_index.npy", "sample_index.npy", "shuffle_index.npy")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not all((folder / n).is_file() for n in names):
                for name, array in zip(names, samples.build(lengths, tokens), strict=True):
                    with AtomicOutput(folder / name) as tmp:
                        with open(tmp, "wb") as out:
                            np.save(out, array)
                with AtomicOutput(folder / "description.txt") as tmp:
                    Path(tmp).write_text(description + "\n", encoding="utf-8")
        loaded = tuple(np.load(folder / n, mmap_mode="r") for n in names)
    except OSError as exc:
        entries = samples.epochs * len(lengths)
        raise TrainperfError(f"{folder}: cannot keep the sample order of {samples.data.bin_path} there "
                             f"({exc.strerror or exc}; about {entries * 4 / 2**30:,.1f} GiB of document index; "
                             "TRAINPERF_CACHE names another folder)") from None
    return loaded[0], loaded[1], loaded[2]


class Blend:
    """Training samples drawn from several corpora in equal shares, as Megatron's BlendedDataset draws them
    for equal weights (`build_blending_indices`: sample k is sample k // n of corpus k % n), `size` of them (the
    samples the run asks for; by default as many as the shortest corpus allows). One corpus: its samples."""

    def __init__(self, parts: list[Samples], size: int | None = None) -> None:
        if not parts:
            raise ValueError("Blend: at least one corpus")  # a programming error in a declaration
        self.parts = parts
        most = len(parts) * min(part.per_epoch for part in parts)
        self.per_epoch = most if size is None or len(parts) == 1 else min(size, most)

    def __len__(self) -> int:
        return self.per_epoch

    def sample(self, i: int) -> np.ndarray:
        n = len(self.parts)
        return self.parts[i % n].sample(i // n)


def blended_share(size: int, parts: int, surplus: float = 0.005) -> int:
    """The samples Megatron's BlendedMegatronDatasetBuilder asks of each of `parts` equally weighted corpora for a
    blend of `size`: ceil(ceil(size x weight) x (1 + surplus)), its mid-level surplus 0.5 % by default."""
    import math

    return size if parts == 1 else int(math.ceil(math.ceil(size * (1.0 / parts)) * (1 + surplus)))
