"""GNMT: the mini prepared as the reference prepares WMT16 (Moses, subword-nmt BPE, its file names),
the reference's LR schedule and bucketing, the model's layout, decoding (cache against no cache, beam 1
against greedy, the coverage penalty), the closed rules and the mini run end to end."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import cut_short_run, read_log, write_minimal_closed_log
from trainperf.contract import RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.common.wmt import batching
from trainperf.workloads.common.wmt import beam as B
from trainperf.workloads.common.wmt import text as T
from trainperf.workloads.gnmt import MINI, GNMTWorkload, lr_factor, schedule_steps
from trainperf.workloads.gnmt import data as D
from trainperf.workloads.gnmt import model as M
from trainperf.workloads.gnmt.recipes import FULL


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gnmt-mini")
    D.WMT16(D.MINI_MERGES, generated=True).prepare(root, lambda line: None)
    return root


@pytest.mark.slow
def test_mini_is_prepared_in_the_reference_files(mini_root):
    files = D.sources(mini_root, D.MINI_MERGES)
    assert [p.name for p in files.values()] == ["train.tok.clean.bpe.2000.en", "train.tok.clean.bpe.2000.de",
                                                 "newstest2014.tok.bpe.2000.en", "newstest2014.de", "vocab.bpe.2000"]
    german = T.read_lines(files["train.de"])
    assert any("@@ " in line for line in german)  # BPE continuation marks, as subword-nmt writes them
    assert D.WMT16(D.MINI_MERGES, generated=True).problems(mini_root) == []
    data = D.load(D.MINI_MERGES, mini_root)
    assert data.vocab[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    # Encoded German, detokenized the reference's way, gives the raw text back.
    raw = T.read_lines(mini_root / "raw" / "train.de")
    detok = D.Detokenizer(data.vocab)
    same = sum(detok(data.train_tgt[i].tolist()) == raw[i] for i in range(200))
    assert same == 200


def test_empty_vocabulary_is_one_line(tmp_path):
    (tmp_path / "vocab.bpe.32000").write_text("\n\n")
    with pytest.raises(TrainperfError, match=r"vocab\.bpe\.32000: empty vocabulary file"):
        D.read_vocabulary(tmp_path / "vocab.bpe.32000")
    assert "missing" in D.WMT16(D.FULL_MERGES).problems(tmp_path)[0]


def test_reference_lr_schedule():
    spe = 1000
    f = lr_factor(FULL, spe)
    remain, interval = schedule_steps(FULL, spe)
    assert (remain, interval) == (int(0.666 * 8000), (8000 - int(0.666 * 8000)) // 4)
    assert f(0) == pytest.approx(0.01) and f(200) == pytest.approx(1.0)
    assert f(100) == pytest.approx(0.1)  # exponential: halfway in steps is sqrt(0.01)
    assert f(remain - 1) == 1.0 and f(remain) == 0.5 and f(remain + interval) == 0.25
    assert f(10**6) == 0.5 ** 4


def test_bucketed_batches_cover_every_sentence_in_ceil_n_over_b(mini_root):
    data = D.load(D.MINI_MERGES, mini_root)
    src, tgt = data.train_src.lengths + 1, data.train_tgt.lengths + 1
    batches = batching.bucketed_batches(src, tgt, 128, MINI.buckets, np.random.default_rng(0))
    assert len(batches) == math.ceil(len(src) / 128)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))
    assert batching.padding(batches, src, tgt).fraction < 0.15  # measured: see the README
    reference = batching.bucketed_batches(src, tgt, 128, FULL.buckets, np.random.default_rng(0))
    assert batching.padding(reference, src, tgt).fraction > batching.padding(batches, src, tgt).fraction


def test_model_layout_is_the_references():
    model = M.GNMT(64, hidden=16, dropout=0.0)
    assert model.encoder.layers[0].bidirectional and model.encoder.layers[1].input_size == 32
    assert all(layer.input_size == 32 for layer in model.decoder.layers)  # context concatenated
    assert model.decoder.attention.gain.item() == pytest.approx(16 ** -0.5)
    assert all(p.abs().max() <= 0.1 for n, p in model.named_parameters() if "attention.gain" not in n)
    biased = M.GNMT(64, hidden=16, dropout=0.0, forget_bias=1.0)
    torch.testing.assert_close(biased.encoder.layers[2].bias_ih_l0[16:32], torch.ones(16))
    src = torch.tensor([[5, 6, 7, T.EOS], [8, T.EOS, T.PAD, T.PAD]])
    logits = model(src, torch.tensor([[T.BOS, 9, 10], [T.BOS, 11, T.PAD]]))
    assert logits.shape == (2, 3, 64)
    # Padding does not change a sentence's encoding.
    alone = model.encode(src[1:, :2])[0]
    torch.testing.assert_close(model.encode(src)[0][1:, :2], alone, atol=1e-5, rtol=1e-5)


def test_coverage_penalty_by_hand():
    coverage = torch.tensor([[0.5, 1.5, 0.25, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    expected = 0.1 * (math.log(0.5) + math.log(1.0) + math.log(0.25))
    assert B.coverage_penalty(coverage, mask, 0.1).item() == pytest.approx(expected)
    assert B.length_penalty(3, 0.6) == pytest.approx((8 / 6) ** 0.6)


@pytest.fixture(scope="module")
def trained(mini_root) -> tuple[M.GNMT, D.Prepared]:
    torch.manual_seed(0)
    data = D.load(D.MINI_MERGES, mini_root)
    model = M.GNMT(len(data.vocab), MINI.hidden, 0.0, attention_scale=1.0, forget_bias=1.0)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    src_len, tgt_len = data.train_src.lengths + 1, data.train_tgt.lengths + 1
    for rows in batching.bucketed_batches(src_len, tgt_len, 128, 5, np.random.default_rng(0))[:60]:
        src = torch.from_numpy(T.pad_batch(data.train_src, rows, suffix=T.EOS))
        tgt_in = torch.from_numpy(T.pad_batch(data.train_tgt, rows, prefix=T.BOS))
        tgt_out = torch.from_numpy(T.pad_batch(data.train_tgt, rows, suffix=T.EOS))
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=T.PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), data


@pytest.mark.second_tier
def test_cached_decoding_equals_recomputing_and_beam_one_is_greedy(trained):
    model, data = trained
    src = torch.from_numpy(T.pad_batch(data.test_src, np.arange(24), suffix=T.EOS))
    with torch.no_grad():
        cached = M.translate(model, src, 5, 0.6, 5.0, 0.1, 40, cached=True)
        recomputed = M.translate(model, src, 5, 0.6, 5.0, 0.1, 40, cached=False)
        limit = torch.full((len(src),), 40)
        greedy = B.greedy_search(M.GNMTStepper(model, src, 1), len(src), limit, T.BOS, T.EOS)
        beam1 = B.beam_search(M.GNMTStepper(model, src, 1), len(src), 1, limit, T.BOS, T.EOS)
    assert cached == recomputed
    assert beam1 == greedy
    assert sum(map(len, cached)) > 3 * len(cached)


def test_the_closed_rules_refuse_a_log_without_remain_steps(tmp_path):
    """Every full recipe passing the closed rules is the conformance test's; this is GNMT's own key."""
    workload = GNMTWorkload()
    small = dataclasses.replace(FULL, hidden=16)  # the same schedule, a model quick to build
    parts = workload.build(small, RuntimeContext.create("cpu"), {})
    hyper = {**workload.mlperf_hyperparameters(FULL, RuntimeContext.create("cpu")),
             **parts.epoch_hyperparameters(3876)}
    log = tmp_path / "closed.txt"
    del hyper["opt_learning_rate_remain_steps"]
    write_minimal_closed_log(log, "gnmt", FULL.global_batch_size, hyper, 0.241, 1.0)
    assert not check(log, "0.7.0").valid


@pytest.mark.second_tier
def test_mini_runs_end_to_end_and_log_passes_ruleset_070(tmp_path):
    """One epoch with its beam-search evaluation (the target itself: README, 10 seeds), on the mini data
    trainperf generates (a folder made by the generator alone has no record of it, and a mini refuses it)."""
    out = tmp_path / "run"
    result = cut_short_run(["gnmt", "--seed", "1", "--set", "max_epochs=1"], out, "0.7.0")
    assert 0.0 <= result["evaluations"][-1]["value"] < 1.0
    events = read_log(out / "mlperf_log.txt")
    assert any(e["key"] == "opt_learning_rate_remain_steps" for e in events)


def test_encoder_packs_as_torchs_unsorted_packing_does():
    """The encoder sorts once, on the device, instead of in every layer: the same outputs and gradients as
    pack_padded_sequence(enforce_sorted=False) layer by layer (lengths tied and untied)."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from trainperf.workloads.gnmt.model import Encoder

    torch.manual_seed(0)
    encoder = Encoder(8, dropout=0.0)
    x = torch.randn(6, 7, 8, requires_grad=True)
    lengths = [3, 7, 5, 7, 1, 3]
    ours = encoder(x, lengths, torch.tensor(lengths))
    ours.sum().backward()
    ours_grad = x.grad.clone()
    x.grad = None
    y = x
    for i, lstm in enumerate(encoder.layers):
        out, _ = lstm(pack_padded_sequence(y, torch.tensor(lengths), batch_first=True, enforce_sorted=False))
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=7)
        y = out + y if i >= 2 else out
    y.sum().backward()
    torch.testing.assert_close(ours, y)
    torch.testing.assert_close(ours_grad, x.grad)


