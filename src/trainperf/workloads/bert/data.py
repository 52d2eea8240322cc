"""BERT's data: HDF5 shards in the layout of NVIDIA's MLPerf submissions, their preparation, and the
training stream.

Layout (full and mini alike):

    DIR/training/*.hdf5       training shards: input_ids, input_mask, segment_ids [N, L];
                              masked_lm_positions, masked_lm_ids [N, P]; next_sentence_labels [N]
    DIR/eval/*.hdf5           the held-out evaluation sequences (full: the 10,000 of eval_10k)
    DIR/phase1/model.ckpt-28252.pt   (full) the phase-1 checkpoint as a PyTorch state dict
    DIR/vocab.txt             (optional for full) the WordPiece vocabulary, checked against the checkpoint

`prepare --scale full` converts the reference's TFRecords (DIR/tfrecord/part-*, DIR/tfrecord/eval_10k),
read without TensorFlow with their CRCs checked, into the HDF5 shards, one shard per record file,
resumable (finished shards are kept), each written atomically. The mini scale writes its text in the
reference's text layout (DIR/text/) and turns it into the same HDF5 shards with the shipped vocabulary.

The training stream gives each process its own shards (shard i to process i mod N), shuffles the
shard order every pass and the rows within each shard, and deals every process the same number of
steps per pass (the smallest process's share decides)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf import prepared
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput, write_text_atomic
from trainperf.workloads.bert import corpus
from trainperf.workloads.bert.batches import KEYS

TRAIN, EVAL, TFRECORD, TEXT = "training", "eval", "tfrecord", "text"
FULL_CHECKPOINT = Path("phase1") / "model.ckpt-28252.pt"
STAMP = "prepared.json"
FORMAT = 1
# The mini data: sequences of 128 tokens with up to 20 predictions (the reference's 512 and 76 scaled
# by 1/4), 5 masks of the text, 1 document in 12 held out.
MINI = corpus.InstanceConfig(max_seq_length=128, max_predictions=20, dupe_factor=5)
MINI_HELD_OUT_EVERY = 12
MINI_TRAIN_SHARDS = 8
MINI_EVAL_SEQUENCES = 2000
PACKAGE = Path(__file__).parent / "mini"


@dataclass(frozen=True)
class Shard:
    path: Path
    rows: int
    seq_len: int
    predictions: int


def inspect_shard(path: Path) -> Shard:
    """A shard's shape, checked: every dataset present, 2-D where it must be, the same row count."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in KEYS if k not in f]
            if missing:
                raise TrainperfError(f"{path}: missing dataset {missing[0]!r} (a BERT shard holds {', '.join(KEYS)})")
            shapes = {k: f[k].shape for k in KEYS}
    except OSError as exc:
        raise TrainperfError(f"{path}: not a readable HDF5 file ({exc})") from None
    rows = shapes["input_ids"][0] if len(shapes["input_ids"]) == 2 else -1
    for key in KEYS:
        want = 1 if key == "next_sentence_labels" else 2
        shape = shapes[key]
        if len(shape) != want and not (key == "next_sentence_labels" and shape[1:] == (1,)):
            raise TrainperfError(f"{path}: dataset {key!r} has shape {shape}, expected {want} dimension(s)")
        if shape[0] != rows:
            raise TrainperfError(f"{path}: dataset {key!r} has {shape[0]} rows, input_ids has {rows}")
    seq_len = shapes["input_ids"][1]
    for key in ("input_mask", "segment_ids"):
        if shapes[key][1] != seq_len:
            raise TrainperfError(f"{path}: dataset {key!r} is {shapes[key][1]} wide, input_ids is {seq_len}")
    if shapes["masked_lm_ids"][1] != shapes["masked_lm_positions"][1]:
        raise TrainperfError(f"{path}: masked_lm_ids and masked_lm_positions differ in width")
    return Shard(path, rows, seq_len, shapes["masked_lm_positions"][1])


def read_shard(path: Path) -> dict[str, np.ndarray]:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            rows = {k: np.asarray(f[k][...]) for k in KEYS}
    except (OSError, KeyError) as exc:
        raise TrainperfError(f"{path}: cannot read the shard ({exc})") from None
    rows["next_sentence_labels"] = rows["next_sentence_labels"].reshape(-1)
    return rows


