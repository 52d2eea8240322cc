"""BERT: the TFRecord reader against a reference writer, packed against plain batches, MLM accuracy over
real masked positions only, the v1.0 sample cadence, the reference schedule, checkpoint layouts, a
step without host syncs, the closed rules, bad input, RCP scoring in samples and the mini end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import cut_short_run, read_log, write_minimal_closed_log
from trainperf.cli import main
from trainperf.contract import Assets, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.bert import FULL_RECIPES, MINI, BertWorkload
from trainperf.workloads.bert import batches as B
from trainperf.workloads.bert import data as D
from trainperf.workloads.bert import model as M
from trainperf.workloads.bert import records as R
from trainperf.workloads.bert.recipes import eval_interval

CPU = torch.device("cpu")
SMALL = M.BertConfig(vocab_size=97, hidden=32, layers=2, heads=4, intermediate=64, max_positions=64, dropout=0.0)


def _rows(n: int = 12, seq: int = 64, preds: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    return B.random_rows(n, seq, preds, SMALL.vocab_size, np.random.default_rng(seed), min_fill=0.15)


# ---------------------------------------------------------------------------------------------
# TFRecords
# ---------------------------------------------------------------------------------------------
def _reference_records(path: Path, rows: dict[str, np.ndarray]) -> None:
    """The rows written by the `tfrecord` package's writer (protobuf's Example, crc32c's CRCs), as
    the reference's create_pretraining_data lays the features out."""
    writer_mod = pytest.importorskip("tfrecord.writer")
    writer = writer_mod.TFRecordWriter(str(path))
    for i in range(len(rows["input_ids"])):
        weights = (rows["masked_lm_positions"][i] > 0).astype(np.float32)
        writer.write({key: (np.asarray(rows[key][i]).reshape(-1).tolist(), "int") for key in B.KEYS}
                     | {"masked_lm_weights": (weights.tolist(), "float")})
    writer.close()


def test_tfrecord_reader_round_trips_reference_writer_records(tmp_path):
    rows = _rows(n=7)
    _reference_records(tmp_path / "part-00000-of-00500", rows)
    got = D.tfrecord_to_rows(tmp_path / "part-00000-of-00500")
    for key in B.KEYS:
        assert np.array_equal(got[key], np.asarray(rows[key]).reshape(got[key].shape)), key
    # Negative and 64-bit values decode as protobuf encodes int64.
    values = np.array([0, 1, 127, 128, 2**40, -1, -(2**63)], dtype=np.int64)
    writer_mod = pytest.importorskip("tfrecord.writer")
    w = writer_mod.TFRecordWriter(str(tmp_path / "ints"))
    w.write({"v": (values.tolist(), "int"), "f": ([0.5, -2.25], "float"), "b": ([b"x", b""], "byte")})
    w.close()
    (example,) = list(R.read_examples(tmp_path / "ints"))
    assert example["v"].tolist() == values.tolist()
    assert example["f"].tolist() == [0.5, -2.25] and example["b"] == [b"x", b""]


def test_tfrecord_with_a_bad_crc_is_rejected_by_name(tmp_path):
    rows = _rows(n=3)
    path = tmp_path / "part-00001-of-00500"
    _reference_records(path, rows)
    raw = bytearray(path.read_bytes())
    first = 12 + int.from_bytes(raw[:8], "little") + 4  # the second record starts here
    damaged = bytearray(raw)
    damaged[first + 12 + 20] ^= 0x01  # a payload byte of record 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(TrainperfError, match=r"part-00001-of-00500: record 1: bad data CRC"):
        D.tfrecord_to_rows(path)
    damaged = bytearray(raw)
    damaged[3] ^= 0x10  # the length of record 0
    path.write_bytes(bytes(damaged))
    with pytest.raises(TrainperfError, match=r"record 0: bad length CRC"):
        list(R.read_records(path))
    path.write_bytes(bytes(raw[:-3]))
    with pytest.raises(TrainperfError, match=r"record 2: truncated"):
        list(R.read_records(path))


