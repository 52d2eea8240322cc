"""Transformer: BLEU as the reference scores it, the synthetic grammar, token batches (budget,
padding), text checks, beam search (cache against no cache, beam 1 against greedy) on a briefly
trained mini model, the closed rules of the full recipe, and the mini run end to end."""

from __future__ import annotations

import dataclasses
import math
import random
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import cut_short_run, read_log, write_minimal_closed_log
from trainperf.contract import RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.common.wmt import batching, bleu, synthetic
from trainperf.workloads.common.wmt import beam as B
from trainperf.workloads.common.wmt import text as T
from trainperf.workloads.transformer import FULL, MINI, TransformerWorkload, lr_factor
from trainperf.workloads.transformer import data as D
from trainperf.workloads.transformer import model as M


# -- BLEU ---------------------------------------------------------------------------------------
def _reference_tokenize(text: str) -> list[str]:
    """The reference's tokenization, written from its description: split off every Unicode
    punctuation character that is not next to a digit on the side being split, and every symbol."""
    chars = [chr(i) for i in range(sys.maxunicode + 1)]
    punct = "".join(re.escape(c) for c in chars if unicodedata.category(c).startswith("P"))
    symbol = "".join(re.escape(c) for c in chars if unicodedata.category(c).startswith("S"))
    text = re.sub(rf"([^\d])([{punct}])", r"\1 \2 ", text)
    text = re.sub(rf"([{punct}])([^\d])", r" \1 \2", text)
    text = re.sub(rf"([{symbol}])", r" \1 ", text)
    return text.split()