def test_a_bucketed_batch_trains_as_the_packed_one():
    """--static-shapes: the encoder unpacked over rows padded to a bucket (the backward direction reversed
    within each row's length), empty rows added, and the loss normalised by real sentences: the same loss and
    gradients as the reference's packed batch."""
    from trainperf.contract import Assets
    from trainperf.workloads.common.wmt import parts as P

    recipe = MINI.with_overrides(["dropout=0"])
    torch.manual_seed(0)
    parts = GNMTWorkload().build(recipe, RuntimeContext.create("cpu"), Assets({}))
    rng = np.random.default_rng(1)
    lengths = [3, 9, 5, 9, 1, 4]
    src = T.Encoded.from_lists([rng.integers(4, 100, n).tolist() for n in lengths])
    tgt = T.Encoded.from_lists([rng.integers(4, 100, n + 1).tolist() for n in lengths])
    results = []
    for shape in (None, (8, 16)):
        batch = P.training_batch(src, tgt, np.arange(6), torch.device("cpu"), source_lengths=True, shape=shape)
        assert isinstance(batch[3], torch.Tensor) == (shape is not None)
        parts.model.zero_grad()
        loss = parts.loss_fn(parts.model, batch)
        loss.backward()
        results.append((batch[0].shape, loss.detach(), [p.grad.clone() for p in parts.model.parameters()]))
    (shape0, loss0, grads0), (shape1, loss1, grads1) = results
    assert shape0 == (6, 10) and shape1 == (8, 16)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads0, grads1, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_static_shapes_batches_have_a_few_fixed_shapes(mini_root):
    from collections import Counter

    from trainperf.contract import EpochView

    workload = GNMTWorkload()
    recipe = MINI.with_overrides(["static_shapes=true"])
    data = workload.load_data(recipe, mini_root, RuntimeContext.create("cpu"))
    shapes, real = Counter(), 0
    for src, _, tgt_out, lengths in data.train_batches(EpochView(epoch=1, model=None, log=lambda *a, **k: None)):
        assert src.shape[0] == recipe.global_batch_size and lengths.shape == (src.shape[0],)
        shapes[tuple(src.shape)] += 1
        real += int((tgt_out != T.PAD).any(1).sum())
    assert {length for _, length in shapes} <= set(recipe.bucket_lengths) and len(shapes) > 1
    assert real == data.train_samples
    assert workload.shape_buckets(recipe)["lengths"] == list(recipe.bucket_lengths)
    with pytest.raises(TrainperfError, match="bucket_lengths: the longest bucket"):
        workload.load_data(recipe.with_overrides(["bucket_lengths=8,16"]), mini_root, RuntimeContext.create("cpu"))