def test_full_prepare_converts_tfrecords_and_reads_them_back(tmp_path):
    train, evaluation = _rows(n=10, seed=1), _rows(n=4, seed=2)
    (tmp_path / D.TFRECORD).mkdir()
    _reference_records(tmp_path / D.TFRECORD / "part-00000-of-00500", train)
    _reference_records(tmp_path / D.TFRECORD / "eval_10k", evaluation)
    D.prepare_full(tmp_path, lambda line: None)
    got = D.read_shard(tmp_path / D.TRAIN / "part-00000-of-00500.hdf5")
    assert np.array_equal(got["input_ids"], train["input_ids"])
    assert np.array_equal(D.read_eval(tmp_path)["masked_lm_ids"], evaluation["masked_lm_ids"])


# ---------------------------------------------------------------------------------------------
# packing, losses, accuracy
# ---------------------------------------------------------------------------------------------
def test_packed_and_plain_batches_give_the_same_per_sequence_losses():
    torch.manual_seed(0)
    model = M.BertForPreTraining(SMALL).eval()
    rows = _rows(n=12)
    plain, packed = B.plain(rows, CPU), B.packed(rows, CPU, max_per_row=3)
    assert len(packed.sequences) < len(plain.sequences)  # it did pack
    assert packed.samples == plain.samples == 12
    with torch.no_grad():
        mlm_a, nsp_a = M.losses(model(plain.tensors), plain.tensors)
        mlm_b, nsp_b = M.losses(model(packed.tensors), packed.tensors)
    preds = rows["masked_lm_positions"].shape[1]
    layout = B.pack_rows(B.real_lengths(rows), rows["input_ids"].shape[1], 3)
    for r, members in enumerate(layout):
        for k, i in enumerate(members):
            assert torch.allclose(mlm_b[r, k * preds:(k + 1) * preds].sum(), mlm_a[i].sum(), atol=1e-4)
            assert torch.allclose(nsp_b[r, k], nsp_a[i, 0], atol=1e-5)
    with torch.no_grad():
        loss_a = M.pretraining_loss(model(plain.tensors), plain.tensors)
        loss_b = M.pretraining_loss(model(packed.tensors), packed.tensors)
    assert torch.allclose(loss_a, loss_b, atol=1e-5)


def test_packing_reduces_padding_and_splits_by_rows():
    rows = _rows(n=64, seed=3)
    lengths = B.real_lengths(rows)
    packed = B.packed(rows, CPU, max_per_row=3)
    before = B.padding_fraction(lengths, 64, 64)
    after = B.padding_fraction(lengths, len(packed.sequences), 64)
    assert after < before
    parts = packed.split(4)
    assert sum(p.samples for p in parts) == 64
    assert sum(len(p.sequences) for p in parts) == len(packed.sequences)


def test_mlm_accuracy_counts_only_real_masked_positions():
    labels = torch.tensor([[5, 7, M.IGNORE, M.IGNORE]])
    logits = torch.zeros(1, 4, 10)
    logits[0, 0, 5] = 1  # correct
    logits[0, 1, 3] = 1  # wrong
    logits[0, 2, 0] = 1  # a padding slot "predicting" [PAD] at token 0: not counted
    assert M.mlm_correct(logits, labels).tolist() == [1.0, 2.0]
    # Through the batch builder: padding slots of masked_lm_positions (0) get IGNORE labels.
    rows = _rows(n=5)
    batch = B.plain(rows, CPU)
    valid = int((rows["masked_lm_positions"] > 0).sum())
    assert int((batch.tensors["masked_lm_ids"] != M.IGNORE).sum()) == valid


# ---------------------------------------------------------------------------------------------
# recipes, cadence, schedule
# ---------------------------------------------------------------------------------------------
def test_eval_cadence_is_the_v1_formula():
    assert [eval_interval(g) for g in (256, 1536, 4096, 8192, 16384)] == [150_000, 150_000, 175_000, 225_000,
                                                                         325_000]
    for gbs, every in ((256, 150_000), (4096, 175_000), (8192, 225_000)):
        cadence = FULL_RECIPES[f"gbs{gbs}"].cadence
        points = cadence.sample_evals()
        assert [next(points) for _ in range(3)] == [every, 2 * every, 3 * every]
        assert cadence.by_samples and FULL_RECIPES[f"gbs{gbs}"].log_epoch_num == "samples"