def _reference_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU-4 as the reference computes it: clipped n-gram matches summed over the corpus,
    an order with no match counting 1 / (2^k x its n-grams), the brevity penalty on total lengths."""
    matches, possible = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references, strict=True):
        h, r = _reference_tokenize(hyp.lower()), _reference_tokenize(ref.lower())
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            possible[n - 1] += max(0, len(h) - n + 1)
    smooth, logs = 1.0, 0.0
    for m, p in zip(matches, possible, strict=True):
        if m == 0:
            smooth *= 2
        logs += math.log(m / p if m else 1.0 / (smooth * p))
    ratio = hyp_len / ref_len
    return 100 * math.exp(logs / 4) * (1.0 if ratio >= 1 else math.exp(1 - 1 / ratio))


FIXED_REFERENCES = ["Der Hund sieht die Katze, die im Garten schläft.",
                    "Es kostet 3.5 Euro (oder 1,000 Yen) – sagt „Anna“.",
                    "Heute ruft der Lehrer die Ärztin an!"]


@pytest.mark.slow
@pytest.mark.parametrize("hypotheses", [
    ["der hund sieht die katze , die im garten schläft .", "Es kostet 3.5 Euro oder 1,000 Yen, sagt Anna.",
     "Heute ruft der Lehrer die Ärztin an!"],
    ["Der Hund sieht eine Katze.", "Es kostet 3,5 Euro – sagt Anna.", "Der Lehrer ruft heute an."],
    ["Hund Katze Garten schläft", "kostet Euro Yen Anna", "Lehrer Ärztin"],  # no 4-gram matches: smoothing
])
def test_bleu_equals_the_reference_algorithm_on_fixed_strings(hypotheses):
    expected = _reference_bleu(hypotheses, FIXED_REFERENCES)
    assert bleu.bleu(hypotheses, FIXED_REFERENCES, "transformer") == pytest.approx(expected, abs=1e-6)


def test_bleu_scorer_settings_are_the_references_command_lines():
    import sacrebleu

    assert bleu.bleu(FIXED_REFERENCES, FIXED_REFERENCES, "transformer") == pytest.approx(100.0)
    # GNMT's reference runs `sacrebleu -lc --tokenize intl`: lowercased, intl tokenization, exp smoothing.
    scorer = sacrebleu.BLEU(**bleu.SCORERS["gnmt"])
    scorer.corpus_score(FIXED_REFERENCES, [FIXED_REFERENCES])
    signature = scorer.get_signature().format(short=True)
    assert "c:lc" in signature and "tok:intl" in signature and "s:exp" in signature
    metric = bleu.metric(FIXED_REFERENCES, "transformer")
    translations = [(2, FIXED_REFERENCES[2]), (0, FIXED_REFERENCES[0]), (1, FIXED_REFERENCES[1])]
    assert metric({"translations": translations}) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2 translations for 3"):
        metric({"translations": translations[:2]})


# -- the synthetic grammar ------------------------------------------------------------------------
def test_german_adjective_endings_follow_the_declension_tables():
    ending = synthetic._adjective_ending
    assert [ending("the", "nom", g) for g in "mfn"] == ["e", "e", "e"]
    assert [ending("the", "acc", g) for g in "mfn"] == ["en", "e", "e"]
    assert [ending("the", "dat", g) for g in "mfn"] == ["en", "en", "en"]
    assert [ending("a", "nom", g) for g in "mfn"] == ["er", "e", "es"]
    assert [ending("a", "acc", g) for g in "mfn"] == ["en", "e", "es"]
    assert ending("none", "nom", "pl") == "e" and ending("none", "dat", "pl") == "en"


def test_synthetic_sentences_have_german_word_order():
    pairs = synthetic.corpus(3000, seed=5)
    finals = {v.particle + v.de for v in synthetic.TRANSITIVE + synthetic.INTRANSITIVE} | \
             {v.particle + v.de_plural for v in synthetic.TRANSITIVE + synthetic.INTRANSITIVE}
    subordinate = [de for _, de in pairs if ", dass " in de]
    assert subordinate and all(de.rstrip(".").split()[-1] in finals for de in subordinate)  # verb-final
    fronted = [(en, de) for en, de in pairs if en.split()[0] in ("Today", "Tomorrow", "Now", "Then")]
    verbs = {v.de for v in synthetic.TRANSITIVE + synthetic.INTRANSITIVE} | \
            {v.de_plural for v in synthetic.TRANSITIVE + synthetic.INTRANSITIVE}
    assert fronted and all(de.split()[1] in verbs for _, de in fronted)  # verb second
    called = [de for en, de in pairs if " calls " in en and ", " not in de and "dass" not in de]
    assert called and all(de.rstrip(".").endswith(" an") for de in called)  # ruft ... an
    assert any(" leitet " in de for en, de in pairs) and any("läuft" in de for en, de in pairs)  # runs


def test_dictionary_baseline_is_far_below_a_translation(tmp_path):
    pairs = synthetic.corpus(20000, seed=1)
    test = synthetic.corpus(300, seed=2)
    table = synthetic.dice_table(pairs)
    hyps = [synthetic.dictionary_translation(en, table) for en, _ in test]
    score = bleu.bleu(hyps, [de for _, de in test], "transformer")
    assert 5 < score < 30


# -- text and batches -----------------------------------------------------------------------------
def test_parallel_text_problems_are_one_line_each(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    with pytest.raises(TrainperfError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        T.read_parallel(tmp_path / "a.en", tmp_path / "a.de")
    (tmp_path / "b.de").write_bytes(b"eins\nzwei\ndr\xe9i\n")
    with pytest.raises(TrainperfError, match=r"b\.de:3: not UTF-8"):
        T.read_lines(tmp_path / "b.de")
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(TrainperfError, match="empty.model: missing or empty vocabulary"):
        T.Vocabulary(tmp_path / "empty.model")


def test_token_batches_respect_the_budget_and_cover_every_sentence_once():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 5000), rng.integers(1, 60, 5000)
    batches = batching.token_batches(src, tgt, 1024, np.random.default_rng(1), multiple=2)
    assert all(len(b) * max(src[b].max(), tgt[b].max()) <= 1024 for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == list(range(5000))
    assert sum(len(b) % 2 for b in batches) <= 60  # even wherever a batch of the length allowed it
    with pytest.raises(ValueError, match="exceeds the batch budget"):
        batching.token_batches(np.array([2000]), np.array([3]), 1024, np.random.default_rng(0))


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("transformer-mini")
    D.WMT17(D.MINI_VOCAB, generated=True).prepare(root, lambda line: None)
    return root


@pytest.mark.slow
def test_mini_corpus_is_prepared_in_the_wmt_layout(mini_root):
    assert (mini_root / "train" / "synthetic.de-en.en").is_file() and (mini_root / "newstest2014.de").is_file()
    assert D.WMT17(D.MINI_VOCAB, generated=True).problems(mini_root) == []
    data = D.load(mini_root)
    assert len(data.train_src) == D.MINI_PAIRS and len(data.test_src) == D.MINI_TEST
    train = set(zip(T.read_lines(mini_root / "train" / "synthetic.de-en.en"),
                    T.read_lines(mini_root / "train" / "synthetic.de-en.de"), strict=True))
    test = zip(T.read_lines(mini_root / "newstest2014.en"), data.test_references, strict=True)
    assert not train & set(test)  # no test pair was seen in training
    # Decoding the encoded German gives the text back (the vocabulary covers the corpus).
    assert data.vocab.decode([data.train_tgt[0].tolist()])[0] == T.read_lines(
        mini_root / "train" / "synthetic.de-en.de")[0]
    # A changed source makes the prepared data stale, named.
    with (mini_root / "newstest2014.de").open("a") as fh:
        fh.write("Noch ein Satz.\n")
    try:
        assert "newstest2014.de: changed" in D.WMT17(D.MINI_VOCAB, generated=True).problems(mini_root)[0]
    finally:
        (mini_root / "newstest2014.de").write_text("".join(line + "\n" for line in data.test_references))


def test_bucketing_wastes_little_on_padding(mini_root):
    data = D.load(mini_root)
    src, tgt = D.lengths_for_budget(data)
    batches = batching.token_batches(src, tgt, MINI.global_batch_size, np.random.default_rng(0))
    waste = batching.padding(batches, src, tgt)
    assert waste.fraction < 0.15  # measured: see the README
    random_batches = np.array_split(np.random.default_rng(0).permutation(len(src)), len(batches))
    assert batching.padding(random_batches, src, tgt).fraction > 2 * waste.fraction


def test_too_long_training_pairs_are_dropped_and_counted(tmp_path, mini_root):
    import shutil

    root = tmp_path / "wmt"
    shutil.copytree(mini_root / "train", root / "train")
    for name in D.TEST:
        shutil.copy(mini_root / name, root / name)
    long_line = " ".join(["Hund"] * 400) + "."
    train = root / "train"
    with (train / "synthetic.de-en.en").open("a") as en, (train / "synthetic.de-en.de").open("a") as de:
        en.write(long_line + "\n")
        de.write("Kurz.\n")
    said: list[str] = []
    D.WMT17(D.MINI_VOCAB, generated=True).prepare(root, said.append)
    assert any("(1 dropped" in line for line in said)
    assert len(D.load(root).train_src) == D.MINI_PAIRS


# -- model and decoding ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(mini_root) -> tuple[M.Transformer, D.Prepared]:
    """The mini model after 150 steps: translations are partly right, so beams differ."""
    torch.manual_seed(0)
    data = D.load(mini_root)
    model = M.Transformer(len(data.vocab), MINI.dim, MINI.heads, MINI.ffn, 2, 2, MINI.dropout, 307)
    opt = torch.optim.Adam(model.parameters(), 3e-3, betas=(0.9, 0.997), eps=1e-9)
    src_len, tgt_len = D.lengths_for_budget(data)
    factor = lr_factor(MINI)
    for step, rows in enumerate(batching.token_batches(src_len, tgt_len, 2048, np.random.default_rng(0))[:150]):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * factor(step)
        src = torch.from_numpy(T.pad_batch(data.train_src, rows, suffix=T.EOS))
        tgt_in = torch.from_numpy(T.pad_batch(data.train_tgt, rows, prefix=T.BOS))
        tgt_out = torch.from_numpy(T.pad_batch(data.train_tgt, rows, suffix=T.EOS))
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=T.PAD,
                               label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), data


def _sources(data: D.Prepared, count: int = 40) -> torch.Tensor:
    return torch.from_numpy(T.pad_batch(data.test_src, np.arange(count), suffix=T.EOS))


@pytest.mark.second_tier
def test_cached_decoding_equals_recomputing_every_step(trained):
    model, data = trained
    src = _sources(data)
    with torch.no_grad():
        cached = M.translate(model, src, beam=4, alpha=0.6, extra_length=50, cached=True)
        recomputed = M.translate(model, src, beam=4, alpha=0.6, extra_length=50, cached=False)
        # The step's log-probabilities too, not only the argmax.
        a = M.TransformerStepper(model, src[:8], 1, cached=True)
        b = M.TransformerStepper(model, src[:8], 1, cached=False)
        tokens = torch.full((8, 1), T.BOS)
        for _ in range(6):
            pa, _ = a.step(tokens)
            pb, _ = b.step(tokens)
            torch.testing.assert_close(pa, pb, atol=1e-4, rtol=1e-4)
            tokens = torch.cat([tokens, pa.argmax(-1, keepdim=True)], 1)
    assert cached == recomputed
    assert sum(len(t) for t in cached) > 4 * len(cached)  # real translations, not empty ones


@pytest.mark.second_tier
def test_beam_of_one_is_greedy_and_wider_beams_score_at_least_as_well(trained):
    model, data = trained
    src = _sources(data)
    limit = (src != T.PAD).sum(1) + 50
    with torch.no_grad():
        greedy = B.greedy_search(M.TransformerStepper(model, src, 1), len(src), limit, T.BOS, T.EOS)
        beam1 = B.beam_search(M.TransformerStepper(model, src, 1), len(src), 1, limit, T.BOS, T.EOS, alpha=0.6)
        beam4 = M.translate(model, src, beam=4, alpha=0.0, extra_length=50)
    assert beam1 == greedy

    def logprob(ids: list[list[int]]) -> torch.Tensor:
        rows = [[T.BOS, *t] for t in ids]
        width = max(map(len, rows)) + 1
        tgt_in = torch.tensor([r + [T.PAD] * (width - len(r)) for r in rows])
        tgt_out = torch.tensor([r[1:] + [T.EOS] + [T.PAD] * (width - len(r)) for r in rows])
        with torch.no_grad():
            logp = F.log_softmax(model(src, tgt_in).float(), -1).gather(2, tgt_out.unsqueeze(-1)).squeeze(-1)
        return (logp * (tgt_out != T.PAD)).sum(1)

    # With no length penalty a beam of 4 finds sequences at least as likely as greedy's, overall.
    assert logprob(beam4).sum() >= logprob(greedy).sum() - 1e-3


def test_sinusoids_and_shared_embedding():
    pe = M.sinusoids(10, 8)
    assert pe.shape == (10, 8)
    torch.testing.assert_close(pe[0], torch.tensor([0, 0, 0, 0, 1, 1, 1, 1.0]))
    model = M.Transformer(50, 16, 2, 32, 1, 1, 0.0, 20)
    assert not any(p is model.embed.weight for n, p in model.named_parameters() if n != "embed.weight")
    logits = model(torch.tensor([[5, 6, T.EOS]]), torch.tensor([[T.BOS, 7]]))
    assert logits.shape == (1, 2, 50)


def test_the_full_model_has_the_references_parameters():
    """The reference's layers (TF official transformer: attention projections without biases, FFN with),
    counted by hand: the shared 33,708 x 1,024 embedding, 6 encoder layers (attention 4 d^2, FFN 2 d f + f + d,
    2 LayerNorms), 6 decoder layers (two attentions, FFN, 3 LayerNorms), the two final LayerNorms."""
    d, f, vocab = 1024, 4096, 33_708
    ffn = 2 * d * f + f + d
    expected = vocab * d + 6 * (4 * d * d + ffn + 4 * d) + 6 * (8 * d * d + ffn + 6 * d) + 2 * 2 * d
    workload = TransformerWorkload()
    with torch.device("meta"):
        parts = workload.build(FULL, RuntimeContext(device=torch.device("meta")), {})
    assert sum(p.numel() for p in parts.model.parameters()) == expected == 210_804_736
    assert not any(name.endswith(("q.bias", "kv.bias", "out.bias")) for name, _ in parts.model.named_parameters())


def test_the_reference_recipe_says_its_schedule_is_the_single_process_runs():
    workload = TransformerWorkload()
    (note,) = workload.notes(FULL, "full")
    assert "32,768 tokens a step" in note and "16,000 steps" in note and "4,096 tokens" in note
    assert workload.notes(dataclasses.replace(FULL, global_batch_size=4096), "full") == []
    assert workload.notes(MINI, "mini") == []


def test_inverse_square_root_schedule():
    f = lr_factor(FULL)
    assert f(0) == pytest.approx(1 / 16000) and f(15999) == pytest.approx(1.0)
    assert f(63999) == pytest.approx(0.5)  # sqrt(16000 / 64000)
    assert FULL.base_lr == pytest.approx(2.0 / math.sqrt(1024) / math.sqrt(16000))


# -- rules and runs -------------------------------------------------------------------------------
def test_the_closed_rules_refuse_adam_epsilon_1e8(tmp_path):
    """Every full recipe passing the closed rules is the conformance test's; epsilon 1e-9 is Transformer's own."""
    hyper = TransformerWorkload().mlperf_hyperparameters(FULL, RuntimeContext.create("cpu"))
    bad = tmp_path / "bad.txt"
    write_minimal_closed_log(bad, "transformer", FULL.global_batch_size, {**hyper, "opt_adam_epsilon": 1e-8},
                             0.251, 1.0)
    assert not check(bad, "0.7.0").valid


@pytest.mark.second_tier
def test_mini_runs_end_to_end_and_log_passes_ruleset_070(tmp_path):
    """One epoch with its beam-search evaluation (the target itself: README, 10 seeds), on the mini data
    trainperf generates (a folder made by the generator alone has no record of it, and a mini refuses it)."""
    out = tmp_path / "run"
    result = cut_short_run(["transformer", "--seed", "1", "--set", "max_epochs=1"], out, "0.7.0")
    assert 0.0 <= result["evaluations"][-1]["value"] < 1.0
    events = read_log(out / "mlperf_log.txt")
    length = next(e for e in events if e["key"] == "max_sequence_length")
    assert length["metadata"]["method"] == "discard"


def test_random_bleu_is_near_zero():
    rnd = random.Random(0)
    words = "der die das Hund Katze sieht".split()
    hyps = [" ".join(rnd.choice(words) for _ in range(6)) for _ in FIXED_REFERENCES]
    assert bleu.bleu(hyps, FIXED_REFERENCES, "transformer") < 15


def test_an_empty_newstest_is_refused_before_a_run(tmp_path, capsys):
    """An empty newstest2014 prepared fine; the run then trained and died at its first evaluation (sacrebleu
    on no sentence: exit 3). Refused in one line by `prepare`."""
    from trainperf.cli import main

    root = tmp_path / "wmt"
    (root / "train").mkdir(parents=True)
    pairs = synthetic.corpus(200, seed=3)
    (root / "train" / "syn.de-en.en").write_text("".join(en + "\n" for en, _ in pairs))
    (root / "train" / "syn.de-en.de").write_text("".join(de + "\n" for _, de in pairs))
    (root / "newstest2014.en").write_text("")
    (root / "newstest2014.de").write_text("")
    assert main(["prepare", "transformer", "--scale", "full", "--data", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "newstest2014.de: the evaluation set is empty (MLPerf's holds 3,003)" in err[0]


# -- static shapes (--static-shapes, --cuda-graphs) ---------------------------------------------------
def test_a_batch_padded_to_its_bucket_has_the_unpadded_loss_and_gradients():
    """Extra PAD columns and empty rows (source EOS, target PAD) change neither the summed loss nor a gradient."""
    from trainperf.contract import Assets
    from trainperf.workloads.common.wmt import parts as P

    recipe = MINI.with_overrides(["dropout=0", "label_smoothing=0.1"])
    torch.manual_seed(0)
    parts = TransformerWorkload().build(recipe, RuntimeContext.create("cpu"), Assets({}))
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 12, 5)
    src = T.Encoded.from_lists([rng.integers(4, 100, n).tolist() for n in lengths])
    tgt = T.Encoded.from_lists([rng.integers(4, 100, n + 2).tolist() for n in lengths])
    rows = np.arange(5)
    results = []
    for shape in (None, (8, 24)):
        batch = P.training_batch(src, tgt, rows, torch.device("cpu"), shape=shape)
        parts.model.zero_grad()
        loss = parts.loss_fn(parts.model, batch)
        loss.backward()
        assert int(parts.loss_units(batch)) == int((lengths + 3).sum())
        results.append((batch[0].shape, loss.detach(), [p.grad.clone() for p in parts.model.parameters()]))
    (shape0, loss0, grads0), (shape1, loss1, grads1) = results
    assert shape0 != shape1 == (8, 24)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads0, grads1, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_static_shapes_batch_every_sentence_once_in_a_few_fixed_shapes(mini_root):
    from trainperf.contract import EpochView

    workload = TransformerWorkload()
    recipe = MINI.with_overrides(["static_shapes=true", "bucket_lengths=8,16,24,32,48"])
    data = workload.load_data(recipe, mini_root, RuntimeContext.create("cpu"))
    shapes, real = Counter(), 0
    for src, _, tgt_out in data.train_batches(EpochView(epoch=1, model=None, log=lambda *a, **k: None)):
        assert src.shape == tgt_out.shape and src.shape[0] == recipe.global_batch_size // src.shape[1]
        shapes[tuple(src.shape)] += 1
        real += int((tgt_out != T.PAD).any(1).sum())  # an empty row's target is all PAD
    assert real == data.train_samples == len(D.load(mini_root).train_src)
    assert set(length for _, length in shapes) <= {8, 16, 24, 32, 48}
    assert 1 < len(shapes) <= 5
    assert workload.shape_buckets(recipe)["lengths"] == [8, 16, 24, 32, 48]
    assert workload.shape_buckets(MINI) is None
    with pytest.raises(TrainperfError, match="bucket_lengths: a sequence of"):
        workload.load_data(recipe.with_overrides(["bucket_lengths=8,16"]), mini_root, RuntimeContext.create("cpu"))
    with pytest.raises(TrainperfError, match="bucket_lengths"):
        MINI.with_overrides(["bucket_lengths=16,8"])
