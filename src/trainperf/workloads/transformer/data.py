"""The Transformer's data: WMT17 English-German text as distributed, and its prepared form.

Layout (full and mini alike):

    DIR/train/<corpus>.en, <corpus>.de    one pair per training corpus (europarl-v7.de-en,
                                          commoncrawl.de-en, news-commentary-v12.de-en)
    DIR/newstest2014.en, newstest2014.de  the BLEU test set (3,003 sentences)
    DIR/prepared/                         written by `trainperf prepare transformer`: the shared
                                          sentencepiece vocabulary (spm.model) and the encoded
                                          corpus as arrays, with the stamp of the sources

The reference builds one shared subword vocabulary with tensor2tensor's SubwordTextEncoder (32,768
target subtokens); trainperf builds it with sentencepiece (unigram, same size for full), which needs no
TensorFlow. Training pairs with a side longer than max_length tokens (EOS included) are dropped, as
the reference does, and counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainperf import prepared
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput, write_text_atomic
from trainperf.workloads.common.wmt import synthetic
from trainperf.workloads.common.wmt import text as wmt_text

PREPARED = "prepared"
TEST = ("newstest2014.en", "newstest2014.de")
FORMAT = 1
FULL_VOCAB, MINI_VOCAB = 32_768, 1_000
REFERENCE_MODEL_VOCAB = 33_708  # the reference model's vocab_size (model_params), for data-less benchmarks
MAX_LENGTH = 256  # the reference drops training examples longer than this (subtokens, EOS included)
MINI_PAIRS, MINI_TEST = 40_000, 500


def corpus_pairs(root: Path) -> list[tuple[Path, Path]]:
    """Every training corpus under DIR/train: <name>.en with its <name>.de."""
    folder = root / "train"
    if not folder.is_dir():
        raise TrainperfError(f"{folder}: missing (expected one <corpus>.en / <corpus>.de pair per training corpus)")
    pairs = []
    for en in sorted(folder.glob("*.en")):
        de = en.with_suffix(".de")
        if not de.is_file():
            raise TrainperfError(f"{en}: no German side {de.name} beside it")
        pairs.append((en, de))
    if not pairs:
        raise TrainperfError(f"{folder}: no <corpus>.en / <corpus>.de pairs")
    return pairs


def sources(root: Path) -> dict[str, Path]:
    found = {}
    try:
        for en, de in corpus_pairs(root):
            found[f"train/{en.name}"], found[f"train/{de.name}"] = en, de
    except TrainperfError:
        pass
    for name in TEST:
        found[name] = root / name
    return found


def _params(vocab_size: int) -> dict[str, int]:
    return {"vocab_size": vocab_size, "max_length": MAX_LENGTH}


def source_problems(root: Path) -> list[str]:
    """What is missing from the text as distributed."""
    found = []
    try:
        corpus_pairs(root)
    except TrainperfError as exc:
        found.append(str(exc))
    return found + [f"{root / name}: missing (the newstest2014 test set)" for name in TEST
                    if not (root / name).is_file()]


def problems(root: Path, vocab_size: int, generated: bool) -> list[str]:
    again = "trainperf prepare transformer" + ("" if generated else f" --scale full --data {root}")
    if generated and not (root / PREPARED / "stamp.json").is_file():
        return [f"{root}: mini dataset not generated yet (trainperf prepare transformer)"]
    found = source_problems(root)
    if found:
        return found
    record = wmt_text.read_json(root / PREPARED / "stamp.json")
    if record is None:
        return [f"{root / PREPARED}: not prepared yet ({again})"]
    why = prepared.stale(record.get("stamp"), sources(root), FORMAT, _params(vocab_size), root / PREPARED)
    return [f"{why}; run {again}"] if why else []


def generate_mini(root: Path, say: Callable[[str], None], seed: int = 20261123) -> None:
    """The synthetic corpus in the WMT layout, written atomically (train/ then the test files)."""
    pairs = synthetic.corpus(MINI_PAIRS, seed)
    seen = set(pairs)
    test: list[tuple[str, str]] = []
    for en, de in synthetic.corpus(4 * MINI_TEST, seed + 1):
        if (en, de) not in seen and len(test) < MINI_TEST:  # a test sentence never seen in training
            test.append((en, de))
            seen.add((en, de))
    with AtomicOutput(root / "train", directory=True) as tmp:
        (tmp / "synthetic.de-en.en").write_text("".join(en + "\n" for en, _ in pairs), encoding="utf-8")
        (tmp / "synthetic.de-en.de").write_text("".join(de + "\n" for _, de in pairs), encoding="utf-8")
    write_text_atomic(root / TEST[0], "".join(en + "\n" for en, _ in test))
    write_text_atomic(root / TEST[1], "".join(de + "\n" for _, de in test))
    say(f"wrote {len(pairs):,} synthetic training pairs and {len(test)} test pairs to {root} (WMT text layout)")


Prepared = wmt_text.PreparedCorpus[wmt_text.Vocabulary]


def prepare(root: Path, vocab_size: int, generated: bool, say: Callable[[str], None]) -> None:
    if generated and source_problems(root):  # never generated, or interrupted before the test files
        root.mkdir(parents=True, exist_ok=True)
        generate_mini(root, say)
    found = source_problems(root)
    if found:
        raise TrainperfError(found[0])
    record = wmt_text.read_json(root / PREPARED / "stamp.json")
    if record is not None:
        why = prepared.stale(record.get("stamp"), sources(root), FORMAT, _params(vocab_size), root / PREPARED)
        if why is None:
            say(f"{root / PREPARED}: already prepared")
            return
        say(f"{why}: preparing again")
    params = _params(vocab_size)
    english: list[str] = []
    german: list[str] = []
    for en_file, de_file in corpus_pairs(root):
        en, de = wmt_text.read_parallel(en_file, de_file)
        english += en
        german += de
        say(f"read {len(en):,} pairs from {en_file.parent}/{en_file.stem}.{{en,de}}")
    test_en, test_de = wmt_text.read_parallel(root / TEST[0], root / TEST[1])
    with AtomicOutput(root / PREPARED, directory=True) as tmp:
        say(f"building the shared subword vocabulary ({params['vocab_size']:,} pieces, sentencepiece unigram)")
        wmt_text.train_vocabulary((line for pair in zip(english, german, strict=True) for line in pair),
                           params["vocab_size"], tmp / "spm.model")
        vocab = wmt_text.Vocabulary(tmp / "spm.model")

        def progress(side: str) -> Callable[[int, int], None]:
            return lambda done, total: say(f"encoding {side}: {done:,}/{total:,} sentences")

        src = wmt_text.encode_lines(vocab, english, progress("English"))
        tgt = wmt_text.encode_lines(vocab, german, progress("German"))
        keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True))
                if s and t and len(s) + 1 <= params["max_length"] and len(t) + 1 <= params["max_length"]]
        dropped = len(src) - len(keep)
        wmt_text.Encoded.from_lists([src[i] for i in keep]).save(tmp, "train.src")
        wmt_text.Encoded.from_lists([tgt[i] for i in keep]).save(tmp, "train.tgt")
        wmt_text.Encoded.from_lists(vocab.encode(test_en)).save(tmp, "test.src")
        stamp = prepared.stamp(sources(root), FORMAT, params)
        (tmp / "stamp.json").write_text(json.dumps({"stamp": stamp, "train_pairs": len(keep), "dropped": dropped,
                                                    "test_pairs": len(test_en)}))
    say(f"prepared {len(keep):,} training pairs ({dropped:,} dropped: an empty side or longer than "
        f"{params['max_length']} tokens) and {len(test_en):,} test sentences in {root / PREPARED}")


def load(root: Path) -> Prepared:
    folder = root / PREPARED
    record = wmt_text.read_json(folder / "stamp.json") or {}
    references = wmt_text.read_lines(root / TEST[1])
    test_src = wmt_text.Encoded.load(folder, "test.src")
    if len(test_src) != len(references):
        raise TrainperfError(f"{root / TEST[1]}: {len(references):,} lines, but {len(test_src):,} test sources were "
                             "prepared; run prepare again")
    return Prepared(wmt_text.Vocabulary(folder / "spm.model"), wmt_text.Encoded.load(folder, "train.src"),
                    wmt_text.Encoded.load(folder, "train.tgt"), test_src, references, int(record.get("dropped", 0)))


def vocab_size(root: Path) -> int:
    return len(wmt_text.Vocabulary(root / PREPARED / "spm.model"))


def lengths_for_budget(data: Prepared) -> tuple[np.ndarray, np.ndarray]:
    """Token counts per training pair as batched: source + EOS, target + BOS (or EOS)."""
    return data.train_src.lengths + 1, data.train_tgt.lengths + 1


class WMT17(wmt_text.NewstestSource):
    """WMT17's English-German text as distributed (train/*.en|de pairs and newstest2014), prepared once
    beside it as the reference prepares it (a subword vocabulary of `vocab_size`); the mini writes
    synthetic text in the same layout first."""

    def __init__(self, vocab_size: int, generated: bool = False) -> None:
        self.vocab_size, self.generated = vocab_size, generated

    def problems(self, data_dir: Path) -> list[str]:
        return problems(data_dir, self.vocab_size, self.generated)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        prepare(data_dir, self.vocab_size, self.generated, say)

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return sources(data_dir)