def test_recipes_are_the_rcp_points():
    """Every full recipe's hyperparameters are those of the official RCP file at its batch size."""
    import mlperf_logging

    rcps = json.loads((Path(mlperf_logging.__file__).parent / "rcp_checker" / "training_2.0.0"
                       / "rcps_bert.json").read_text())
    by_bs = {r["BS"]: r["Hyperparams"] for r in rcps.values()}
    ctx = RuntimeContext.create("cpu")
    for recipe in FULL_RECIPES.values():
        logged = BertWorkload().mlperf_hyperparameters(recipe, ctx)
        for key, value in by_bs[recipe.global_batch_size].items():
            if key != "gradient_accumulation_steps":
                assert logged[key] == pytest.approx(value), (recipe.name, key)


def test_reference_lr_schedule():
    f = M.lr_factor(1.0, warmup=287, start_warmup=-76, total=600)
    assert f(0) == pytest.approx(76 / 287)  # the warmup began 76 steps before the first update
    assert f(210) == pytest.approx(286 / 287)
    assert f(211) == pytest.approx(1 - 211 / 600)  # then the polynomial decay (power 1) to 0 at 600
    assert f(600) == 0.0 and f(10_000) == 0.0
    g = M.lr_factor(1.0, warmup=0, start_warmup=0, total=100)
    assert g(0) == 1.0 and g(50) == pytest.approx(0.5)


