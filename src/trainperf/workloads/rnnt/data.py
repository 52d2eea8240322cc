"""LibriSpeech as distributed, for RNN-T: the FLAC tree, its manifests, the sentencepiece model, and
the bucketed batches of the reference.

Layout read (the tarballs unpacked as they come): DIR/<subset>/<speaker>/<chapter>/<id>.flac with one
<speaker>-<chapter>.trans.txt per chapter ("<id> TRANSCRIPT" lines). `prepare` writes, beside the
subsets, one manifest per subset (DIR/librispeech-<subset>.json: the reference's manifest fields,
`transcript` lower-cased and `files` [{fname, sample_rate, num_samples, duration}]) and the
sentencepiece unigram model trained on the training transcripts (DIR/librispeech<N>.model, the
reference's 1,023 pieces, no BOS/EOS). Audio is decoded with soundfile.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainperf import prepared
from trainperf.contract import DataSource
from trainperf.errors import TrainperfError
from trainperf.files import write_bytes_atomic, write_json_atomic
from trainperf.workloads.rnnt.features import trim_silence

SAMPLE_RATE = 16_000
FULL_TRAIN = ("train-clean-100", "train-clean-360", "train-other-500")
EVAL_SUBSET = "dev-clean"
FORMAT = 1


def manifest_path(root: Path, subset: str) -> Path:
    return root / f"librispeech-{subset}.json"


def spm_path(root: Path, pieces: int) -> Path:
    return root / f"librispeech{pieces}.model"


# ---------------------------------------------------------------------------------------------
# the FLAC tree
# ---------------------------------------------------------------------------------------------
def read_transcripts(path: Path) -> dict[str, str]:
    """id -> transcript of one chapter's .trans.txt (one line naming the file and line when malformed)."""
    found: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainperfError(f"{path}: cannot read ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        utt, sep, text = line.strip().partition(" ")
        if not sep or not text.strip() or not utt.startswith(path.name.removesuffix(".trans.txt") + "-"):
            raise TrainperfError(f"{path}:{number}: expected '<speaker>-<chapter>-<n> TRANSCRIPT', got {line[:60]!r}")
        if utt in found and found[utt] != " ".join(text.split()):
            raise TrainperfError(f"{path}:{number}: utterance {utt} listed twice with different transcripts")
        found[utt] = " ".join(text.split())
    return found


def scan_subset(root: Path, subset: str) -> list[tuple[Path, str]]:
    """(flac path, transcript) of every utterance of a subset, sorted by id; an utterance whose id
    has no audio, or audio with no transcript line, is one line naming the file."""
    folder = root / subset
    if not folder.is_dir():
        raise TrainperfError(f"{folder}: missing (a LibriSpeech subset: <speaker>/<chapter>/*.flac + *.trans.txt)")
    out: list[tuple[Path, str]] = []
    chapters = sorted({p.parent for pattern in ("*/*/*.trans.txt", "*/*/*.flac") for p in folder.glob(pattern)})
    for chapter in chapters:
        listing = chapter / f"{chapter.parent.name}-{chapter.name}.trans.txt"
        if not listing.is_file():
            raise TrainperfError(f"{listing}: missing (the transcripts of {chapter})")
        texts = read_transcripts(listing)
        audio = {p.stem: p for p in chapter.glob("*.flac")}
        for utt in sorted(texts):
            if utt not in audio:
                raise TrainperfError(f"{listing}: {utt} has no audio ({chapter / (utt + '.flac')} missing)")
            out.append((audio[utt], texts[utt]))
        extra = sorted(set(audio) - set(texts))
        if extra:
            raise TrainperfError(f"{audio[extra[0]]}: no transcript line in {listing}")
    if not out:
        raise TrainperfError(f"{folder}: no utterances (expected <speaker>/<chapter>/*.flac + *.trans.txt)")
    return out


def audio_info(path: Path) -> tuple[int, int]:
    """(sample rate, frames) of an audio file, from its header."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except Exception as exc:  # noqa: BLE001 - libsndfile's errors are all "cannot decode this file"
        raise TrainperfError(f"{path}: unreadable audio ({_first_line(exc)})") from None
    return int(info.samplerate), int(info.frames)


def read_audio(path: Path) -> np.ndarray:
    """A mono 16 kHz utterance as float32 in [-1, 1] (one line naming the file otherwise)."""
    import soundfile

    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # noqa: BLE001
        raise TrainperfError(f"{path}: unreadable audio ({_first_line(exc)})") from None
    if rate != SAMPLE_RATE:
        raise TrainperfError(f"{path}: sample rate {rate} Hz, expected {SAMPLE_RATE}")
    return data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


# ---------------------------------------------------------------------------------------------
# manifests and the sentencepiece model
# ---------------------------------------------------------------------------------------------
def build_manifest(root: Path, subset: str, say: Callable[[str], None], workers: int = 8) -> list[dict[str, Any]]:
    items = scan_subset(root, subset)
    say(f"{subset}: {len(items):,} utterances; reading their headers")
    entries: list[dict[str, Any]] = []
    step = max(1, len(items) // 10)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, ((path, text), (rate, frames)) in enumerate(zip(items, pool.map(lambda it: audio_info(it[0]), items),
                                                               strict=True)):
            if rate != SAMPLE_RATE:
                raise TrainperfError(f"{path}: sample rate {rate} Hz, expected {SAMPLE_RATE}")
            duration = frames / rate
            entries.append({"transcript": text.lower(), "original_duration": duration,
                            "files": [{"fname": str(path.relative_to(root)), "sample_rate": rate,
                                       "num_samples": frames, "duration": duration}]})
            if (i + 1) % step == 0:
                say(f"{subset}: {i + 1:,}/{len(items):,}")
    return entries


def train_sentencepiece(transcripts: Sequence[str], out: Path, pieces: int) -> None:
    """The reference's unigram model (no BOS/EOS, full character coverage), written atomically."""
    import sentencepiece as spm

    # The trainer writes m.model and m.vocab under a prefix: a scratch folder beside the output,
    # removed whatever happens; only the model is moved into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as scratch:
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(transcripts), model_prefix=str(Path(scratch) / "m"), vocab_size=pieces,
                model_type="unigram", character_coverage=1.0, bos_id=-1, eos_id=-1, hard_vocab_limit=False,
                num_threads=min(8, os.cpu_count() or 1), minloglevel=2)
        except RuntimeError as exc:  # the trainer's checks (too few pieces for the characters, say)
            reason = str(exc).splitlines()[0].rsplit("] ", 1)[-1][:160]
            raise TrainperfError(f"{out}: cannot train {pieces} sentencepiece pieces ({reason})") from None
        write_bytes_atomic(out, (Path(scratch) / "m.model").read_bytes())


