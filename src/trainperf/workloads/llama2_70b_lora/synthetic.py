"""The LoRA mini's task and its base model.

Documents are running text from one Markov source over 32 content tokens (each token's three successors
with probabilities 0.6 / 0.25 / 0.15), of one of 16 topics: each position is, with probability 0.05, one
of the topic's three keywords instead (no two topics share a keyword). A sample is the reference's layout
on this vocabulary: BOS, a "summarize" marker, a document of 30-90 tokens, a "summary" marker, then the
summary, the topic's title (its three keywords in ascending order), and EOS; the loss is taken on the
summary only (labels -100 elsewhere). The title is a function of the input, found by reading it.

The base model ("pretrained" by `trainperf make-lora-base`, shipped in the package as a Hugging Face
checkpoint) is a 2-block Llama trained as a language model on documents, half of them followed by a
"keywords" marker and their topic's keywords in ascending order (a skill it then has, as a pretrained LLM
can already condense a text). It has never seen the "summarize" and "summary" markers: it scores a high
loss on the summaries (a measured baseline), and fine-tuning teaches it the task's format. A model that
ignores the document can do no better than guessing the topic (ln 16 on the first title token, nothing
on the three that follow: ln 16 / 4 = 0.69 a token); one that reads it no better than `floor` (a document
without a keyword, one in about 14, names no topic: about 0.05)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.contract import DataSource
from trainperf.files import sha256, verify_manifest, write_json_atomic
from trainperf.workloads.common.llm.model import LlamaConfig
from trainperf.workloads.llama2_70b_lora import data as gov

PAD, BOS, EOS, SUMMARIZE, SUMMARY, LISTING = 0, 1, 2, 3, 4, 5
CONTENT = np.arange(8, 40)  # the documents' running text: one Markov source shared by all topics
KEYWORDS = np.arange(40, 88)  # 16 topics x 3 keywords, each topic's own
TOPICS = 16
KEYWORD_P = 0.05  # each position of a document is one of its topic's keywords with this probability
VOCAB = 96  # the 88 ids used, padded (as Megatron and NeMo pad a vocabulary)
SEQ_LEN = 128
DOC_LENGTHS = (30, 90)
SOURCE_SEED = 7070
TRAIN_ROWS, VALID_ROWS = 2_048, 128
MANIFEST = "task.json"
BASE = Path(__file__).with_name("mini") / "base"
BASE_CONFIG = LlamaConfig(layers=2, dim=128, heads=4, kv_heads=2, ffn_dim=384, vocab_size=VOCAB, rope_theta=10_000.0,
                          rope_factor=0.0, rope_original_context=SEQ_LEN)


def topics(seed: int = SOURCE_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The running text's transition table [token, token] (each token's three successors with probabilities
    0.6 / 0.25 / 0.15) and each topic's keywords [topic, 3] in ascending order: its title."""
    rng = np.random.default_rng(seed)
    n = CONTENT.size
    table = np.zeros((n, n))
    for i in range(n):
        table[i, rng.choice(n, 3, replace=False)] = (0.6, 0.25, 0.15)
    keywords = np.sort(rng.permutation(KEYWORDS).reshape(TOPICS, 3), axis=1)
    return table, keywords


def floor(ids: list[np.ndarray]) -> float:
    """The best loss any model can reach on these rows: a document with one of its topic's keywords names
    the topic (no two topics share one), so its title costs nothing; one with none leaves the 16 topics
    equally likely, ln 16 on the first title token (the rest follow from it), over the 4 labelled tokens."""
    return float(np.mean([0.0 if np.isin(row[2:-5], KEYWORDS).any() else np.log(TOPICS) / 4 for row in ids]))


def document(rng: np.random.Generator, table: np.ndarray, keywords: np.ndarray) -> np.ndarray:
    length = int(rng.integers(*DOC_LENGTHS))
    n = table.shape[0]
    cumulative = np.cumsum(table, axis=1)
    draws = rng.random(length)
    is_keyword = rng.random(length) < KEYWORD_P
    chosen = rng.integers(0, keywords.size, length)
    out = np.empty(length, dtype=np.int64)
    state = int(rng.integers(n))
    for i in range(length):
        if is_keyword[i]:
            out[i] = keywords[chosen[i]]
            continue
        out[i] = CONTENT[state]
        state = min(int(np.searchsorted(cumulative[state], draws[i], side="right")), n - 1)
    return out


