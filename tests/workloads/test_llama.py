"""Llama 3.1 8B (and the 405B's recipes): the model's shape, the indexed-dataset reader, the samples, the
schedule, the closed rules, and FSDP2 / tensor parallelism on two gloo processes against one process."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import launch, mean_step_losses, write_minimal_closed_log
from trainperf import registry
from trainperf.contract import FullyShard, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.runtime import distributed
from trainperf.runtime.fsdp import FSDPEngine
from trainperf.runtime.step import TrainStep
from trainperf.workloads.common.llm import indexed, synthetic
from trainperf.workloads.common.llm.model import (
    LLAMA31_8B,
    Llama,
    LlamaConfig,
    rope_frequencies,
    rotary_tables,
)
from trainperf.workloads.common.llm.workload import lr_factor
from trainperf.workloads.llama31_8b import Llama31Workload
from trainperf.workloads.llama31_8b.recipes import FULL_RECIPES, MINI
from trainperf.workloads.llama31_405b.recipes import FULL_405B, LLAMA31_405B, MLPERF_405B

TINY = LlamaConfig(layers=2, dim=32, heads=4, kv_heads=2, ffn_dim=64, vocab_size=48, rope_original_context=16)


def test_parameter_counts_are_the_references():
    # Meta's Llama 3.1 8B and 405B: 8,030,261,248 and 405,853,388,800 parameters.
    assert LLAMA31_8B.parameters() == 8_030_261_248
    assert LLAMA31_405B.parameters() == 405_853_388_800
    # MLPerf's 405B keeps the shape with the Mixtral tokenizer's vocabulary padded to 32,768 (NeMo: a multiple
    # of 128 x TP): 3,128,950,784 fewer embedding and output weights.
    assert MLPERF_405B.parameters() == 402_724_438_016
    assert LLAMA31_405B.parameters() - MLPERF_405B.parameters() == 2 * 16_384 * (128_256 - 32_768)
    with torch.device("meta"):
        big = Llama(MLPERF_405B, 8192)
    assert sum(p.numel() for p in big.parameters()) == 402_724_438_016
    with torch.device("meta"):
        model = Llama(LLAMA31_8B, 8192)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    assert LLAMA31_8B.ffn_dim == 14_336 and LLAMA31_8B.kv_heads == 8 and LLAMA31_8B.vocab_size == 128_256


def test_rope_scaling_is_llama_31s():
    base = 1.0 / (500_000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    scaled = rope_frequencies(LLAMA31_8B).double()
    wavelen = 2 * math.pi / base
    high = wavelen < 8192 / 4  # short wavelengths: kept
    low = wavelen > 8192  # long ones: divided by 8
    assert torch.allclose(scaled[high], base[high], rtol=1e-6)
    assert torch.allclose(scaled[low], base[low] / 8, rtol=1e-6)
    middle = ~high & ~low
    assert middle.any() and ((scaled[middle] < base[middle]) & (scaled[middle] > base[middle] / 8)).all()


def test_init_matches_megatron_scaled_init():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(layers=4, dim=256, heads=4, kv_heads=2, ffn_dim=512, vocab_size=512), 16)
    model.reset_parameters()
    assert model.blocks[0].attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].feed_forward.w2.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert torch.equal(model.norm.weight, torch.ones(256))


def test_the_schedule_warms_up_linearly_then_follows_the_cosine():
    recipe = FULL_RECIPES["gbs16"]
    f = lr_factor(recipe)
    assert recipe.warmup_steps == 16 and recipe.max_steps == 1_200_000
    assert f(0) == pytest.approx(1 / 17) and f(16) == pytest.approx(1.0)
    assert f(16 + (1_200_000 - 16) // 2) == pytest.approx(0.55, abs=1e-4)
    assert f(1_200_000) == pytest.approx(0.1) and f(2_000_000) == pytest.approx(0.1)
    assert {r.name: (r.base_lr, r.warmup_steps, r.grad_accum_steps) for r in FULL_RECIPES.values()} == {
        "gbs16": (4e-4, 16, 1), "gbs32": (8e-4, 128, 1), "gbs64": (8e-4, 96, 2), "gbs96": (1e-3, 171, 6),
        "gbs128": (2e-3, 256, 4)}


def test_the_405b_recipes_follow_the_reference():
    # pretrain_llama31.py: LR 8e-5 x GBS / 1152 to 8e-7, the first evaluation at 18,432 x floor(0.0026 GBS + 12)
    # samples (step 224 at GBS 1,152), then every 18,432; 5,760 sequences each; the Mixtral vocabulary.
    recipes = {r.name: (r.base_lr, r.end_lr, r.warmup_steps, r.max_steps, r.eval_first_samples)
               for r in FULL_405B.values()}
    assert recipes == {"gbs1152": (8e-5, pytest.approx(8e-7), 8000, 1_200_000, 258_048),
                       "gbs2304": (1.6e-4, pytest.approx(8e-7), 4000, 600_000, 313_344),
                       "gbs4608": (3.2e-4, pytest.approx(8e-7), 2000, 300_000, 423_936)}
    assert all(r.model == MLPERF_405B and r.eval_samples == 5_760 and r.seq_len == 8_192 for r in FULL_405B.values())
    workload = registry.get("llama31_405b")
    assert workload.benchmark == "llama31_405b" and workload.scales == ("full",)
    assert workload.mlperf.runs == 3 and workload.mlperf.full_eval_samples == 5_760
    assert workload.corpus.trains == ("c4-train.en_6_text_document", "c4-train.en_7_text_document")


def test_the_405b_is_full_scale_only_and_says_so():
    with pytest.raises(TrainperfError, match="--scale mini: llama31_405b declares no mini scale .it has --scale full"):
        registry.get("llama31_405b").recipe("mini")


@pytest.mark.parametrize("name", sorted(FULL_405B))
def test_the_405b_recipes_pass_its_closed_rules(tmp_path, name):
    recipe = FULL_405B[name]
    hyper = registry.get("llama31_405b").mlperf_hyperparameters(recipe, RuntimeContext(device=torch.device("meta")))
    log = tmp_path / "closed.txt"
    write_minimal_closed_log(log, "llama31_405b", recipe.global_batch_size,
                             {**hyper, "gradient_accumulation_steps": recipe.grad_accum_steps}, recipe.target,
                             recipe.eval_first_samples, eval_samples=recipe.eval_samples)
    verdict = check(log, "6.0.0")
    assert verdict.valid and verdict.division == "closed", verdict.output


# -- the indexed dataset -------------------------------------------------------------------------------
def _corpus(tmp_path, docs=None):
    docs = docs if docs is not None else [np.arange(i * 10, i * 10 + 5 + i) for i in range(6)]
    indexed.write(tmp_path / "c", docs, np.dtype(np.uint16))
    return tmp_path / "c", docs


def test_the_index_is_megatrons_layout(tmp_path):
    prefix, docs = _corpus(tmp_path)
    raw = (tmp_path / "c.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, count, bounds = struct.unpack_from("<QBQQ", raw, 9)
    assert (version, code, count, bounds) == (1, 8, 6, 7)
    lengths = np.frombuffer(raw, np.int32, 6, 34)
    offsets = np.frombuffer(raw, np.int64, 6, 34 + 24)
    assert lengths.tolist() == [5, 6, 7, 8, 9, 10] and offsets.tolist() == [0, 10, 22, 36, 52, 70]
    data = indexed.IndexedDataset(prefix)
    assert [data.document(i).tolist() for i in range(6)] == [d.tolist() for d in docs]
    assert data.total_tokens == 45 and indexed.token_dtype(128_256) == np.int32


def _damage(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(("what", "message"), [
    ("magic", "not a Megatron indexed-dataset index"),
    ("version", "index version 7"),
    ("dtype", "token dtype code 9"),
    ("count", "but its header"),
    ("offset", "sequence offsets do not follow"),
    ("bin", "places 90 bytes"),
    ("missing", "missing"),
])
def test_a_damaged_pair_is_refused_in_one_line_naming_the_file(tmp_path, what, message):
    prefix, _ = _corpus(tmp_path)
    idx, binary = tmp_path / "c.idx", tmp_path / "c.bin"
    if what == "magic":
        _damage(idx, 0, b"XXIDIDX")
    elif what == "version":
        _damage(idx, 9, struct.pack("<Q", 7))
    elif what == "dtype":
        _damage(idx, 17, bytes([9]))
    elif what == "count":
        _damage(idx, 18, struct.pack("<Q", 5))
    elif what == "offset":
        _damage(idx, 34 + 24 + 8, struct.pack("<q", 12))
    elif what == "bin":
        binary.write_bytes(binary.read_bytes()[:-4])
    else:
        binary.unlink()
    with pytest.raises(TrainperfError, match=message) as err:
        indexed.IndexedDataset(prefix)
    assert "\n" not in str(err.value) and str(tmp_path / "c.") in str(err.value)


def test_samples_span_documents_and_share_their_boundary_token(tmp_path):
    prefix, docs = _corpus(tmp_path)
    data = indexed.IndexedDataset(prefix)
    stream = np.concatenate(docs)
    plain = indexed.Samples(data, 4, seed=0, shuffle=False)
    assert len(plain) == plain.samples_per_epoch == 11
    for i in range(len(plain)):
        assert plain.sample(i).tolist() == stream[i * 4:i * 4 + 5].tolist()
    shuffled = indexed.Samples(data, 4, seed=5)
    first = [shuffled.sample(i).tolist() for i in range(11)]
    assert first == [indexed.Samples(data, 4, seed=5).sample(i).tolist() for i in range(11)]  # a seed: one order
    assert first != [indexed.Samples(data, 4, seed=6).sample(i).tolist() for i in range(11)]
    # More samples than one pass holds: the passes' documents shuffled together, every sample whole.
    longer = indexed.Samples(data, 4, seed=5, num_samples=40)
    assert longer.epochs == 4 and len(longer) >= 40
    assert all(longer.sample(i).size == 5 for i in range(len(longer)))
    with pytest.raises(TrainperfError, match="cannot make one sample"):
        indexed.Samples(data, 64, seed=0)


def test_a_blend_alternates_its_corpora_as_megatron_does_for_equal_weights(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = indexed.Samples(indexed.IndexedDataset(_corpus(tmp_path / "a")[0]), 4, seed=0, shuffle=False)
    b_docs = [np.arange(100 + i * 10, 105 + i * 10) for i in range(4)]  # 20 tokens: 4 samples
    indexed.write(tmp_path / "b" / "c", b_docs, np.dtype(np.uint16))
    b = indexed.Samples(indexed.IndexedDataset(tmp_path / "b" / "c"), 4, seed=0, shuffle=False)
    blend = indexed.Blend([a, b])
    assert len(blend) == 2 * min(len(a), len(b)) == 8
    assert [blend.sample(k).tolist() for k in range(4)] == [a.sample(0).tolist(), b.sample(0).tolist(),
                                                           a.sample(1).tolist(), b.sample(1).tolist()]
    assert len(indexed.Blend([a, b], size=6)) == 6
    assert len(indexed.Blend([a])) == len(a)


def test_the_mini_corpus_floor_and_baseline(tmp_path):
    table = synthetic.successors()
    docs = synthetic.generate_documents(20_000, 1, table)
    stream = np.concatenate(docs)
    assert all(d[-1] == synthetic.EOD and (d[:-1] < synthetic.CONTENT).all() for d in docs)
    floor = synthetic.floor(stream, table)
    # Below the open rules' 1.0 nats (the division a mini logs), far below the unigram baseline.
    assert 0.6 < floor < 0.85
    assert synthetic.unigram_baseline(stream, stream) > 3.0


# -- FSDP2 and tensor parallelism on two processes -------------------------------------------------------
def _batch() -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (4, 17), generator=torch.Generator().manual_seed(7))


def _losses(tp: int, fsdp: bool, steps: int = 20, meta_init: bool = False, sets: tuple[str, ...] = ()
            ) -> list[float]:
    """20 AdamW steps of a tiny Llama on one global batch of 4 sequences: with FSDP each process trains on
    its rows, with tensor parallelism both on all of them; the global mean loss of each step."""
    ctx = distributed.init_from_env("cpu") if fsdp else RuntimeContext(device=torch.device("cpu"))
    try:
        workload = Llama31Workload()
        recipe = MINI.with_overrides(["model.layers=2", "model.dim=32", "model.heads=4", "model.kv_heads=2",
                                      "model.ffn_dim=64", "model.vocab_size=48", "seq_len=16", "global_batch_size=4",
                                      "max_grad_norm=1.0", f"tp={tp}", f"meta_init={meta_init}", *sets])
        torch.manual_seed(0)
        parts = workload.build(recipe, ctx, {})
        assert all(p.is_meta for p in parts.model.parameters()) == meta_init
        parts = FSDPEngine().apply(FullyShard(tp=tp), parts, recipe, ctx)
        model = parts.model
        assert not any(t.is_meta for t in (*model.parameters(), *model.buffers()))
        cos, _ = rotary_tables(recipe.model, recipe.seq_len)
        assert torch.equal(model.rope_cos, cos)
        step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx)
        batch = _batch()
        if fsdp and tp == 1:
            per = 4 // ctx.world_size
            batch = batch[ctx.rank * per:(ctx.rank + 1) * per]
        return mean_step_losses(step, batch, steps, ctx)
    finally:
        if fsdp:
            distributed.shutdown()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp2", "tp2"])
def test_two_processes_train_as_one(tp):
    alone = _losses(1, fsdp=False)
    both = launch(_losses, tp, True)
    assert alone[-1] < alone[0] - 0.3  # it learns
    for rank in (0, 1):
        # float32 sums in another order (reduce-scatter, sharded matrix products): 20 steps stay within 1e-4.
        assert both[rank] == pytest.approx(alone, rel=1e-4, abs=1e-4), (rank, both[rank], alone)


@pytest.mark.second_tier
def test_a_model_built_on_the_meta_device_is_initialised_after_sharding():
    # From the same random state, init_weights after to_empty draws the weights reset_parameters draws.
    with torch.device("meta"):
        late = Llama(TINY, 16)
    late.to_empty(device="cpu")
    torch.manual_seed(3)
    late.init_weights()
    whole = Llama(TINY, 16)
    torch.manual_seed(3)
    whole.reset_parameters()
    assert all(torch.equal(a, b) for a, b in zip(late.state_dict().values(), whole.state_dict().values(), strict=True))
    assert torch.equal(late.rope_sin, whole.rope_sin)
    losses = _losses(1, fsdp=False, steps=20, meta_init=True)
    assert losses[-1] < losses[0] - 0.3
    # Two processes, each initialising its own shards (on a CPU mesh both draw the same numbers, so the
    # weights differ from one process's): the buffers are computed again, and it learns.
    for losses in launch(_losses, 1, True, 20, True).values():
        assert losses[-1] < losses[0] - 0.3


def test_cuda_graphs_record_each_block_and_mark_every_step(monkeypatch):
    # --cuda-graphs under FSDP: each block compiled for CUDA graph trees ("reduce-overhead"), FSDP's hooks
    # left outside the compiled forward (fully_shard wraps the compiled block), and every step marked as a new
    # iteration. The compiler is replaced by a recorder here (on a CPU torch skips the graphs anyway; the
    # `compile`-marked test below trains through the real one).
    compiled, marks = [], []

    def record(module, **options):
        compiled.append(options)
        return module

    monkeypatch.setattr(torch, "compile", record)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    recipe = MINI.with_overrides(["model.layers=2", "model.dim=32", "model.heads=4", "model.kv_heads=2",
                                  "model.ffn_dim=64", "model.vocab_size=48", "seq_len=16", "global_batch_size=4",
                                  "cuda_graphs=true"])
    ctx = RuntimeContext(device=torch.device("cpu"))
    FSDPEngine().check(FullyShard(), recipe, ctx)
    with pytest.raises(TrainperfError, match="cuda_graphs with tensor parallelism tp=2: .* use tp=1"):
        FSDPEngine().check(FullyShard(tp=2), recipe, RuntimeContext(device=torch.device("cpu"), world_size=2))
    parts = FSDPEngine().apply(FullyShard(), Llama31Workload().build(recipe, ctx, {}), recipe, ctx)
    assert compiled == [{"mode": "reduce-overhead"}] * 2  # the two blocks
    assert parts.layout["graphed_blocks"] and "replayed as CUDA graphs" in parts.layout["summary"][0]
    step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx)
    for _ in range(3):
        step(_batch())
    assert len(marks) == 3
    # The graphed backward's buffers are not held as gradients past the step.
    assert all(p.grad is None for p in parts.model.parameters())
    eager = FSDPEngine().apply(FullyShard(), Llama31Workload().build(MINI, ctx, {}), MINI, ctx)
    assert not eager.layout["graphed_blocks"] and len(compiled) == 2


@pytest.mark.slow
@pytest.mark.compile
def test_two_processes_with_graphed_blocks_train_as_eager():
    # The real compiler, in mode "reduce-overhead", under FSDP2 on two processes: the blocks' compiled forward
    # and backward (torch records no CUDA graph on a CPU) with FSDP's gathers between them give eager's losses.
    eager = _losses(1, fsdp=False, steps=6)
    for rank, losses in launch(_losses, 1, True, 6, False, ("cuda_graphs=true",)).items():
        assert losses == pytest.approx(eager, rel=1e-4, abs=1e-4), (rank, losses, eager)


def test_a_mesh_that_does_not_divide_the_processes_is_refused():
    recipe = MINI.with_overrides(["tp=2"])
    with pytest.raises(TrainperfError, match="the 3 processes are not a multiple"):
        FSDPEngine().check(FullyShard(tp=2), recipe, RuntimeContext(device=torch.device("cpu"), world_size=3))


# -- whole runs -------------------------------------------------------------------------------------------
def _first_eval(out) -> tuple[float, int]:
    from tests.conftest import read_log

    records = read_log(out / "mlperf_log.txt")
    first = next(r for r in records if r["key"] == "eval_accuracy")
    return first["value"], first["metadata"]["samples_count"]


@pytest.mark.second_tier
def test_a_tensor_parallel_run_reads_one_shard_per_group_and_equals_one_process(tmp_path):
    # tp=2 over 2 processes: one data shard (both read every row), each block split between them. Its first
    # evaluation (1,024 samples: 64 AdamW steps) equals a single process's, and counts its samples once.
    from trainperf.cli import main

    budget = ["--set", "max_samples=1024", "--seed", "3", "--quiet"]
    assert main(["run", "llama31_8b", "--out", str(tmp_path / "one"), *budget]) in (0, 1)
    tp_run = ["run", "llama31_8b", "--nproc", "2", "--set", "tp=2", "--out", str(tmp_path / "tp"), *budget]
    assert main(tp_run) in (0, 1)
    alone, tp = _first_eval(tmp_path / "one"), _first_eval(tmp_path / "tp")
    assert tp[1] == alone[1] == 1024
    assert tp[0] == pytest.approx(alone[0], rel=2e-3)


@pytest.mark.second_tier
def test_fsdp2_on_two_processes_reaches_the_mini_target_with_a_log_that_passes(tmp_path):
    import json

    from trainperf.cli import main

    out = tmp_path / "fsdp"
    assert main(["run", "llama31_8b", "--nproc", "2", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "success" and result["environment"]["world_size"] == 2
    assert result["layout"]["engine"] == "fsdp" and result["layout"]["mesh"] == {"dp": 2, "tp": 1}
    verdict = check(out / "mlperf_log.txt", None)
    assert verdict.valid and verdict.division == "open", verdict.output


def test_the_full_scale_reads_the_references_files(tmp_path, capsys):
    # The reference's two pairs, int32 token ids as its preprocessing writes them for Llama 3.1's vocabulary,
    # at a toy size: prepare checks them, a run at the full scale trains and evaluates from them.
    from tests.conftest import read_log
    from trainperf.cli import main

    rng = np.random.default_rng(0)
    for name, docs in (("c4-train.en_6_text_document", 60), ("c4-validation-91205-samples.en_text_document", 12)):
        indexed.write(tmp_path / name, [rng.integers(0, 500, int(n)) for n in rng.integers(5, 60, docs)],
                      indexed.token_dtype(128_256))
    assert main(["prepare", "llama31_8b", "--scale", "full", "--data", str(tmp_path)]) == 0
    assert "int32" in capsys.readouterr().out
    small = ["model.layers=1", "model.dim=64", "model.heads=4", "model.kv_heads=2", "model.ffn_dim=128",
             "model.vocab_size=512", "seq_len=32", "global_batch_size=4", "eval_samples=8", "eval_batch_size=4",
             "eval_every_samples=16", "max_samples=32", "num_workers=1", "precision=fp32", "fused_optimizer=false"]
    out = tmp_path / "run"
    code = main(["run", "llama31_8b", "--scale", "full", "--data", str(tmp_path), "--out", str(out), "--quiet",
                 *[x for s in small for x in ("--set", s)]])
    assert code == 1  # random tokens: the budget ends it, as a valid log says
    records = read_log(out / "mlperf_log.txt")
    evals = [(r["metadata"]["samples_count"], r["value"]) for r in records if r["key"] == "eval_accuracy"]
    assert [s for s, _ in evals] == [16, 32] and all(5.0 < v < 7.5 for _, v in evals)  # ~ln(512) = 6.2
    assert next(r["value"] for r in records if r["key"] == "eval_samples") == 8
    stop = next(r for r in records if r["key"] == "run_stop")
    assert stop["metadata"]["status"] == "aborted"


def test_the_405b_full_scale_blends_its_two_training_files(tmp_path, capsys):
    # The 405B reference's three pairs, uint16 ids (the Mixtral vocabulary fits), at a toy size: prepare names
    # the missing file, then checks them; a full-scale run builds on the meta device, trains on both files.
    from tests.conftest import read_log
    from trainperf.cli import main

    rng = np.random.default_rng(1)
    names = {"c4-train.en_6_text_document": 40, "c4-train.en_7_text_document": 40,
             "c4-validation-91205-samples.en_text_document": 12}
    for name, docs in names.items():
        if name != "c4-train.en_7_text_document":
            indexed.write(tmp_path / name, [rng.integers(0, 500, int(n)) for n in rng.integers(5, 60, docs)],
                          indexed.token_dtype(32_768))
    assert main(["prepare", "llama31_405b", "--scale", "full", "--data", str(tmp_path)]) == 2
    assert "c4-train.en_7_text_document.bin/idx: missing" in capsys.readouterr().err
    indexed.write(tmp_path / "c4-train.en_7_text_document",
                  [rng.integers(0, 500, int(n)) for n in rng.integers(5, 60, 40)], indexed.token_dtype(32_768))
    assert main(["prepare", "llama31_405b", "--scale", "full", "--data", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("uint16") == 3
    small = ["model.layers=1", "model.dim=64", "model.heads=4", "model.kv_heads=2", "model.ffn_dim=128",
             "model.vocab_size=512", "seq_len=32", "global_batch_size=4", "grad_accum_steps=1", "eval_samples=8",
             "eval_batch_size=4", "eval_every_samples=16", "eval_first_samples=16", "max_samples=32",
             "num_workers=1", "precision=fp32", "fused_optimizer=false", "tp=1", "initial_checkpoint=",
             # the reference's sample counts at a toy size: 64 steps' training samples, the evaluated validation ones
             "max_steps=64", "warmup_steps=2", "eval_dataset=evaluated"]
    out = tmp_path / "run"
    code = main(["run", "llama31_405b", "--scale", "full", "--data", str(tmp_path), "--out", str(out), "--quiet",
                 *[x for s in small for x in ("--set", s)]])
    assert code == 1  # random tokens: the budget ends it, as a valid log says
    records = read_log(out / "mlperf_log.txt")
    assert next(r["value"] for r in records if r["key"] == "submission_benchmark") == "llama31_405b"
    evals = [(r["metadata"]["samples_count"], r["value"]) for r in records if r["key"] == "eval_accuracy"]
    assert [s for s, _ in evals] == [16, 32] and all(5.0 < v < 7.5 for _, v in evals)


@pytest.mark.slow
def test_bench_counts_flops_as_torchtitan_and_megatron_do():
    from trainperf.bench.throughput import describe, run_bench

    workload = registry.get("llama31_8b")
    recipe = workload.recipe("full").with_overrides(list(workload.step_probe))
    result = run_bench(workload, recipe, "full", None, True, steps=1, warmup=1, device="cpu")
    config = recipe.model
    per_token = 6 * (config.parameters() - config.vocab_size * config.dim) + 12 * config.layers * config.dim * 256
    assert result.formula_flops_per_sample == per_token * 256
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 256)
    # torch's counter sees the same products; on a CPU it has no formula for the CPU flash-attention kernel
    # (on a GPU it counts the attention's whole square: 84.1 against 81.9 TFLOP a sequence on the H200).
    products = 6 * (config.parameters() - config.vocab_size * config.dim) * 256
    assert result.flops_per_sample == pytest.approx(products, rel=0.01)
    assert "counted as published" in describe(result)


def test_float_tokens_and_a_huge_index_are_one_line_before_anything_is_read(tmp_path, monkeypatch, capsys):
    """Issue 60, 10: NaN/inf float tokens made `prepare --verify` a traceback, and a 40 GB .idx was read
    whole before its header was checked."""
    from trainperf.cli import main

    rng = np.random.default_rng(0)
    valid = "c4-validation-91205-samples.en_text_document"
    indexed.write(tmp_path / "c4-train.en_6_text_document", [rng.integers(0, 500, 20) for _ in range(8)],
                  np.dtype(np.int32))
    indexed.write(tmp_path / valid, [np.array([1.0, float("nan"), float("inf")], np.float32)], np.dtype(np.float32))
    assert main(["prepare", "llama31_8b", "--scale", "full", "--data", str(tmp_path), "--verify"]) == 2
    out, err = capsys.readouterr()
    assert f"{valid}.idx: token dtype float32, expected integers" in out and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    # A header naming one sequence in a file of 40 GB (sparse): refused from the header and the size alone.
    huge = tmp_path / "huge.idx"
    with huge.open("wb") as fh:
        fh.write(indexed.MAGIC + struct.pack("<QBQQ", 1, 4, 1, 2))
        fh.truncate(40 << 30)
    (tmp_path / "huge.bin").write_bytes(b"\0" * 8)
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole") if self == huge
                        else real_read_bytes(self))
    with pytest.raises(TrainperfError, match=r"huge.idx: 42,949,672,960 bytes, but its header \(1 sequences, 2 "
                                             r"document boundaries\) needs 62"):
        indexed.IndexedDataset(tmp_path / "huge")


def test_token_ids_past_the_vocabulary_stop_a_run_in_one_line(tmp_path, capsys):
    """Issue 60, 10: a token id past the model's vocabulary was an IndexError traceback inside the step (a
    device-side assert on a GPU), reported through the DataLoader worker's 21-line traceback."""
    from tests.conftest import read_log
    from trainperf.cli import main

    rng = np.random.default_rng(0)
    train = [rng.integers(0, 500, int(n)) for n in rng.integers(5, 60, 60)]
    for doc in train[::4]:  # past model.vocab_size=512, in enough documents that whatever the run's seed, an
        doc[2] = 9_999  # epoch's sequences (all but the last one or two) hold one
    indexed.write(tmp_path / "c4-train.en_6_text_document", train, indexed.token_dtype(128_256))
    indexed.write(tmp_path / "c4-validation-91205-samples.en_text_document",
                  [rng.integers(0, 500, int(n)) for n in rng.integers(5, 60, 12)], indexed.token_dtype(128_256))
    small = ["model.layers=1", "model.dim=64", "model.heads=4", "model.kv_heads=2", "model.ffn_dim=128",
             "model.vocab_size=512", "seq_len=32", "global_batch_size=4", "eval_samples=8", "eval_batch_size=4",
             "eval_every_samples=16", "max_samples=64", "num_workers=1", "precision=fp32", "fused_optimizer=false"]
    out = tmp_path / "run"
    code = main(["run", "llama31_8b", "--scale", "full", "--data", str(tmp_path), "--out", str(out), "--quiet",
                 *[x for s in small for x in ("--set", s)]])
    assert code == 1
    reason = json.loads((out / "result.json").read_text())["abort_reason"]
    assert reason == ("c4-train.en_6_text_document.bin: token id 9,999 outside the model's vocabulary of 512 "
                      "(`trainperf prepare --scale full --verify` checks every token)".join([str(tmp_path) + "/", ""]))
    stop = next(r for r in read_log(out / "mlperf_log.txt") if r["key"] == "run_stop")
    assert stop["metadata"]["status"] == "aborted" and "\n" not in stop["metadata"].get("reason", "")
    assert "Traceback" not in capsys.readouterr().err


def test_the_full_recipes_evaluate_whole_global_batches_and_log_the_rules_count():
    """The references evaluate ceil(eval_tokens / GBS) global batches (8B: pretrain_llama31.py's eval_batches from
    1,024; 405B: from 5,760) and log eval_samples as 1,024 / 5,760; the mini evaluates its eval_samples."""
    from trainperf.workloads.llama31_8b.recipes import FULL_RECIPES, MINI
    from trainperf.workloads.llama31_405b.recipes import FULL_405B

    assert {n: r.evaluated_samples for n, r in FULL_RECIPES.items()} == {
        "gbs16": 1024, "gbs32": 1024, "gbs64": 1024, "gbs96": 1056, "gbs128": 1024}
    assert {n: r.evaluated_samples for n, r in FULL_405B.items()} == {
        "gbs1152": 5760, "gbs2304": 6912, "gbs4608": 9216}
    assert all(r.eval_samples == 5760 for r in FULL_405B.values())
    assert MINI.evaluated_samples == MINI.eval_samples