def read_manifest(path: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: cannot read the manifest ({exc})") from None
    if not isinstance(entries, list) or not entries:
        raise TrainperfError(f"{path}: expected a non-empty list of utterances")
    for i, entry in enumerate(entries):
        if (not isinstance(entry, dict) or not isinstance(entry.get("transcript"), str)
                or not isinstance(entry.get("files"), list) or not entry["files"]
                or "fname" not in entry["files"][-1]):
            raise TrainperfError(f"{path}: utterance {i}: expected transcript and files[{{fname, duration}}]")
    return entries


def sources(root: Path, subsets: Sequence[str]) -> dict[str, Path]:
    """What a preparation derives from: every chapter's transcript file of the subsets (a changed
    transcript, or a chapter added or removed, makes the manifests and the piece model stale). The
    FLAC files are not fingerprinted: a replaced recording of another length goes unnoticed."""
    found: dict[str, Path] = {}
    for subset in subsets:
        for path in sorted((root / subset).glob("*/*/*.trans.txt")):
            found[str(path.relative_to(root))] = path
    return found


def _why_stale(root: Path, train: Sequence[str], pieces: int) -> str | None:
    """Why the recorded preparation no longer matches (None: it matches, or there is none yet)."""
    stamp = root / "librispeech-prepared.json"
    try:
        record = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return prepared.stale(record.get("stamp"), sources(root, [*train, EVAL_SUBSET]), FORMAT,
                          {"pieces": pieces, "train": list(train)}, stamp)


def problems(root: Path, train: Sequence[str], pieces: int) -> list[str]:
    again = f"trainperf prepare rnnt --data {root}"
    wanted = [*train, EVAL_SUBSET]
    found = [f"{manifest_path(root, s)}: missing ({again})" for s in wanted if not manifest_path(root, s).is_file()]
    if not spm_path(root, pieces).is_file():
        found.append(f"{spm_path(root, pieces)}: missing ({again})")
    if not found and not (root / "librispeech-prepared.json").is_file():
        found.append(f"{root / 'librispeech-prepared.json'}: missing ({again})")
    if found:
        return found
    why = _why_stale(root, train, pieces)
    return [f"{why}; run {again}"] if why else []


def prepare(root: Path, train: Sequence[str], pieces: int, say: Callable[[str], None]) -> None:
    """Manifests of the training subsets and dev-clean, and the sentencepiece model, each written
    atomically. An interrupted preparation keeps the manifests it finished; a stale one (a transcript
    changed since) is redone whole."""
    wanted = [*train, EVAL_SUBSET]
    if not problems(root, train, pieces):
        say(f"{root}: already prepared ({', '.join(wanted)}; {spm_path(root, pieces).name})")
        return
    why = _why_stale(root, train, pieces)
    if why:
        say(f"{why}: preparing again")
    for subset in wanted:
        path = manifest_path(root, subset)
        if path.is_file() and not why:
            say(f"{path}: kept from an interrupted preparation")
            continue
        write_json_atomic(path, build_manifest(root, subset, say))
        say(f"{path}: written")
    model = spm_path(root, pieces)
    if not model.is_file() or why:
        texts = [e["transcript"] for s in train for e in read_manifest(manifest_path(root, s))]
        say(f"training the sentencepiece model ({pieces} pieces) on {len(texts):,} transcripts")
        train_sentencepiece(texts, model, pieces)
    params = {"pieces": pieces, "train": list(train)}
    stamp = prepared.stamp(sources(root, wanted), FORMAT, params)
    write_json_atomic(root / "librispeech-prepared.json", {"stamp": stamp})
    say(f"{root}: prepared ({', '.join(wanted)}; {model.name})")


# ---------------------------------------------------------------------------------------------
# utterances in memory or on disk, and the bucketed batches
# ---------------------------------------------------------------------------------------------
@dataclass
class Utterances:
    """One split: audio paths, durations (s), token ids and transcripts."""

    root: Path
    files: list[str]
    durations: np.ndarray
    tokens: list[np.ndarray]
    transcripts: list[str]
    trim_db: float
    cache: dict[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.files)

    def audio(self, i: int) -> np.ndarray:
        if self.cache is not None and i in self.cache:
            return self.cache[i]
        wave = trim_silence(read_audio(self.root / self.files[i]), self.trim_db)
        if self.cache is not None:
            self.cache[i] = wave
        return wave


def load_split(root: Path, subsets: Sequence[str], tokenizer: Any, max_duration: float, trim_db: float,
               in_memory: bool) -> tuple[Utterances, int]:
    """The utterances of `subsets` no longer than `max_duration` s (0: all); (split, number dropped)."""
    files, durations, tokens, texts = [], [], [], []
    dropped = 0
    for subset in subsets:
        path = manifest_path(root, subset)
        for entry in read_manifest(path):
            last = entry["files"][-1]
            duration = float(last.get("duration", entry.get("original_duration", 0.0)))
            if max_duration and duration > max_duration:
                dropped += 1
                continue
            ids = np.asarray(tokenizer.encode(entry["transcript"]), dtype=np.int64)
            if ids.size == 0:
                dropped += 1
                continue
            files.append(last["fname"])
            durations.append(duration)
            tokens.append(ids)
            texts.append(entry["transcript"])
    if not files:
        raise TrainperfError(f"{manifest_path(root, subsets[0])}: no utterance left after the duration filter")
    return Utterances(root, files, np.asarray(durations), tokens, texts, trim_db, {} if in_memory else None), dropped


def bucketed_batches(durations: np.ndarray, global_batch: int, buckets: int, rng: np.random.Generator
                     ) -> list[np.ndarray]:
    """The reference's bucketing sampler: utterances sorted by duration into `buckets` equal buckets,
    shuffled within each, random ones dropped to a multiple of the global batch, cut into global
    batches of neighbours, the batches shuffled."""
    order = np.argsort(durations, kind="stable")
    parts = [rng.permutation(part) for part in np.array_split(order, max(1, buckets))]
    flat = np.concatenate(parts)
    keep = (len(flat) // global_batch) * global_batch
    if keep == 0:
        raise TrainperfError(f"{len(flat)} training utterances: fewer than one global batch of {global_batch}")
    if keep < len(flat):
        drop = rng.choice(len(flat), len(flat) - keep, replace=False)
        flat = np.delete(flat, drop)
    batches = flat.reshape(-1, global_batch)
    return [batches[i] for i in rng.permutation(len(batches))]


def shard(batch: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's equal share of a global batch (the global batch is a multiple of the world size)."""
    per = len(batch) // world
    return batch[rank * per: (rank + 1) * per]


def read_many(split: Utterances, rows: np.ndarray, pool: ThreadPoolExecutor | None) -> list[np.ndarray]:
    """The (trimmed) audio of `rows`, decoded in parallel threads (libsndfile releases the GIL)."""
    if pool is None:
        return [split.audio(int(i)) for i in rows]
    return list(pool.map(split.audio, (int(i) for i in rows)))


def prefetch(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """`items` produced `depth` ahead in a background thread (decoding overlaps the training step)."""
    import queue
    import threading

    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()

    def produce() -> None:
        try:
            for item in items:
                box.put(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            box.put(exc)
        box.put(done)

    threading.Thread(target=produce, daemon=True).start()
    while True:
        item = box.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class LibriSpeech(DataSource):
    """LibriSpeech's FLAC subsets as distributed, converted once as the reference converts them (16 kHz
    WAV, JSON manifests, a SentencePiece model of `pieces` from the training transcripts)."""

    def __init__(self, subsets: Sequence[str], pieces: int) -> None:
        self.subsets, self.pieces = list(subsets), pieces

    def problems(self, data_dir: Path) -> list[str]:
        return problems(data_dir, self.subsets, self.pieces)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        self.write_audio(data_dir, say)
        prepare(data_dir, self.subsets, self.pieces, say)

    def write_audio(self, data_dir: Path, say: Callable[[str], None]) -> None:
        """Nothing to write: the user's LibriSpeech folders are the source."""

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return sources(data_dir, [*self.subsets, EVAL_SUBSET])

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        path = manifest_path(data_dir, EVAL_SUBSET)
        return path, len(read_manifest(path))