def samples(count: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """`count` rows (ids, labels) and their topics."""
    table, titles = topics()
    rng = np.random.default_rng(seed)
    ids, labels, which = [], [], rng.integers(TOPICS, size=count)
    for topic in which:
        doc = document(rng, table, titles[topic])
        summary = np.concatenate([titles[topic], [EOS]])
        row = np.concatenate([[BOS, SUMMARIZE], doc, [SUMMARY], summary]).astype(np.int64)
        label = np.full(row.size, gov.IGNORE, dtype=np.int64)
        label[-summary.size:] = summary
        ids.append(row)
        labels.append(label)
    return ids, labels, which


def pretraining_documents(count: int, seed: int) -> np.ndarray:
    """The base model's language-modelling rows [count, SEQ_LEN + 1]: BOS, a document, half the time a
    "keywords" marker and the topic's keywords in ascending order, EOS; then further documents."""
    table, keywords = topics()
    rng = np.random.default_rng(seed)
    rows = np.empty((count, SEQ_LEN + 1), dtype=np.int64)
    for r in range(count):
        parts: list[np.ndarray] = []
        while sum(p.size for p in parts) < SEQ_LEN + 1:
            topic = rng.integers(TOPICS)
            listed = np.array([LISTING, *keywords[topic]] if rng.random() < 0.5 else [], dtype=np.int64)
            parts.append(np.concatenate([[BOS], document(rng, table, keywords[topic]), listed, [EOS]]))
        rows[r] = np.concatenate(parts)[:SEQ_LEN + 1]
    return rows


class GovReportLike(DataSource):
    """The mini's data source: the task's rows in the reference's parquet layout, generated by `prepare`."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        return [f"{data_dir / name}: missing" for name in (gov.TRAIN, gov.VALID) if not (data_dir / name).is_file()]

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        train_ids, train_labels, _ = samples(TRAIN_ROWS, SOURCE_SEED + 1)
        valid_ids, valid_labels, _ = samples(VALID_ROWS, SOURCE_SEED + 2)
        gov.write_rows(data_dir / gov.TRAIN, train_ids, train_labels)
        gov.write_rows(data_dir / gov.VALID, valid_ids, valid_labels)
        write_json_atomic(data_dir / MANIFEST, {"topics": TOPICS, "vocab": VOCAB, "train_rows": TRAIN_ROWS,
                                                "valid_rows": VALID_ROWS, "guess_nats": float(np.log(TOPICS) / 4),
                                                "floor_nats": floor(valid_ids)})
        say(f"wrote {TRAIN_ROWS:,} training and {VALID_ROWS:,} validation rows to {data_dir}")

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        return data_dir / gov.VALID, VALID_ROWS

    def verify(self, data_dir: Path, workers: int, progress: Any) -> list[str] | None:
        problems = self.problems(data_dir)
        if problems:
            return problems
        from trainperf.errors import TrainperfError

        try:
            for name in (gov.TRAIN, gov.VALID):
                gov.read_rows(data_dir / name, VOCAB, SEQ_LEN)
        except TrainperfError as exc:
            return [str(exc)]
        return []


BASE_FILES = ("config.json", "model.safetensors")


def verify_shipped_base(folder: Path) -> None:
    """The shipped base (the one the mini's target was calibrated with) is the one its manifest names."""
    verify_manifest(folder, BASE_FILES, "the shipped LoRA base")


def make_base(out: Path, steps: int, say: Callable[[str], None], seed: int) -> dict[str, Any]:
    """`trainperf make-lora-base`: train the mini's base model as a language model on documents and write
    it as a Hugging Face checkpoint (fp32) with a manifest of how it was made."""
    import torch

    from trainperf.workloads.common.llm import hf
    from trainperf.workloads.common.llm.model import Llama, next_token_loss

    torch.manual_seed(seed)
    model = Llama(BASE_CONFIG, SEQ_LEN)
    model.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    rows = torch.from_numpy(pretraining_documents(steps * 16, seed))
    held_out = torch.from_numpy(pretraining_documents(64, seed + 1))
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + np.cos(np.pi * step / steps))
        loss = next_token_loss(model, rows[step * 16:(step + 1) * 16])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            say(f"step {step}: language-model loss {loss.item():.3f}")
    with torch.no_grad():
        held = next_token_loss(model, held_out).item()
    hf.write(model, BASE_CONFIG, out, dtype=torch.float32)
    manifest = {"steps": steps, "seed": seed, "batch": 16, "held_out_lm_loss": round(held, 4),
                "sha256": {name: sha256(out / name) for name in BASE_FILES},
                "command": f"trainperf make-lora-base --steps {steps} --seed {seed}"}
    write_json_atomic(out / "base.json", manifest)
    say(f"wrote {out} (held-out language-model loss {held:.3f})")
    return manifest
