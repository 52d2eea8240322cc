"""DLRM: raw Criteo parsing and the reference preprocessing on hand-written day files, the model,
the LR schedule, AUC, and the mini run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from tests.conftest import build_parts, epoch_view, mini_data, read_log, score
from trainperf.cli import main
from trainperf.contract import Assets, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.runtime import speedups
from trainperf.workloads.common.ranking import auc
from trainperf.workloads.dlrm import DLRM, MINI, DLRMWorkload, lr_factor
from trainperf.workloads.dlrm import data as D
from trainperf.workloads.dlrm import mini as G
from trainperf.workloads.dlrm.recipes import CRITEO_1TB_TABLE_SIZES as D_SIZES

CATS = ["0a", "", "FF", "3", "1" * 16, "b"] + ["c"] * 20  # 26 categorical fields


def _line(label: int | str, dense: list[str], cats: list[str]) -> str:
    return "\t".join([str(label), *dense, *cats]) + "\n"


def _days(tmp_path: Path) -> Path:
    """Three days: day_0 and day_1 train, day_2 (three rows) split into test (2) and val (1)."""
    dense = [str(i) for i in range(13)]
    d0 = [_line(1, dense, CATS),
          _line(0, ["-3", ""] + dense[2:], ["2625a00"] + CATS[1:])]  # 0x2625a00 = 40,000,000 -> 0
    d1 = [_line(0, dense, ["ff"] + CATS[1:])]  # lower-case ff = FF
    d2 = [_line(1, dense, ["1"] + CATS[1:]), _line(0, dense, CATS), _line(1, dense, ["2625a0a"] + CATS[1:])]
    for day, lines in enumerate((d0, d1, d2)):
        (tmp_path / f"day_{day}").write_text("".join(lines))
    return tmp_path


def test_preprocessing_gives_the_reference_binary_layout(tmp_path):
    root = _days(tmp_path)
    manifest = D.preprocess(root, 3, say=lambda s: None, workers=1)
    assert (manifest["train_samples"], manifest["test_samples"], manifest["val_samples"]) == (3, 2, 1)
    # Feature C1 takes hashed values {0x0a=10, 0 (40,000,000 mod 40M), 0xff=255, 1, 0x2625a0a mod 40M = 10}:
    # sorted {0, 1, 10, 255} -> ids 0..3. C2 is always empty -> 0 -> one id.
    counts = np.load(root / D.COUNTS)["counts"]
    assert counts[0] == 4 and counts[1] == 1 and counts.tolist() == manifest["table_sizes"]
    train = np.fromfile(D.output_file(root, "train"), dtype=np.int32).reshape(-1, 40)
    test = np.fromfile(D.output_file(root, "test"), dtype=np.int32).reshape(-1, 40)
    val = np.fromfile(D.output_file(root, "val"), dtype=np.int32).reshape(-1, 40)
    dense = list(range(13))
    # C3 "FF" -> 255 (one value) -> 0; C4 "3" -> 0; C5 16 ones mod 40M -> 0; C6 "b" -> 0; rest "c" -> 0.
    rest = [0] * 25
    expected_train = sorted([
        [1, *dense, 2, *rest],             # day_0 line 1: C1 0x0a = 10 -> id 2
        [0, 0, 0, *dense[2:], 0, *rest],   # day_0 line 2: -3 clipped, empty -> 0; C1 40M -> 0 -> id 0
        [0, *dense, 3, *rest],             # day_1: C1 ff = 255 -> id 3
    ])
    assert sorted(train.tolist()) == expected_train  # train rows are shuffled within blocks
    assert test.tolist() == [[1, *dense, 1, *rest], [0, *dense, 2, *rest]]  # first half of the last day
    assert val.tolist() == [[1, *dense, 2, *rest]]  # 0x2625a0a mod 40M = 10 -> id 2, as 0x0a
    assert not list(root.glob("*.hashed.bin")) and not list(root.glob("*.partial"))


def test_bitmap_and_sorted_value_sets_agree(tmp_path):
    """Large days switch the distinct-value tracking to a bitmap: same ids as the sorted path."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(400):
        cats = [f"{v:x}" for v in rng.integers(0, 5000, 26)]
        lines.append(_line(int(rng.integers(0, 2)), [str(v) for v in rng.integers(-2, 50, 13)], cats))
    for day in range(2):
        (tmp_path / f"day_{day}").write_text("".join(lines[day * 200:(day + 1) * 200]))
    D.preprocess(tmp_path, 2, say=lambda s: None, max_ind_range=1000, workers=1)  # 1000 // 16: bitmap soon
    raw = np.array([[int(f, 16) % 1000 for f in line.rstrip("\n").split("\t")[14:]] for line in lines])
    test = np.fromfile(D.output_file(tmp_path, "test"), dtype=np.int32).reshape(-1, 40)
    for j in range(26):
        vocab = np.unique(raw[:, j])
        assert np.array_equal(test[:, 14 + j], np.searchsorted(vocab, raw[200:300, j]))