def test_the_closed_rules_refuse_a_log_without_start_warmup_step(tmp_path):
    """Every full recipe passing the closed rules is the conformance test's; this is BERT's own key."""
    recipe = next(iter(FULL_RECIPES.values()))
    hyper = BertWorkload().mlperf_hyperparameters(recipe, RuntimeContext.create("cpu"))
    log = tmp_path / "log.txt"
    del hyper["start_warmup_step"]
    write_minimal_closed_log(log, "bert", 256, hyper, 0.7205, 2_500_000)
    assert not check(log, "1.0.0").valid


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def _hf_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights named as NVIDIA's converted checkpoint: DDP prefix, TF LayerNorm names, the
    tied decoder weight present, wrapped in {"model": …}."""
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        out[f"module.{key}"] = value
    out["module.cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    return {"model": out}


def test_checkpoint_layouts_load_and_mismatches_are_named(tmp_path):
    torch.manual_seed(0)
    source = M.BertForPreTraining(SMALL)
    path = tmp_path / "phase1.pt"
    torch.save(_hf_layout(source.state_dict()), path)
    target = M.BertForPreTraining(SMALL)
    state = Assets({"ckpt": path}).state_dict("ckpt")
    M.load_checkpoint(target, state, str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    wrong = M.BertForPreTraining(dataclasses.replace(SMALL, intermediate=48))
    with pytest.raises(TrainperfError, match=r"phase1\.pt: bert\.encoder\.layer\.0\.intermediate\.dense\.weight "
                                             r"has shape \(64, 32\), this BERT needs \(48, 32\)"):
        M.load_checkpoint(wrong, state, str(path))
    del state["model"]["module.bert.pooler.dense.bias"]
    with pytest.raises(TrainperfError, match=r"missing bert\.pooler\.dense\.bias"):
        M.load_checkpoint(target, state, str(path))


def _full_tree(tmp_path: Path, cfg: M.BertConfig = SMALL) -> Path:
    root = tmp_path / "full"
    D.write_shard(root / D.TRAIN / "part-0.hdf5", _rows(n=16, seed=4))
    D.write_shard(root / D.TRAIN / "part-1.hdf5", _rows(n=16, seed=5))
    D.write_shard(root / D.EVAL / "eval.hdf5", _rows(n=8, seed=6))
    (root / "phase1").mkdir()
    torch.save(M.BertForPreTraining(cfg).state_dict(), root / D.FULL_CHECKPOINT)
    return root


SMALL_SETS = ["--set", "hidden=32", "--set", "layers=2", "--set", "heads=4", "--set", "intermediate=64",
              "--set", "global_batch_size=8", "--set", "eval_every_samples=16", "--set", "max_samples=32",
              "--set", "eval_batch_size=4"]


def test_bad_input_is_one_line(tmp_path, capsys):
    import h5py

    root = _full_tree(tmp_path)
    # A shard without one of its datasets, and one whose datasets disagree in length.
    bad = root / D.TRAIN / "part-2.hdf5"
    with h5py.File(bad, "w") as f:
        for key in B.KEYS[:-1]:
            f.create_dataset(key, data=_rows(n=4)[key])
    with pytest.raises(TrainperfError, match=r"part-2\.hdf5: missing dataset 'next_sentence_labels'"):
        D.training_shards(root)
    with h5py.File(bad, "w") as f:
        rows = _rows(n=4)
        for key in B.KEYS:
            f.create_dataset(key, data=rows[key][:3] if key == "masked_lm_ids" else rows[key])
    with pytest.raises(TrainperfError, match=r"part-2\.hdf5: dataset 'masked_lm_ids' has 3 rows, input_ids has 4"):
        D.training_shards(root)
    bad.unlink()
    # A checkpoint of other sizes than the recipe's, and a vocabulary of another model.
    code = main(["run", "bert", "--scale", "full", "--data", str(root), "--recipe", "gbs256", "--quiet",
                 "--out", str(tmp_path / "r1"), "--device", "cpu"])
    said = capsys.readouterr()
    # An error during initialisation still leaves a valid log (run_stop aborted); the reason is one line.
    assert code != 0 and "model.ckpt-28252.pt: the checkpoint's hidden is 32, the recipe's 1024" in said.out
    assert "Traceback" not in said.out + said.err
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    code = main(["run", "bert", "--scale", "full", "--data", str(root), "--recipe", "gbs256", "--quiet",
                 "--out", str(tmp_path / "r2"), "--device", "cpu", *SMALL_SETS])
    said = capsys.readouterr()
    assert code != 0 and "vocab.txt: 6 words, the checkpoint's embeddings have 97 rows" in said.out
    assert "Traceback" not in said.out + said.err


def test_full_path_runs_end_to_end_on_a_tiny_tree(tmp_path):
    """The full code path (shards, eval set, a converted checkpoint, the sample cadence, packing) on
    tiny files: the log passes the closed 1.0.0 rules' structure and counts epoch_num in samples."""
    root = _full_tree(tmp_path)
    out = tmp_path / "run"
    code = main(["run", "bert", "--scale", "full", "--data", str(root), "--recipe", "gbs256", "--quiet",
                 "--out", str(out), "--device", "cpu", "--seed", "3", "--packing", "--division", "open", *SMALL_SETS])
    assert code in (0, 1)
    events = read_log(out / "mlperf_log.txt")
    evals = [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"]
    assert evals == [16, 32]
    assert [e["value"] for e in events if e["key"] == "train_samples"] == [32]
    assert not any(e["key"] == "epoch_start" for e in events)
    assert check(out / "mlperf_log.txt", "1.0.0").valid


# ---------------------------------------------------------------------------------------------
# the step: no host-device synchronisation
# ---------------------------------------------------------------------------------------------
def test_training_step_reads_nothing_back_from_the_device(monkeypatch):
    """On CPU a sync cannot be observed, so the Python calls that force one on a GPU are counted
    instead (item, tolist, bool/int/float of a tensor, .cpu(), .numpy()): none in a step, with
    gradient accumulation, clipping, the LR schedule and (both forms of) LAMB."""
    from trainperf.runtime.step import TrainStep

    workload = BertWorkload()
    for fused in (False, True):
        recipe = dataclasses.replace(FULL_RECIPES["gbs8192"], global_batch_size=8,
                                     model=M.BertConfig(hidden=32, layers=2, heads=4, intermediate=64, vocab_size=97),
                                     grad_accum_steps=2, checkpoint="none", fused_optimizer=fused,
                                     max_seq_length=64, max_predictions=8)
        ctx = RuntimeContext.create("cpu")
        parts = workload.build(recipe, ctx, Assets({}))
        step = TrainStep(parts, None, recipe, CPU, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
        batch = workload.synthetic_batch(recipe, ctx, parts.model)
        step(batch)  # optimizer state created
        calls = []
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
            original = getattr(torch.Tensor, name)

            def spy(self, *args, _name=name, _original=original, _calls=calls, **kwargs):
                _calls.append(_name)
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, spy)
        for _ in range(2):
            step(batch)
        monkeypatch.undo()
        assert calls == [], f"host syncs in the step (fused={fused}): {calls}"


@pytest.mark.gpu
def test_training_step_has_no_sync_on_a_gpu():
    """On a GPU, CUDA's own sync detector: any synchronising call in the step raises."""
    from trainperf.runtime.step import TrainStep

    workload = BertWorkload()
    recipe = dataclasses.replace(FULL_RECIPES["gbs8192"], global_batch_size=8,
                                 model=M.BertConfig(hidden=64, layers=2, heads=4, intermediate=128, vocab_size=97),
                                 grad_accum_steps=2, checkpoint="none", fused_optimizer=True, packing=True,
                                 max_seq_length=64, max_predictions=8)
    ctx = RuntimeContext.create("cuda")
    parts = workload.build(recipe, ctx, Assets({}))
    step = TrainStep(parts, None, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    step(batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------
# scoring: RCP in samples
# ---------------------------------------------------------------------------------------------
def test_score_reads_bert_convergence_in_samples(tmp_path):
    """NVIDIA's published v1.0 BERT logs carry the pass number, not samples, in eval_accuracy's
    epoch_num; the RCP checker reads BERT's train_samples instead (its bert mode), and so does score."""
    from trainperf.results.scoring import score_folder

    folder = tmp_path / "NVIDIA" / "results" / "dgxa100" / "bert"
    folder.mkdir(parents=True)
    recipe = FULL_RECIPES["gbs256"]
    hyper = BertWorkload().mlperf_hyperparameters(recipe, RuntimeContext.create("cpu"))
    for i, samples in enumerate((2_600_000, 2_650_000, 2_700_000, 2_550_000, 2_750_000, 2_600_000, 2_700_000,
                                 2_650_000, 2_600_000, 2_700_000)):
        write_minimal_closed_log(folder / f"result_{i}.txt", "bert", 256, hyper, 0.7201, 1, train_samples=samples)
    result = score_folder(folder)
    assert result.rcp.startswith("pass"), result.rcp


# ---------------------------------------------------------------------------------------------
# the mini
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mini_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bert-mini")
    D.prepare_mini(root, lambda line: None)
    return root


@pytest.mark.slow
def test_mini_is_the_reference_format_from_the_shipped_vocabulary(mini_root):
    assert D.MiniCorpus().problems(mini_root) == []
    listed = D.training_shards(mini_root)
    assert len(listed) == D.MINI_TRAIN_SHARDS and {s.seq_len for s in listed} == {D.MINI.max_seq_length}
    assert sum(s.rows for s in D.eval_shards(mini_root)) == D.MINI_EVAL_SEQUENCES
    rows = D.read_shard(listed[0].path)
    vocab = (D.PACKAGE / "vocab.txt").read_text().splitlines()
    first = rows["input_ids"][0]
    assert vocab[first[0]] == "[CLS]" and vocab[first[B.real_lengths(rows)[0] - 1]] == "[SEP]"
    positions = rows["masked_lm_positions"]
    valid = positions > 0
    assert valid.sum(axis=1).max() <= D.MINI.max_predictions
    tokens = np.take_along_axis(rows["input_ids"], positions, axis=1)[valid]
    # The reference's masking: 80 % [MASK], 10 % a random token, 10 % unchanged.
    assert 0.77 < np.mean([vocab[t] == "[MASK]" for t in tokens]) < 0.83
    assert 0.08 < np.mean(tokens == rows["masked_lm_ids"][valid]) < 0.13
    # The held-out documents never appear in training text.
    train_text = "".join(p.read_text() for p in sorted((mini_root / D.TEXT).glob("part-*")))
    held = (mini_root / D.TEXT / "eval.txt").read_text().split("\n\n")[0].splitlines()[0]
    assert held not in train_text


def test_shipped_checkpoint_is_verified(tmp_path):
    from trainperf.workloads.bert import verify_mini_checkpoint

    verify_mini_checkpoint(D.PACKAGE / "phase1.pt", D.PACKAGE / "vocab.txt")
    manifest = json.loads((D.PACKAGE / "phase1.json").read_text())
    assert manifest["vocab_size"] == len((D.PACKAGE / "vocab.txt").read_text().splitlines())
    assert 0 < manifest["mlm_accuracy_phase2_eval"] < MINI.target


@pytest.mark.second_tier
def test_mini_runs_end_to_end_and_log_passes_ruleset_100(tmp_path):
    """Two evaluations' worth of samples (the target itself: README, 10 seeds), on the mini data trainperf
    generates (a folder made by the generator alone has no record of it, and a mini refuses it)."""
    out = tmp_path / "run"
    budget = 2 * MINI.eval_every_samples
    result = cut_short_run(["bert", "--seed", "1", "--set", f"max_samples={budget}"], out, "1.0.0")
    evals = [e for e in read_log(out / "mlperf_log.txt") if e["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in evals] == [MINI.eval_every_samples * (i + 1) for i in range(2)]
    assert 0.0 < result["evaluations"][-1]["value"] < MINI.target


@pytest.mark.second_tier
def test_make_phase1_writes_a_checkpoint_its_manifest_vouches_for(tmp_path):
    assert main(["make-phase1", "--steps", "2", "--out", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "phase1.json").read_text())
    assert manifest["checkpoint_sha256"] == D.sha256(tmp_path / "phase1.pt")
    assert manifest["vocab_sha256"] == D.sha256(tmp_path / "vocab.txt") and manifest["steps"] == 2
    state = torch.load(tmp_path / "phase1.pt", weights_only=True)
    assert state["bert.embeddings.word_embeddings.weight"].shape == (manifest["vocab_size"], MINI.model.hidden)


def test_tfrecords_with_valid_crcs_but_wrong_content_are_one_line(tmp_path):
    """A CRC vouches for bytes, not for what they mean: a length past the end of the file, a feature of
    another type or range, masked_lm_weights not matching the positions are named before a shard is written."""
    import struct

    path = tmp_path / "part-00002-of-00500"
    for length in (2**40, 2**64 - 1):
        raw = struct.pack("<Q", length)
        path.write_bytes(raw + struct.pack("<I", R.masked_crc(raw)) + b"\0" * 64)
        with pytest.raises(TrainperfError, match=rf"record 0: truncated \(length {length:,} bytes"):
            D.tfrecord_to_rows(path)
    writer_mod = pytest.importorskip("tfrecord.writer")
    rows = _rows(n=2)
    for change, message in [
        ({"input_ids": ([b"x"] * 64, "byte")}, "feature 'input_ids' is a bytes_list, expected an int64_list"),
        ({"input_ids": ([0.5] * 64, "float")}, "feature 'input_ids' is a float_list, expected an int64_list"),
        ({"segment_ids": ([7] * 64, "int")}, "feature 'segment_ids' holds 7, expected values from 0 to 1"),
        ({"next_sentence_labels": ([0, 1], "int")}, "feature 'next_sentence_labels' holds 2 values, expected 1"),
        ({"masked_lm_weights": ([b"x"] * 8, "byte")}, "feature 'masked_lm_weights' is a bytes_list"),
        ({"masked_lm_weights": ([1.0], "float")}, "feature 'masked_lm_weights' holds 1 values, masked_lm_positions 8"),
    ]:
        writer = writer_mod.TFRecordWriter(str(path))
        for i in range(2):
            features = {key: (np.asarray(rows[key][i]).reshape(-1).tolist(), "int") for key in B.KEYS}
            features["masked_lm_weights"] = ((rows["masked_lm_positions"][i] > 0).astype(float).tolist(), "float")
            writer.write(features | change)
        writer.close()
        with pytest.raises(TrainperfError, match=r"record 0: " + message.replace("(", r"\(")) as err:
            D.tfrecord_to_rows(path)
        assert "\n" not in str(err.value)


def test_an_evaluation_shard_of_no_rows_is_refused_before_a_run(tmp_path):
    from trainperf import jobs

    root = _full_tree(tmp_path)
    D.write_shard(root / D.EVAL / "eval.hdf5", {key: value[:0] for key, value in _rows(n=4).items()})
    problems = jobs.data_problems(BertWorkload(), "full", root)
    assert problems and "eval: the evaluation set is empty (MLPerf's holds 10,000)" in problems[0]