def write_shard(path: Path, rows: dict[str, np.ndarray]) -> None:
    import h5py

    with AtomicOutput(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for key in KEYS:
                f.create_dataset(key, data=rows[key], compression="gzip", compression_opts=1)


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.hdf5")) + sorted(folder.glob("*.h5"))


def _shard_list(folder: Path, what: str) -> list[Shard]:
    found = shards(folder)
    if not found:
        raise TrainperfError(f"{folder}: no .hdf5 shards ({what})")
    listed = [inspect_shard(p) for p in found]
    widths = {(s.seq_len, s.predictions) for s in listed}
    if len(widths) > 1:
        raise TrainperfError(f"{folder}: shards differ in sequence length / predictions ({sorted(widths)})")
    return listed


def training_shards(root: Path) -> list[Shard]:
    return _shard_list(root / TRAIN, "training data")


def eval_shards(root: Path) -> list[Shard]:
    return _shard_list(root / EVAL, "the evaluation set")


def problems(root: Path) -> list[str]:
    """What is missing or unreadable among the training and evaluation shards."""
    found = []
    for check in (training_shards, eval_shards):
        try:
            check(root)
        except TrainperfError as exc:
            found.append(str(exc))
    return found


def _read_stamp(root: Path) -> object:
    try:
        return json.loads((root / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# mini
# ---------------------------------------------------------------------------------------------
def _vocab_digest() -> str:
    path = PACKAGE / "vocab.txt"
    return sha256(path) if path.is_file() else "missing"


def _mini_params() -> dict[str, object]:
    # The shipped vocabulary is part of the package, not a user's source: its digest is a parameter,
    # so a new one (make-phase1) makes the prepared shards stale.
    return {"vocab_sha256": _vocab_digest(), "max_seq_length": MINI.max_seq_length,
            "max_predictions": MINI.max_predictions, "dupe_factor": MINI.dupe_factor,
            "held_out_every": MINI_HELD_OUT_EVERY, "shards": MINI_TRAIN_SHARDS, "eval_sequences": MINI_EVAL_SEQUENCES}


def split_documents() -> tuple[list[list[str]], list[list[str]]]:
    docs = corpus.stdlib_documents()
    train = [d for d in docs if not corpus.held_out(d, MINI_HELD_OUT_EVERY)]
    held = [d for d in docs if corpus.held_out(d, MINI_HELD_OUT_EVERY)]
    return train, held


def prepare_mini(root: Path, say: Callable[[str], None], vocab: Path | None = None) -> None:
    """The mini dataset: text shards in the reference's layout, then HDF5 shards made with `vocab`
    (default: the vocabulary shipped with the phase-1 checkpoint)."""
    vocab = vocab or PACKAGE / "vocab.txt"
    if not vocab.is_file():
        raise TrainperfError(f"{vocab}: missing (the mini vocabulary; `trainperf make-phase1` writes it)")
    train, held = split_documents()
    with AtomicOutput(root / TEXT, directory=True) as tmp:
        per = -(-len(train) // MINI_TRAIN_SHARDS)
        for i in range(MINI_TRAIN_SHARDS):
            corpus.write_text(tmp / f"part-{i:05d}-of-{MINI_TRAIN_SHARDS:05d}", train[i * per:(i + 1) * per])
        corpus.write_text(tmp / "eval.txt", held)
    say(f"text: {len(train)} training and {len(held)} held-out documents in {root / TEXT}")
    text_to_shards(root, vocab, MINI, say, eval_sequences=MINI_EVAL_SEQUENCES)
    write_text_atomic(root / STAMP, json.dumps(prepared.stamp({}, FORMAT, _mini_params()), indent=1))


def text_to_shards(root: Path, vocab: Path, cfg: corpus.InstanceConfig, say: Callable[[str], None],
                   eval_sequences: int) -> None:
    """DIR/text/part-* and eval.txt -> DIR/training/*.hdf5 and DIR/eval/eval.hdf5 (the reference's
    create_pretraining_data, then pick_eval_samples' first `eval_sequences` of the evaluation rows)."""
    tok = corpus.Tokenizer(vocab)
    special = {t: tok.ids[t] for t in corpus.SPECIAL}
    parts = sorted(p for p in (root / TEXT).glob("part-*") if p.is_file())
    if not parts:
        raise TrainperfError(f"{root / TEXT}: no part-* text shards")
    with AtomicOutput(root / TRAIN, directory=True) as tmp:
        total = 0
        for i, part in enumerate(parts):
            docs = [tok.encode(d) for d in corpus.read_text(part)]
            rows = corpus.create_instances(docs, cfg, len(tok), special, dupe_offset=i)
            write_shard(tmp / f"{part.name}.hdf5", rows)
            total += len(rows["input_ids"])
            say(f"training shard {i + 1}/{len(parts)}: {len(rows['input_ids']):,} sequences")
    docs = [tok.encode(d) for d in corpus.read_text(root / TEXT / "eval.txt")]
    rows = corpus.create_instances(docs, cfg, len(tok), special, dupe_offset=len(parts))
    if len(rows["input_ids"]) < eval_sequences:
        raise TrainperfError(f"{root / TEXT / 'eval.txt'}: {len(rows['input_ids'])} sequences, "
                             f"{eval_sequences} needed for the evaluation set")
    with AtomicOutput(root / EVAL, directory=True) as tmp:
        write_shard(tmp / "eval.hdf5", {k: v[:eval_sequences] for k, v in rows.items()})
    say(f"{total:,} training sequences in {len(parts)} shards, {eval_sequences:,} evaluation sequences")


# ---------------------------------------------------------------------------------------------
# full: the reference's TFRecords -> HDF5
# ---------------------------------------------------------------------------------------------
WIDE = ("input_ids", "masked_lm_positions", "masked_lm_ids")  # int32 in a shard; the others are 0 or 1 (int8)


def _kind(value: object) -> str:
    return "bytes_list" if isinstance(value, list) else "float_list" if value.dtype.kind == "f" else "int64_list"


def _ints(path: Path, index: int, key: str, value: object) -> np.ndarray:
    """A feature the shards keep as integers: an int64_list, every value in the shard dtype's range."""
    if not isinstance(value, np.ndarray) or value.dtype != np.int64:
        raise TrainperfError(f"{path}: record {index}: feature {key!r} is a {_kind(value)}, expected an int64_list")
    low, high = (0, 2**31 - 1) if key in WIDE else (0, 1)
    outside = value[(value < low) | (value > high)]
    if outside.size:
        raise TrainperfError(f"{path}: record {index}: feature {key!r} holds {outside[0]}, expected values "
                             f"from {low} to {high:,}")
    return value


def tfrecord_to_rows(path: Path) -> dict[str, np.ndarray]:
    """One TFRecord file of pretraining examples as shard rows (masked_lm_weights folded into the
    positions: a slot of weight 0 is padding)."""
    from trainperf.workloads.bert import records

    rows: dict[str, list[np.ndarray]] = {k: [] for k in KEYS}
    for index, example in enumerate(records.read_examples(path)):
        missing = [k for k in KEYS if k not in example]
        if missing:
            raise TrainperfError(f"{path}: record {index}: no feature {missing[0]!r}")
        values = {key: _ints(path, index, key, example[key]) for key in KEYS}
        if values["next_sentence_labels"].size != 1:
            raise TrainperfError(f"{path}: record {index}: feature 'next_sentence_labels' holds "
                                 f"{values['next_sentence_labels'].size} values, expected 1")
        weights = example.get("masked_lm_weights")
        if weights is not None:
            positions = values["masked_lm_positions"]
            if not isinstance(weights, np.ndarray) or weights.dtype.kind not in "fi":
                raise TrainperfError(f"{path}: record {index}: feature 'masked_lm_weights' is a {_kind(weights)}, "
                                     "expected a float_list")
            if weights.shape != positions.shape:
                raise TrainperfError(f"{path}: record {index}: feature 'masked_lm_weights' holds {weights.size} "
                                     f"values, masked_lm_positions {positions.size}")
            values["masked_lm_positions"] = np.where(weights > 0, positions, 0)
        for key in KEYS:
            rows[key].append(values[key])
    if not rows["input_ids"]:
        raise TrainperfError(f"{path}: no records")
    out = {}
    for key, values in rows.items():
        widths = {v.shape for v in values}
        if len(widths) > 1:
            raise TrainperfError(f"{path}: feature {key!r} has records of different lengths {sorted(widths)}")
        out[key] = np.stack(values).astype(np.int32 if key in WIDE else np.int8)
    out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
    return out


def prepare_full(root: Path, say: Callable[[str], None]) -> None:
    """Convert DIR/tfrecord/ to HDF5 shards where they are missing; then check the data."""
    folder = root / TFRECORD
    if folder.is_dir():
        records = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        evals = [p for p in records if p.name.startswith("eval")]
        train = [p for p in records if p not in evals]
        todo = [(p, root / TRAIN / f"{p.name}.hdf5") for p in train] + [(p, root / EVAL / f"{p.name}.hdf5")
                                                                        for p in evals]
        for i, (src, dst) in enumerate(todo):
            if dst.is_file():
                continue
            write_shard(dst, tfrecord_to_rows(src))
            say(f"converted {i + 1}/{len(todo)}: {src.name}")
    found = problems(root)
    if found:
        raise TrainperfError(found[0])


# ---------------------------------------------------------------------------------------------
# the training stream
# ---------------------------------------------------------------------------------------------
class ShardStream:
    """Each process's passes over its own shards: shard order and rows shuffled every pass."""

    def __init__(self, listed: list[Shard], rank: int, world: int, rows_per_step: int, seed: int) -> None:
        if len(listed) < world:
            raise TrainperfError(f"{listed[0].path.parent}: {len(listed)} training shards for {world} processes "
                                 "(each process reads its own shards)")
        self.mine = [s for i, s in enumerate(listed) if i % world == rank]
        self.rows_per_step = rows_per_step
        self.seed, self.rank = seed, rank
        shares = [sum(s.rows for i, s in enumerate(listed) if i % world == r) for r in range(world)]
        self.steps = min(shares) // rows_per_step
        if self.steps < 1:
            raise TrainperfError(f"{listed[0].path.parent}: {min(shares)} rows for a process, fewer than one "
                                 f"batch of {rows_per_step}")
        self._cache: dict[Path, dict[str, np.ndarray]] = {}

    def _rows(self, shard: Shard, cache: bool) -> dict[str, np.ndarray]:
        if shard.path in self._cache:
            return self._cache[shard.path]
        rows = read_shard(shard.path)
        if cache:
            self._cache[shard.path] = rows
        return rows

    def batches(self, epoch: int, cache: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """`steps` batches of `rows_per_step` rows (a batch may span two shards)."""
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        left: dict[str, np.ndarray] | None = None
        made = 0
        for k in rng.permutation(len(self.mine)).tolist():
            rows = self._rows(self.mine[k], cache)
            order = rng.permutation(len(rows["input_ids"]))
            rows = {key: value[order] for key, value in rows.items()}
            if left is not None:
                rows = {key: np.concatenate([left[key], rows[key]]) for key in rows}
            n = len(rows["input_ids"])
            full = n // self.rows_per_step
            for b in range(full):
                if made == self.steps:
                    return
                span = slice(b * self.rows_per_step, (b + 1) * self.rows_per_step)
                yield {key: value[span] for key, value in rows.items()}
                made += 1
            left = {key: value[full * self.rows_per_step:] for key, value in rows.items()}


def read_eval(root: Path) -> dict[str, np.ndarray]:
    parts = [read_shard(s.path) for s in eval_shards(root)]
    return {key: np.concatenate([p[key] for p in parts]) for key in KEYS}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Shards(DataSource):
    def problems(self, data_dir: Path) -> list[str]:
        return problems(data_dir)

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / EVAL, sum(shard.rows for shard in eval_shards(data_dir))


class WikipediaShards(_Shards):
    """The reference's packed Wikipedia: TFRecord or HDF5 shards converted once into training/evaluation
    shards (the evaluation set of 10,000 samples)."""

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        prepare_full(data_dir, say)


class MiniCorpus(_Shards):
    """The mini: a generated corpus through the reference's pretraining-data creation, in its shards."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        found = super().problems(data_dir)
        if not found:
            reason = prepared.stale(_read_stamp(data_dir), {}, FORMAT, _mini_params(), data_dir / STAMP)
            if reason:
                found.append(reason)
        return found

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        prepare_mini(data_dir, say)
