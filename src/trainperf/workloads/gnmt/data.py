"""GNMT's data: the MLPerf reference's prepared WMT16 English-German files, read as they are.

    DIR/train.tok.clean.bpe.32000.en, .de   Moses-tokenized, cleaned, joint BPE (subword-nmt, "@@ "
                                            marks a word that continues)
    DIR/newstest2014.tok.bpe.32000.en       the test sources, tokenized and BPE'd the same way
    DIR/newstest2014.de                     the raw test references (BLEU is computed against them)
    DIR/vocab.bpe.32000                     one BPE token per line; the ids follow the reference:
                                            <pad> 0, <unk> 1, <s> 2, </s> 3, then the file's tokens

`trainperf prepare gnmt` encodes the files once into arrays beside them (DIR/prepared-gnmt/), tied to
their fingerprints. The mini scale writes raw synthetic text (DIR/raw/) and runs the reference's
preparation on it: Moses tokenization (sacremoses), joint BPE learned by subword-nmt (the reference's
tool), the vocabulary of the BPE'd training text, files named as the reference's with the mini's
merge count.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from trainperf import prepared
from trainperf.errors import TrainperfError
from trainperf.files import AtomicOutput, write_text_atomic
from trainperf.workloads.common.wmt import synthetic
from trainperf.workloads.common.wmt import text as wmt_text

FULL_MERGES, MINI_MERGES = 32_000, 2_000
MAX_LENGTH = 50  # training pairs longer than this (BOS and EOS included) are dropped, as the reference does
PREPARED = "prepared-gnmt"
FORMAT = 1
MINI_PAIRS, MINI_TEST = 40_000, 500
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


def names(merges: int) -> dict[str, str]:
    return {"train.en": f"train.tok.clean.bpe.{merges}.en", "train.de": f"train.tok.clean.bpe.{merges}.de",
            "test.en": f"newstest2014.tok.bpe.{merges}.en", "test.de": "newstest2014.de",
            "vocab": f"vocab.bpe.{merges}"}


def sources(root: Path, merges: int) -> dict[str, Path]:
    return {name: root / file for name, file in names(merges).items()}


def source_problems(root: Path, merges: int) -> list[str]:
    return [f"{path}: missing (the reference's prepared WMT16 files: {', '.join(names(merges).values())})"
            for path in sources(root, merges).values() if not path.is_file()]


def problems(root: Path, merges: int, generated: bool) -> list[str]:
    again = "trainperf prepare gnmt" + ("" if generated else f" --scale full --data {root}")
    if generated and not (root / PREPARED / "stamp.json").is_file():
        return [f"{root}: mini dataset not generated yet (trainperf prepare gnmt)"]
    found = source_problems(root, merges)
    if found:
        return found
    record = wmt_text.read_json(root / PREPARED / "stamp.json")
    if record is None:
        return [f"{root / PREPARED}: not prepared yet ({again})"]
    why = prepared.stale(record.get("stamp"), sources(root, merges), FORMAT, {"max_length": MAX_LENGTH},
                         root / PREPARED)
    return [f"{why}; run {again}"] if why else []


def read_vocabulary(path: Path) -> list[str]:
    """The reference's vocabulary: the specials, then one token per line of the file."""
    tokens = [line.strip() for line in wmt_text.read_lines(path)]
    tokens = [t for t in tokens if t]
    if not tokens:
        raise TrainperfError(f"{path}: empty vocabulary file (expected one BPE token per line)")
    return list(SPECIALS) + tokens


def encode_tokenized(lines: list[str], index: dict[str, int]) -> list[list[int]]:
    return [[index.get(tok, wmt_text.UNK) for tok in line.split()] for line in lines]


