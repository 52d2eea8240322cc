"""dlrmv4: the trainer's Yambda store read as the reference reads it (a sample equal to a line-by-line
re-statement of its `_build_sample`), the crossed ids equal to xxhash's, damaged stores refused in one line,
the closed rules' evaluation grid, the model's shape and its independence from padding."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")
xxhash = pytest.importorskip("xxhash")

from trainperf.errors import TrainperfError  # noqa: E402
from trainperf.workloads.dlrmv4 import data, recipes, synthetic  # noqa: E402

SMALL = (("user_x_artist", ("uid", "artist_id"), 5000, 0), ("item_x_hour", ("item_id", "hour_of_day"), 300, 3),
         ("user_x_artist_x_hour", ("uid", "artist_id", "hour_of_day"), 7000, 0))


def _reference_hash(values: list[int], rows: int, salt: int) -> int:
    digest = xxhash.xxh64(seed=salt)
    digest.update(struct.Struct(f"<{len(values)}q").pack(*values))
    return digest.intdigest() % rows


def test_the_vectorised_cross_hash_equals_xxhash():
    rng = np.random.default_rng(0)
    columns = [rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64), rng.integers(0, 10**7, 500),
               rng.integers(0, 24, 500)]
    for keys, rows, salt in ((2, 100_000_000, 0), (3, 40_000_000, 5), (2, 7, 2**40)):
        got = data.cross_hashes(columns[:keys], rows, salt)
        want = [_reference_hash([int(c[i]) for c in columns[:keys]], rows, salt) for i in range(500)]
        assert got.tolist() == want


def small_events(seed: int = 0, users: int = 6) -> dict[str, np.ndarray]:
    """Users of 20-60 events (listens, likes, dislikes; items past the mappings' 40) in the store's columns."""
    rng = np.random.default_rng(seed)
    uid, items, ts, kinds, ratio = [], [], [], [], []
    for user in range(users):
        n = int(rng.integers(20, 60))
        uid.append(np.full(n, user * 3 + 1))  # uids with gaps, as Yambda's
        items.append(rng.integers(0, 45, n))  # 40 mapped items: some beyond
        ts.append(1_700_000_000 + np.cumsum(rng.integers(100, 20_000, n)))
        kinds.append(rng.choice([0, 0, 0, 0, 1, 2], n))
        ratio.append(rng.uniform(0, 100, n))
    uid, items, ts, kinds = (np.concatenate(a).astype(np.int64) for a in (uid, items, ts, kinds))
    ratio = np.concatenate(ratio).astype(np.float32)
    ratio[kinds != 0] = 0.0
    listen = kinds == 0
    columns = {"flat_uid": uid, "flat_item_ids": items, "flat_timestamps": ts, "flat_event_types": kinds,
               "flat_played_ratio": ratio, "flat_is_organic": rng.integers(0, 2, len(uid)).astype(np.int8),
               "flat_is_listen_plus": listen & (ratio >= 50), "flat_is_like": kinds == 1,
               "flat_is_skip": listen & (ratio < 50)}
    return columns


def _write_store(folder: Path, seed: int = 0, users: int = 6, history: int = 9) -> dict[str, np.ndarray]:
    """A small store in the trainer's layout, anchors as the reference's builder selects them."""
    columns = small_events(seed, users)
    mapped = np.arange(40)
    synthetic.write_store(folder, columns, history, mapped // 4 + 1, mapped // 2 + 7)
    return columns


def _reference_sample(columns: dict, store: data.Store, index: int, budget: int) -> dict:
    """The reference's DLRMv4YambdaDataset._build_sample (interleaved strategy), re-stated an anchor at a time."""
    pos = int(store.anchors[index])
    uid = int(columns["flat_uid"][pos])
    first = max(int(store.user_start[uid]), pos - store.scan_window)
    window = range(first, pos)
    pools = [[i for i in window if columns[key][i]][-store.per_pool:]
             for key in ("flat_is_listen_plus", "flat_is_like", "flat_is_skip")]
    keep = sorted(pools[0] + pools[1] + pools[2])[-budget:]
    item_to_artist = {i: i // 4 + 1 for i in range(40)}
    item_to_album = {i: i // 2 + 7 for i in range(40)}
    target = int(columns["flat_item_ids"][pos])
    ts = int(columns["flat_timestamps"][pos])
    anchor = {"uid": uid, "item_id": target, "artist_id": item_to_artist.get(target, 0),
              "album_id": item_to_album.get(target, 0), "hour_of_day": (ts // 3600) % 24,
              "is_organic": int(columns["flat_is_organic"][pos])}
    times = [int(columns["flat_timestamps"][i]) for i in keep]
    crossed = [_reference_hash([anchor[k] for k in keys], rows, salt) for _, keys, rows, salt in SMALL]
    return {"context": [uid, *crossed],
            "items": [int(columns["flat_item_ids"][i]) for i in keep],
            # the reference clips history ids into the mapping (the last item's artist for ids past it)
            "artists": [item_to_artist[min(int(columns["flat_item_ids"][i]), 39)] for i in keep],
            "albums": [item_to_album[min(int(columns["flat_item_ids"][i]), 39)] for i in keep],
            "actions": [1 * bool(columns["flat_is_listen_plus"][i]) + 2 * bool(columns["flat_is_like"][i])
                        + 4 * bool(columns["flat_is_skip"][i]) for i in keep],
            "times": times, "candidate": [target, anchor["artist_id"], anchor["album_id"]],
            "query_time": times[-1] if times else ts,
            "label": float(columns["flat_event_types"][pos] == 0 and columns["flat_played_ratio"][pos] >= 50)}


@pytest.mark.parametrize("scan_window,max_seq_len", [(20_000, 32), (12, 32), (20_000, 12)])
def test_a_batch_equals_the_references_samples(tmp_path, scan_window, max_seq_len):
    columns = _write_store(tmp_path)
    store = data.Store(tmp_path, 9, scan_window, max_seq_len=max_seq_len, cross_specs=SMALL)
    budget = max_seq_len - 1 - (1 + len(SMALL))
    indices = np.arange(len(store.anchors))[::-1]  # any order
    batch = store.batch(indices)
    offsets = np.r_[0, np.cumsum(batch.lengths.numpy())]
    for row, index in enumerate(indices):
        want = _reference_sample(columns, store, int(index), budget)
        part = slice(offsets[row], offsets[row + 1])
        assert batch.context[row].tolist() == want["context"]
        for name in ("items", "artists", "albums", "actions", "times"):
            assert getattr(batch, name)[part].tolist() == want[name], (name, index)
        assert batch.candidates[row].tolist() == want["candidate"]
        assert int(batch.query_time[row]) == want["query_time"]
        assert float(batch.labels[row]) == want["label"]


def test_windows_are_days_from_the_first_anchor(tmp_path):
    _write_store(tmp_path)
    store = data.Store(tmp_path, 9, cross_specs=SMALL)
    counts = store.window_counts()
    days = (np.asarray(store.anchor_ts) - store.anchor_ts.min()) // 86_400
    assert counts.tolist() == np.bincount(days).tolist()
    for w in range(len(counts)):
        assert store.window(w).tolist() == np.flatnonzero(days == w).tolist()  # user-major, as the reference


@pytest.mark.parametrize("damage,expected", [
    (lambda f: (data.cache_dir(f, 9) / "_READY").unlink(), "_READY: missing"),
    (lambda f: np.save(data.cache_dir(f, 9) / "flat_item_ids.npy", np.zeros(3, np.int32)), "flat_item_ids.npy: int32"),
    (lambda f: np.save(data.cache_dir(f, 9) / "flat_uid.npy", np.zeros(3, np.int64)), "flat_uid.npy: 3 events"),
    (lambda f: (data.cache_dir(f, 9) / "store_meta.json").write_text("{"), "store_meta.json: expected JSON"),
    (lambda f: (data.cache_dir(f, 9) / "positions_L9.npy").write_bytes(b"\x93NUMPY garbage"), "not a readable .npy"),
    (lambda f: np.save(data.popularity_file(f), np.zeros(39, np.int64)), "item_popularity.npy: 39 items"),
    (lambda f: data.mapping_files(f)[0].write_bytes(b"PAR1 not parquet"), "artist_item_mapping.parquet: not a parquet"),
    (lambda f: [np.save(data.cache_dir(f, 9) / n, np.array([10**9])) for n in ("positions_L9.npy", "anchor_ts_L9.npy")],
     "positions outside"),
    (lambda f: np.save(data.cache_dir(f, 9) / "anchor_ts_L9.npy", np.zeros(2, np.int64)), "2 times for"),
])
def test_a_damaged_store_is_refused_in_one_line(tmp_path, damage, expected):
    _write_store(tmp_path)
    damage(tmp_path)
    with pytest.raises(TrainperfError) as err:
        data.Store(tmp_path, 9, cross_specs=SMALL)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_full_recipes_evaluate_on_the_closed_rules_grid():
    # closed_dlrmv4.yaml (6.1.0): eval_interval_samples = max(1, ceil(0.001 * train_samples / GBS)) * GBS and
    # first_eval_samples = ceil(floor((4480 * GBS + 135331840) / 3) / interval) * interval.
    expected = {8192: (280, 57_344_000), 16_384: (140, 71_106_560), 32_768: (70, 94_044_160)}
    for gbs, (steps, first) in expected.items():
        recipe = recipes.FULL_RECIPES[f"gbs{gbs}"]
        assert recipe.eval_every_samples == steps * gbs and recipe.eval_first_samples == first
        assert recipe.base_lr == recipe.sparse_lr == 1e-6 * gbs / 8192
    assert recipes.eval_interval(data.TRAIN_SAMPLES, 4096) == 560 * 4096  # where round() would give 559
    assert math.isclose(recipes.first_eval(4096, 560 * 4096), 52_756_480)


def test_the_full_model_has_the_references_tables():
    from trainperf.workloads.dlrmv4.model import HSTU

    r = recipes.FULL_RECIPES["gbs8192"]
    with torch.device("meta"):
        model = HSTU(r.id_tables, [(n, rows) for n, _, rows, _ in r.cross_specs], r.embedding_dim, r.model_dim,
                     r.layers, r.heads, r.qk_dim, r.linear_dim, r.hidden_dim, r.item_hidden, r.input_dropout,
                     r.linear_dropout, r.action_dim, r.max_seq_len, r.position_buckets, r.time_buckets,
                     torch.device("meta"))
    tables = sum(p.numel() for n, p in model.named_parameters() if n.startswith("tables."))
    assert tables == 293_051_712 * 512  # the 11 tables of configs.py, 512 wide
    block = model.blocks[0]
    assert tuple(block.uvqk.shape) == (512, 2048) and tuple(block.output.shape) == (1536, 512)
    assert tuple(model.position.shape) == (8192, 512) and tuple(model.time.shape) == (2049, 512)


def _mini_model(seed: int = 0):
    from trainperf.workloads.dlrmv4.model import HSTU

    r = recipes.MINI
    torch.manual_seed(seed)
    model = HSTU(r.id_tables, [(n, rows) for n, _, rows, _ in r.cross_specs], r.embedding_dim, r.model_dim,
                 r.layers, r.heads, r.qk_dim, r.linear_dim, r.hidden_dim, r.item_hidden, r.input_dropout,
                 r.linear_dropout, r.action_dim, r.max_seq_len, r.position_buckets, r.time_buckets,
                 torch.device("cpu"))
    # TorchRec's collection is built on the meta device for the runtime to shard: give it rows here.
    model.tables.to_empty(device="cpu")
    for p in model.tables.parameters():
        torch.nn.init.uniform_(p, -0.1, 0.1)
    return model.eval()


def test_a_samples_logit_does_not_depend_on_the_others_in_its_batch(tmp_path):
    """Padding, other samples' histories and their order change nothing but the divisor the reference takes
    from the batch's longest sequence: with that longest kept, each logit is the same."""
    _write_store(tmp_path)
    r = recipes.MINI
    store = data.Store(tmp_path, 9, r.scan_window, max_seq_len=r.max_seq_len, cross_specs=r.cross_specs)
    model = _mini_model()
    n = len(store.anchors)
    longest = int(np.argmax(store.batch(np.arange(n)).lengths.numpy()))
    rows = np.arange(n)
    with torch.no_grad():
        whole = model(store.batch(rows))
        for pick in (rows[::-1], np.array([longest, 0, 3]), np.array([longest, n - 1])):
            expected = whole[torch.from_numpy(pick.copy())]
            torch.testing.assert_close(model(store.batch(pick)), expected, rtol=1e-5, atol=1e-5)


def test_the_mini_is_generated_in_the_trainers_layout(tmp_path):
    # Small enough for the gate: the generator's own layout with fewer users and days.
    saved = synthetic.USERS, synthetic.DAYS
    synthetic.USERS, synthetic.DAYS = 40, 4
    try:
        synthetic.GeneratedYambda().prepare(tmp_path, lambda line: None)
    finally:
        synthetic.USERS, synthetic.DAYS = saved
    assert synthetic.GeneratedYambda().problems(tmp_path) == []
    store = data.Store(tmp_path, synthetic.HISTORY, cross_specs=recipes.MINI.cross_specs)
    assert len(store.window_counts()) == 4
    truth = json.loads((tmp_path / synthetic.TRUTH).read_text())
    assert 0.5 < truth["popularity_auc"] < truth["hidden_model_auc"] <= 1.0
    shutil.rmtree(tmp_path / data.PROCESSED / f"hstu_cache_L{synthetic.HISTORY}")
    with pytest.raises(TrainperfError, match="partial event store"):
        (tmp_path / data.PROCESSED / "stray").mkdir()
        synthetic.GeneratedYambda().prepare(tmp_path, lambda line: None)


def test_a_batch_splits_into_micro_batches_with_their_histories(tmp_path):
    _write_store(tmp_path)
    store = data.Store(tmp_path, 9, cross_specs=SMALL)
    rows = np.arange(len(store.anchors))
    whole = store.batch(rows)
    parts = whole.split(3)
    assert len(parts) == 3
    for got, pick in zip(parts, np.array_split(rows, 3), strict=True):
        want = store.batch(pick)
        for name, value in vars(want).items():
            assert torch.equal(getattr(got, name), value), name
    assert whole.split(1) == [whole]


def test_the_full_scale_trains_on_a_store_in_the_references_layout(tmp_path):
    """Three users of 4,150 events in the full recipe's own folder (hstu_cache_L4086: anchors after 4,086
    events), the tables capped at 1,000 rows and the sequence cut to 64 (the reference's truncation of the
    history to the budget): prepare, a full-scale run, evaluations on the evaluation day."""
    from tests.conftest import read_log
    from trainperf.cli import main

    rng = np.random.default_rng(0)
    n = 4150
    uid = np.repeat(np.arange(3), n)
    ts = np.concatenate([1_700_000_000 + np.cumsum(rng.integers(100, 2_000, n)) for _ in range(3)])
    kinds = rng.choice([0, 0, 0, 1], 3 * n)
    ratio = np.where(kinds == 0, rng.uniform(0, 100, 3 * n), 0).astype(np.float32)
    columns = {"flat_uid": uid, "flat_item_ids": rng.integers(0, 40, 3 * n), "flat_timestamps": ts.astype(np.int64),
               "flat_event_types": kinds.astype(np.int64), "flat_played_ratio": ratio,
               "flat_is_organic": rng.integers(0, 2, 3 * n).astype(np.int8),
               "flat_is_listen_plus": (kinds == 0) & (ratio >= 50), "flat_is_like": kinds == 1,
               "flat_is_skip": (kinds == 0) & (ratio < 50)}
    anchors = synthetic.write_store(tmp_path, columns, data.HISTORY_LENGTH, np.arange(40) // 4, np.arange(40) // 2)
    days = (ts[anchors] - ts[anchors].min()) // 86_400
    assert main(["prepare", "dlrmv4", "--scale", "full", "--data", str(tmp_path)]) == 0
    out = tmp_path / "run"
    last = int(days.max())
    sets = ["global_batch_size=8", "eval_batch_size=16", "max_rows=1000", "embedding_dim=16", "model_dim=16",
            "heads=2", "qk_dim=8", "linear_dim=8", "hidden_dim=16", "item_hidden=16", "max_seq_len=64",
            "position_buckets=64", "precision=fp32", f"train_windows={last}", f"eval_window={last}",
            "rules_grid=false", "eval_every_samples=16", "eval_first_samples=16", "target=0.999"]
    args = ["run", "dlrmv4", "--scale", "full", "--data", str(tmp_path), "--out", str(out), "--quiet", "--seed", "0"]
    assert main([*args, *[x for s in sets for x in ("--set", s)]]) == 1  # 0.999 is out of reach: aborted
    records = read_log(out / "mlperf_log.txt")
    assert next(r["value"] for r in records if r["key"] == "eval_samples") == int((days == last).sum())
    assert next(r["value"] for r in records if r["key"] == "train_samples") == int((days < last).sum())
    assert len([r for r in records if r["key"] == "eval_accuracy"]) >= 2
    assert json.loads((out / "result.json").read_text())["layout"]["engine"] == "torchrec"


@pytest.mark.second_tier
def test_two_processes_with_sharded_sequence_tables_reach_the_mini_target(tmp_path):
    """TorchRec's EmbeddingCollection sharded over two gloo processes (row-wise: each holds half of every
    table), each process every other anchor of a global batch, to the mini's target."""
    from trainperf.cli import main

    out = tmp_path / "two"
    assert main(["run", "dlrmv4", "--nproc", "2", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "success" and result["layout"]["world_size"] == 2
    assert {len(t["ranks"]) for t in result["layout"]["tables"]} == {2}


def test_the_mfu_yardstick_is_the_references():
    from trainperf import registry

    flops, tokens, _ = registry.get("dlrmv4").formula_flops(recipes.FULL_RECIPES["gbs8192"])
    # README §4: 315.7 GFLOP a sample (attention 180.4, projections in 77.3, out 58.0 over the 3 layers).
    assert tokens == 4096 and round(flops / 1e9, 1) == 315.7


def test_the_recipes_are_the_rcps():
    """Each reference convergence point of rcps_dlrmv4.json (6.1.0) is a recipe with its batch, rate and warmup."""
    import mlperf_logging

    rcps = json.loads((Path(mlperf_logging.__file__).parent / "rcp_checker" / "training_6.1.0"
                       / "rcps_dlrmv4.json").read_text())
    found = {(p["BS"], p["Hyperparams"]["opt_base_learning_rate"], p["Hyperparams"]["opt_learning_rate_warmup_steps"])
             for p in rcps.values()}
    assert found == {(r.global_batch_size, r.base_lr, r.warmup_steps) for r in recipes.FULL_RECIPES.values()}
    for r in recipes.FULL_RECIPES.values():
        assert (r.sparse_lr, r.precision, r.max_grad_norm, r.target, r.max_samples) == (r.base_lr, "bf16", 1.0, 0.75,
                                                                                        data.TRAIN_SAMPLES)
    with pytest.raises(TrainperfError, match="grad_accum_steps"):
        recipes.MINI.with_overrides(["grad_accum_steps=2"])


def test_a_full_recipe_at_another_batch_keeps_the_rules_grid():
    recipe = recipes.FULL_RECIPES["gbs8192"].with_overrides(["global_batch_size=12288"])
    assert (recipe.eval_every_samples, recipe.eval_first_samples) == (187 * 12_288, 64_339_968)
    tuned, _ = recipes.FULL_RECIPES["gbs8192"].for_batch(4096)
    assert (tuned.eval_every_samples, tuned.eval_first_samples) == (560 * 4096, 52_756_480)
    assert tuned.base_lr == tuned.sparse_lr == 5e-7 and tuned.warmup_steps == 24_000
    assert recipes.MINI.eval_every_samples == 32 * 128  # the mini's own grid
    with pytest.raises(TrainperfError, match="warmup_start_lr"):
        recipes.MINI.with_overrides(["warmup_start_lr=1e-4", "sparse_lr=0.05"])