@pytest.mark.parametrize("line, message", [
    (_line(1, ["1"] * 13, CATS[:-1]),
     "day_0:2: expected 40 tab-separated fields (label, 13 integer, 26 categorical), got 39"),
    (_line(1, ["1"] * 13, ["xyz"] + CATS[1:]), "day_0:2: categorical feature C1 is 'xyz'; expected a hexadecimal"),
    (_line(2, ["1"] * 13, CATS), "day_0:2: label is '2'; expected 0 or 1"),
    (_line(1, ["1.5"] + ["1"] * 12, CATS), "day_0:2: integer feature I1 is '1.5'; expected an integer"),
    (_line(1, ["1"] * 12 + ["99999999999"], CATS), "day_0:2: integer feature I13 is '99999999999'"),
])
def test_malformed_lines_are_rejected_with_file_and_line(tmp_path, line, message):
    (tmp_path / "day_0").write_text(_line(0, ["1"] * 13, CATS) + line + _line(0, ["1"] * 13, CATS))
    (tmp_path / "day_1").write_text(_line(0, ["1"] * 13, CATS))
    with pytest.raises(TrainperfError, match=message.replace("(", r"\(").replace(")", r"\)")):
        D.preprocess(tmp_path, 2, say=lambda s: None, workers=1)
    assert not D.output_file(tmp_path, "train").exists()