# -- the mini: raw synthetic text through the reference's preparation -------------------------------
def generate_mini(root: Path, say: Callable[[str], None], seed: int = 20261124) -> None:
    """Raw text (DIR/raw/), then tokenized, BPE'd files and the vocabulary in the reference's names."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    pairs = synthetic.corpus(MINI_PAIRS, seed)
    seen = set(pairs)
    test = [p for p in dict.fromkeys(synthetic.corpus(4 * MINI_TEST, seed + 1)) if p not in seen][:MINI_TEST]
    tok = {lang: MosesTokenizer(lang=lang) for lang in ("en", "de")}

    def tokenized(lines: list[str], lang: str) -> list[str]:
        return [tok[lang].tokenize(line, return_str=True) for line in lines]

    train_en, train_de = tokenized([e for e, _ in pairs], "en"), tokenized([d for _, d in pairs], "de")
    test_en = tokenized([e for e, _ in test], "en")
    import io

    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(train_en + train_de) + "\n"), codes, MINI_MERGES, min_frequency=2)
    codes.seek(0)
    bpe = BPE(codes)
    files = names(MINI_MERGES)
    bpe_en = [bpe.process_line(line) for line in train_en]
    bpe_de = [bpe.process_line(line) for line in train_de]
    counts = Counter(tok_ for line in bpe_en + bpe_de for tok_ in line.split())
    with AtomicOutput(root / "raw", directory=True) as tmp:
        for name, lines in (("train.en", [e for e, _ in pairs]), ("train.de", [d for _, d in pairs]),
                            ("newstest2014.en", [e for e, _ in test])):
            (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for key, lines in (("train.en", bpe_en), ("train.de", bpe_de), ("test.en", [bpe.process_line(x) for x in test_en]),
                       ("test.de", [d for _, d in test]), ("vocab", [t for t, _ in counts.most_common()])):
        write_text_atomic(root / files[key], "".join(line + "\n" for line in lines))
    say(f"wrote {len(pairs):,} synthetic training pairs and {len(test)} test pairs to {root}, prepared as the "
        f"reference prepares WMT16 (Moses tokenization, {MINI_MERGES:,} joint BPE merges, {len(counts):,} tokens)")


Prepared = wmt_text.PreparedCorpus[list[str]]


def prepare(root: Path, merges: int, generated: bool, say: Callable[[str], None]) -> None:
    files = sources(root, merges)
    if generated and not files["vocab"].is_file():
        root.mkdir(parents=True, exist_ok=True)
        generate_mini(root, say)
    found = source_problems(root, merges)
    if found:
        raise TrainperfError(found[0])
    params = {"max_length": MAX_LENGTH}
    record = wmt_text.read_json(root / PREPARED / "stamp.json")
    if record is not None:
        why = prepared.stale(record.get("stamp"), files, FORMAT, params, root / PREPARED)
        if why is None:
            say(f"{root / PREPARED}: already prepared")
            return
        say(f"{why}: preparing again")
    vocab = read_vocabulary(files["vocab"])
    index = {tok: i for i, tok in enumerate(vocab)}
    src_lines, tgt_lines = wmt_text.read_parallel(files["train.en"], files["train.de"])
    say(f"read {len(src_lines):,} training pairs; encoding")
    src, tgt = encode_tokenized(src_lines, index), encode_tokenized(tgt_lines, index)
    keep = [i for i in range(len(src)) if src[i] and tgt[i] and len(src[i]) + 2 <= MAX_LENGTH
            and len(tgt[i]) + 2 <= MAX_LENGTH]
    test_src = encode_tokenized(wmt_text.read_lines(files["test.en"]), index)
    references = wmt_text.read_lines(files["test.de"])
    if len(test_src) != len(references):
        raise TrainperfError(f"{files['test.en']} has {len(test_src):,} lines but {files['test.de']} has "
                             f"{len(references):,}")
    with AtomicOutput(root / PREPARED, directory=True) as tmp:
        wmt_text.Encoded.from_lists([src[i] for i in keep]).save(tmp, "train.src")
        wmt_text.Encoded.from_lists([tgt[i] for i in keep]).save(tmp, "train.tgt")
        wmt_text.Encoded.from_lists(test_src).save(tmp, "test.src")
        (tmp / "stamp.json").write_text(json.dumps({"stamp": prepared.stamp(files, FORMAT, params),
                                                    "train_pairs": len(keep), "dropped": len(src) - len(keep)}))
    say(f"prepared {len(keep):,} training pairs ({len(src) - len(keep):,} dropped: an empty side or longer than "
        f"{MAX_LENGTH} tokens with BOS and EOS) and {len(test_src):,} test sentences in {root / PREPARED}")


def train_pairs(root: Path) -> int:
    record = wmt_text.read_json(root / PREPARED / "stamp.json")
    if not record or "train_pairs" not in record:
        raise TrainperfError(f"{root / PREPARED}: not prepared (trainperf prepare gnmt)")
    return int(record["train_pairs"])


def load(merges: int, root: Path) -> Prepared:
    files = sources(root, merges)
    folder = root / PREPARED
    record = wmt_text.read_json(folder / "stamp.json") or {}
    return Prepared(read_vocabulary(files["vocab"]), wmt_text.Encoded.load(folder, "train.src"),
                    wmt_text.Encoded.load(folder, "train.tgt"), wmt_text.Encoded.load(folder, "test.src"),
                    wmt_text.read_lines(files["test.de"]), int(record.get("dropped", 0)))


class Detokenizer:
    """BPE tokens back to text as the reference does: join, undo the "@@ " joins, Moses-detokenize."""

    def __init__(self, vocab: list[str]) -> None:
        from sacremoses import MosesDetokenizer

        self.vocab = vocab
        self.moses = MosesDetokenizer(lang="de")

    def __call__(self, ids: list[int]) -> str:
        text = " ".join(self.vocab[i] for i in ids if i > wmt_text.EOS or i == wmt_text.UNK)
        text = (text + " ").replace("@@ ", "").strip()
        return self.moses.detokenize(text.split())


class WMT16(wmt_text.NewstestSource):
    """The reference's prepared WMT16 files (tokenized, BPE'd, the vocabulary); the mini writes raw
    synthetic text first and prepares it as the reference prepares WMT16."""

    def __init__(self, merges: int, generated: bool = False) -> None:
        self.merges, self.generated = merges, generated

    def problems(self, data_dir: Path) -> list[str]:
        return problems(data_dir, self.merges, self.generated)

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        prepare(data_dir, self.merges, self.generated, say)

    def sources(self, data_dir: Path) -> dict[str, Path]:
        return sources(data_dir, self.merges)