def test_missing_day_file_is_named_by_the_cli(tmp_path, capsys):
    (tmp_path / "day_0").write_text(_line(0, ["1"] * 13, CATS))
    assert main(["prepare", "dlrm", "--scale", "full", "--data", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "day_1: missing" in err and "Traceback" not in err


def test_preprocessing_resumes_after_an_interruption(tmp_path, monkeypatch):
    (tmp_path / "resumed").mkdir()
    (tmp_path / "clean").mkdir()
    root, clean = _days(tmp_path / "resumed"), _days(tmp_path / "clean")
    expected = D.preprocess(clean, 3, say=lambda s: None, workers=1)
    real = D._hash_day
    calls = []

    def flaky(data_dir, day, max_ind_range, progress=None):
        calls.append(day)
        if day == 2 and calls.count(2) == 1:
            raise KeyboardInterrupt
        return real(data_dir, day, max_ind_range, progress)

    monkeypatch.setattr(D, "_hash_day", flaky)
    with pytest.raises(KeyboardInterrupt):
        D.preprocess(root, 3, say=lambda s: None, workers=1)
    assert D.preprocessed(root) is None and not D.output_file(root, "train").exists()
    assert (root / "day_0.hashed.bin").exists() and not (root / "day_2.hashed.bin").exists()
    parsed = []
    real_iter = D.iter_day
    monkeypatch.setattr(D, "iter_day", lambda path, *args, **kwargs: parsed.append(path.name) or real_iter(path, *args,
                                                                                                            **kwargs))
    manifest = D.preprocess(root, 3, say=lambda s: None, workers=1)
    assert parsed == ["day_2"]  # days 0 and 1 were finished: not read again
    assert manifest["table_sizes"] == expected["table_sizes"]
    for split in D.SPLITS:
        a = np.fromfile(D.output_file(root, split), dtype=np.int32).reshape(-1, 40)
        b = np.fromfile(D.output_file(clean, split), dtype=np.int32).reshape(-1, 40)
        assert sorted(a.tolist()) == sorted(b.tolist())


def test_a_day_changed_after_an_interruption_is_read_again(tmp_path, monkeypatch):
    """Finished days are resumed only while their day file is the one they were read from."""
    root = _days(tmp_path)
    real = D._hash_day

    def interrupted(data_dir, day, max_ind_range, progress=None):
        if day == 2:
            raise KeyboardInterrupt
        return real(data_dir, day, max_ind_range, progress)

    monkeypatch.setattr(D, "_hash_day", interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.preprocess(root, 3, say=lambda s: None, workers=1)
    monkeypatch.setattr(D, "_hash_day", real)
    # day_0 replaced by other rows: its finished pass must not be reused.
    dense = [str(i) for i in range(13)]
    (root / "day_0").write_text(_line(1, dense, ["77"] + CATS[1:]) + _line(0, dense, ["78"] + CATS[1:]))
    clean = tmp_path / "clean"
    clean.mkdir()
    for day in range(3):
        (clean / f"day_{day}").write_bytes((root / f"day_{day}").read_bytes())
    resumed = D.preprocess(root, 3, say=lambda s: None, workers=1)
    expected = D.preprocess(clean, 3, say=lambda s: None, workers=1)
    assert resumed["table_sizes"] == expected["table_sizes"]
    for split in D.SPLITS:
        assert np.array_equal(np.fromfile(D.output_file(root, split), dtype=np.int32),
                              np.fromfile(D.output_file(clean, split), dtype=np.int32))


def test_gzip_day_files_are_read_as_downloaded(tmp_path):
    """Criteo Terabyte is downloaded as day_N.gz: read compressed, the outputs equal the plain ones."""
    import gzip

    plain, packed = tmp_path / "plain", tmp_path / "gz"
    plain.mkdir()
    packed.mkdir()
    _days(plain)
    for day in range(3):
        with gzip.open(packed / f"day_{day}.gz", "wb") as fh:
            fh.write((plain / f"day_{day}").read_bytes())
    assert D.day_file(packed, 1).name == "day_1.gz"
    a, b = D.preprocess(plain, 3, lambda s: None, workers=1), D.preprocess(packed, 3, lambda s: None, workers=1)
    assert a["table_sizes"] == b["table_sizes"]
    for split in D.SPLITS:
        assert np.array_equal(np.fromfile(D.output_file(plain, split), dtype=np.int32),
                              np.fromfile(D.output_file(packed, split), dtype=np.int32))
    (packed / "day_1.gz").unlink()
    problems = DLRMWorkload().data_problems("full", tmp_path / "nothing")
    assert "day_0: missing" in problems[0] and "day_N.gz" in problems[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_preprocessing_reports_progress_and_agrees_across_worker_counts(tmp_path, workers):
    G.generate_days(tmp_path, 4, 3000, seed=2)
    said: list[str] = []
    manifest = D.preprocess(tmp_path, 4, say=said.append, workers=workers, report_every_s=0.0)
    assert any("rows parsed so far" in line for line in said), said
    assert sum(manifest["rows_per_day"]) == 12000 and manifest["rows_per_s"] > 0
    test = np.fromfile(D.output_file(tmp_path, "test"), dtype=np.int32)
    assert test.size == 1500 * 40
    if workers == 2:  # same output as one process
        other = tmp_path / "one"
        other.mkdir()
        for day in range(4):
            (other / f"day_{day}").write_bytes((tmp_path / f"day_{day}").read_bytes())
        D.preprocess(other, 4, say=lambda s: None, workers=1)
        assert np.array_equal(np.fromfile(D.output_file(other, "test"), dtype=np.int32), test)


def test_generated_days_are_raw_criteo_lines_with_empty_fields(tmp_path):
    stats = G.generate_days(tmp_path, 2, 2000, seed=3)
    lines = (tmp_path / "day_0").read_text().splitlines()
    assert len(lines) == 2000 and all(line.count("\t") == 39 for line in lines)
    fields = [line.split("\t") for line in lines]
    assert {f[0] for f in fields} == {"0", "1"}
    assert any(f[i] == "" for f in fields for i in range(1, 14))  # empty integer features
    assert any(f[i] == "" for f in fields for i in range(14, 40))  # empty categorical features
    assert any(f[2].startswith("-") for f in fields)  # negative integers (clipped by preprocessing)
    assert all(len(f[i]) in (0, 8) for f in fields for i in range(14, 40))
    assert 0.5 < stats["teacher_auc"] < 1.0


def test_reference_model_shapes():
    model = DLRM([5] * 26, 128, (512, 256, 128), (1024, 1024, 512, 256, 1))
    assert model.top[0].in_features == 479  # 351 pairs of 27 vectors + the 128-d bottom output
    assert [m.out_features for m in model.bottom if isinstance(m, torch.nn.Linear)] == [512, 256, 128]
    assert all(t.sparse and t.mode == "sum" and t.embedding_dim == 128 for t in model.embeddings)
    out = model(torch.rand(4, 13), torch.randint(0, 5, (4, 26)))
    assert out.shape == (4,)


def test_lr_schedule_warmup_hold_and_quadratic_decay():
    recipe = DLRMWorkload().recipe("full", "rcp-55296")
    f = lr_factor(recipe)
    assert f(0) == 0.0 and f(1375) == pytest.approx(0.5) and f(2750) == 1.0 and f(49314) == 1.0
    assert f(49315 + 27772 // 2) == pytest.approx(((27772 - 27772 // 2) / 27772) ** 2)
    assert f(49315 + 27772) == pytest.approx(1e-7 / 24.0)
    assert lr_factor(DLRMWorkload().recipe("full", "reference-2048"))(123456) == 1.0


@pytest.mark.slow
def test_sharded_evaluation_agrees_with_scikit_learn():
    workload, root = DLRMWorkload(), mini_data("dlrm")
    torch.manual_seed(0)
    parts = build_parts(workload, MINI, RuntimeContext.create("cpu"), root)
    model = parts.model.eval()
    test = np.array(D.open_split(root, "test"))
    with torch.no_grad():
        dense, sparse = torch.log1p(torch.tensor(test[:, 1:14]).float()), torch.tensor(test[:, 14:]).long()
        scores = torch.sigmoid(model(dense, sparse))
    expected = roc_auc_score(test[:, 0], scores.numpy())
    gathered = {"scores": [], "labels": []}
    for rank in range(3):  # three ranks' shards, concatenated in rank order as the harness does
        ctx = RuntimeContext(device=torch.device("cpu"), rank=rank, world_size=3)
        forward = speedups.evaluate_with(parts, MINI, ctx.device)
        partial = workload.load_data(MINI, root, ctx).evaluate(forward)
        for key in gathered:
            gathered[key].append(partial.gathers[key])
    combined = {k: torch.cat(v) for k, v in gathered.items()}
    assert combined["labels"].numel() == test.shape[0]
    assert partial.metric(combined) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("n, decimals", [(7, 1), (1000, 2), (200_000, 3), (200_000, 7)])
def test_auc_agrees_with_scikit_learn(n, decimals):
    """Random probabilities, with many ties (rounded) and saturated 0/1 scores as float32 sigmoids give."""
    g = torch.Generator().manual_seed(n + decimals)
    labels = (torch.rand(n, generator=g) < 0.3).float()
    labels[:2] = torch.tensor([0.0, 1.0])
    scores = torch.sigmoid(4 * torch.randn(n, generator=g) + 2 * labels).round(decimals=decimals)
    scores[::50] = 1.0
    expected = roc_auc_score(labels.numpy(), scores.double().numpy())
    assert auc(labels, scores) == pytest.approx(expected, abs=1e-6)


def test_auc_of_a_single_class_is_an_error():
    with pytest.raises(TrainperfError, match="single class"):
        auc(torch.ones(5), torch.rand(5))


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dlrm") / "run"
    assert main(["run", "dlrm", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.to_target
@pytest.mark.slow
def test_mini_reaches_target_between_dense_baseline_and_teacher(dlrm_run):
    result = json.loads((dlrm_run / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= MINI.target
    root = DLRMWorkload().default_data_dir("mini")
    train, test = np.array(D.open_split(root, "train")), np.array(D.open_split(root, "test"))
    dense_only = LogisticRegression(max_iter=500).fit(np.log1p(train[:, 1:14]), train[:, 0])
    baseline = roc_auc_score(test[:, 0], dense_only.decision_function(np.log1p(test[:, 1:14])))
    teacher = json.loads((root / G.TEACHER).read_text())["teacher_auc"]
    assert baseline + 0.1 < MINI.target < teacher - 0.05


@pytest.mark.slow
def test_mini_log_passes_official_checker_with_fractional_epochs(dlrm_run, tmp_path):
    log = dlrm_run / "mlperf_log.txt"
    verdict = check(log)
    assert verdict.valid and verdict.ruleset == "1.0.0", verdict.output
    records = read_log(log)
    nums = [r["metadata"]["epoch_num"] for r in records if r["key"] == "eval_accuracy"]
    # 20 evaluations per epoch, logged as 1 + the fraction of the epoch (1.05, 1.10, …).
    assert nums[0] == pytest.approx(1.05, abs=0.002) and nums == sorted(nums) and len(nums) >= 5
    # Evenly spaced by steps: after round(k * steps / 20) steps of each epoch, the epoch's end the 20th.
    steps = json.loads((dlrm_run / "result.json").read_text())["train_samples"] // MINI.global_batch_size
    expected = [epoch + round(k * steps / 20) / steps for epoch in (1, 2) for k in range(1, 21)]
    assert nums == pytest.approx(expected[:len(nums)], abs=1e-6)
    keys = [r["key"] for r in records]
    assert keys.count("epoch_stop") == keys.count("epoch_start")
    assert keys.count("block_stop") == keys.count("block_start")
    closed = tmp_path / "closed.txt"
    closed.write_text(log.read_text().replace('"value": "open"', '"value": "closed"'))
    assert not check(closed).valid  # below 0.8025: the closed rules reject it


@pytest.mark.second_tier
def test_two_processes_reach_the_target_with_dense_embedding_gradients(dlrm_run, tmp_path):
    """Data parallel over 2 gloo processes (dense embedding gradients all-reduced by DDP): same
    target, and the log passes the checker."""
    out = tmp_path / "np2"
    assert main(["run", "dlrm", "--seed", "0", "--nproc", "2", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    single = json.loads((dlrm_run / "result.json").read_text())
    assert result["status"] == "success" and result["environment"]["world_size"] == 2
    # Same seed, same global batches: the first evaluations of both runs agree closely.
    assert result["evaluations"][0]["value"] == pytest.approx(single["evaluations"][0]["value"], abs=0.01)
    assert check(out / "mlperf_log.txt").valid


@pytest.mark.second_tier
def test_full_path_on_tiny_criteo_days(tmp_path):
    """The full scale end to end on 24 small day files: prepare (all 24 days), the reference model
    and recipe, evaluations inside the epoch, a valid log."""
    data = tmp_path / "criteo"
    G.generate_days(data, 24, 300, seed=5)
    assert main(["prepare", "dlrm", "--scale", "full", "--data", str(data)]) == 0
    manifest = D.preprocessed(data)
    assert manifest["train_samples"] == 23 * 300 and manifest["test_samples"] == 150
    out = tmp_path / "full"
    code = main(["run", "dlrm", "--scale", "full", "--data", str(data), "--seed", "0", "--out", str(out),
                 "--quiet", "--division", "open", "--set", "global_batch_size=256", "--set", "eval_batch_size=64"])
    assert code == 1  # one pass over 6,900 rows does not reach AUC 0.8025
    result = json.loads((out / "result.json").read_text())
    assert result["recipe"]["embedding_dim"] == 128 and result["recipe"]["top_mlp"] == [1024, 1024, 512, 256, 1]
    assert result["train_samples"] == 26 * 256 and result["eval_samples"] == 150
    epochs = [e["epoch"] for e in result["evaluations"]]
    assert len(epochs) == 20 and epochs[-1] == 1 and epochs == sorted(set(epochs))
    assert check(out / "mlperf_log.txt").valid


def test_embedding_device_cpu_needs_one_process():
    ctx = RuntimeContext(device=torch.device("cpu"), rank=0, world_size=2)
    recipe = MINI.with_overrides(["embedding_device=cpu"])
    with pytest.raises(TrainperfError, match="embedding_device=cpu: supported on a single process only"):
        build_parts(DLRMWorkload(), recipe, ctx, mini_data("dlrm"))
    with pytest.raises(TrainperfError, match="embedding_device='gpu' is not one of: device, cpu"):
        MINI.with_overrides(["embedding_device=gpu"])


@pytest.mark.gpu
def test_host_embedding_tables_with_the_mlps_on_the_gpu():
    """embedding_device=cpu: tables and their sparse gradients on the host, MLPs on the GPU, and a
    training step that changes both."""
    from trainperf.runtime.step import TrainStep

    workload, root = DLRMWorkload(), mini_data("dlrm")
    recipe = MINI.with_overrides(["embedding_device=cpu"])
    ctx = RuntimeContext.create("cuda")
    parts = build_parts(workload, recipe, ctx, root)
    assert parts.model.embeddings[0].weight.device.type == "cpu"
    assert parts.model.top[0].weight.device.type == "cuda"
    data = workload.load_data(recipe, root, ctx)
    batch = next(iter(data.train_batches(epoch_view(1, parts.model))))
    assert batch[0].device.type == "cuda" and batch[1].device.type == "cpu"
    before = [parts.model.embeddings[0].weight.clone(), parts.model.top[0].weight.clone()]
    step = TrainStep(parts, data.steps_per_epoch, recipe, ctx.device)
    for _ in range(60):  # past the LR warm-up's first steps (LR 0 at step 0)
        step(batch)
    assert not torch.equal(before[0], parts.model.embeddings[0].weight)
    assert not torch.equal(before[1], parts.model.top[0].weight)
    assert 0.0 <= score(parts, data, recipe, ctx) <= 1.0


# -- embeddings=torchrec: the tables sharded by TorchRec's planner, SGD fused into FBGEMM's backward ----
def _needs_torchrec():
    pytest.importorskip("torchrec")
    pytest.importorskip("fbgemm_gpu")


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    _needs_torchrec()
    out = tmp_path_factory.mktemp("dlrm-torchrec") / "run"
    assert main(["run", "dlrm", "--seed", "0", "--set", "embeddings=torchrec", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.to_target
@pytest.mark.slow
def test_sharded_tables_reach_the_target_and_record_their_plan(sharded_run):
    result = json.loads((sharded_run / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= MINI.target
    layout = result["layout"]
    assert layout["engine"] == "torchrec" and len(layout["tables"]) == 26
    # Every table sharded with the optimizer fused into FBGEMM's kernel (none replicated data-parallel).
    assert {(t["sharding"], t["kernel"]) for t in layout["tables"]} == {("table_wise", "fused")}
    assert check(sharded_run / "mlperf_log.txt").valid


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_with_sharded_tables_train_as_one(sharded_run, tmp_path):
    """2 gloo processes: the tables split between them (model parallel, an all-to-all of the lookups), the
    MLPs data-parallel, the same global batches: the target reached like one process's run, its
    evaluations within the mini's seed spread of it."""
    out = tmp_path / "np2"
    assert main(["run", "dlrm", "--seed", "0", "--nproc", "2", "--set", "embeddings=torchrec", "--out", str(out),
                 "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    single = json.loads((sharded_run / "result.json").read_text())
    assert result["status"] == "success" and result["environment"]["world_size"] == 2
    assert result["final_metric"] == pytest.approx(single["final_metric"], abs=0.01)
    ranks = sorted({r for t in result["layout"]["tables"] for r in t["ranks"]})
    assert ranks == [0, 1]  # both processes hold tables
    assert check(out / "mlperf_log.txt").valid


def test_the_schedule_reaches_the_fused_embedding_update_of_the_same_step():
    """FBGEMM updates the rows inside the backward with the rate its kernel was last given: each step's
    update must use that step's scheduled rate (the LR factor changes every step here)."""
    _needs_torchrec()
    from trainperf.runtime.step import TrainStep

    workload = DLRMWorkload()
    recipe = MINI.with_overrides(["embeddings=torchrec", "global_batch_size=4", "warmup_steps=4",
                                  "decay_start_step=100", "decay_steps=10"])
    ctx = RuntimeContext.create("cpu")
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets())
    try:
        table = parts.model.module.embeddings.embedding_bags["t0"].weight
        batch = workload.synthetic_batch(recipe, ctx, parts.model)
        step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx, split=workload.split_batch,
                         count=workload.batch_samples)
        factor = lr_factor(recipe)
        for k in range(3):
            rate = recipe.base_lr * factor(k)
            assert parts.optimizer.param_groups[0]["lr"] == pytest.approx(rate)
            before = table.detach().clone()
            step(batch)
            moved = (table.detach() - before).abs().max().item()
            # The warmup's first rate is 0: no row moves; then rows move at a growing rate.
            assert (moved == 0.0) == (rate == 0.0)
    finally:
        torch.distributed.destroy_process_group()


def test_sharded_evaluation_pads_every_rank_to_the_same_batches(monkeypatch):
    """With sharded tables every rank must run the same evaluation batches (collectives): shares padded
    to ceil(N / ranks), the padding's scores dropped, every sample scored once."""
    root = mini_data("dlrm")
    workload = DLRMWorkload()
    recipe = MINI.with_overrides(["embeddings=torchrec", "eval_batch_size=7000"])
    n = D.open_split(root, "test").shape[0]
    seen, kept = [], 0
    for rank in range(3):
        ctx = RuntimeContext(device=torch.device("cpu"), rank=rank, world_size=3)
        data = workload.load_data(recipe, root, ctx)
        sizes = []
        partial = data.evaluate(lambda batch, sizes=sizes: (sizes.append(batch[0].shape[0]), torch.zeros(
            batch[0].shape[0]))[1])
        seen.append(sizes)
        kept += partial.gathers["scores"].shape[0]
    assert seen[0] == seen[1] == seen[2] and sum(seen[0]) == -(-n // 3)
    assert kept == n


@pytest.mark.slow
def test_sharding_plans_of_the_full_tables_on_1_8_and_64_gpus(capsys, tmp_path):
    """`trainperf plan`, without data or devices: one 80 GB GPU keeps the largest tables in host memory
    behind a cache; 8 hold the tables whole; 64 split them by rows."""
    _needs_torchrec()
    kinds = {}
    for devices in (1, 8, 64):
        out = tmp_path / f"plan{devices}.json"
        assert main(["plan", "dlrm", "--devices", str(devices), "--memory", "80GB", "--json", str(out)]) == 0
        plan = json.loads(out.read_text())
        kinds[devices] = {(t["sharding"], t["kernel"]) for t in plan["tables"]}
        per_rank = [0] * devices
        for table in plan["tables"]:
            for rank, size in table["rank_bytes"].items():
                per_rank[int(rank)] += size
        if devices > 1:
            assert max(per_rank) <= 0.85 * 80 * 2**30  # what the planner may give tables of each device
        assert sum(per_rank) == sum(t["bytes"] for t in plan["tables"]) == 4 * 128 * sum(D_SIZES)
    assert ("table_wise", "fused_uvm_caching") in kinds[1]
    assert kinds[8] == {("table_wise", "fused")}
    assert {s for s, _k in kinds[64]} <= {"table_row_wise", "row_wise"}
    assert "fused_uvm_caching" in capsys.readouterr().out


def test_torchrec_without_torchrec_is_one_line(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torchrec", None)
    assert main(["bench", "dlrm", "--synthetic", "--set", "embeddings=torchrec", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "embeddings=torchrec: torchrec cannot be imported" in err and "pip install --no-deps torchrec" in err
    assert err.count("\n") == 1
