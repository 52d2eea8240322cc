"""Llama 2 70B LoRA: the shape and adapter counts, the adapters on the shared Llama, and the Hugging Face
checkpoint reader (its row permutation, the fused q|k|v, and every damaged folder refused in one line)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from tests.conftest import launch, mean_step_losses
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm import hf
from trainperf.workloads.common.llm.model import Llama, LlamaConfig, next_token_loss
from trainperf.workloads.llama2_70b_lora.lora import LowRank, adapter_parameters, add_adapters
from trainperf.workloads.llama2_70b_lora.model import LLAMA2_70B

TINY = LlamaConfig(layers=2, dim=32, heads=4, kv_heads=2, ffn_dim=64, vocab_size=48, rope_theta=10_000.0,
                   rope_factor=0.0, rope_original_context=16)


def test_the_shape_and_the_adapters_are_the_references():
    # Llama 2 70B: 68,976,648,192 parameters; LoRA rank 16 on the fused q|k|v (8,192 -> 10,240) and o.
    assert LLAMA2_70B.parameters() == 68_976_648_192
    assert (LLAMA2_70B.layers, LLAMA2_70B.dim, LLAMA2_70B.heads, LLAMA2_70B.kv_heads, LLAMA2_70B.ffn_dim,
            LLAMA2_70B.vocab_size, LLAMA2_70B.rope_theta, LLAMA2_70B.rope_factor) == (
        80, 8192, 64, 8, 28_672, 32_000, 10_000.0, 0.0)
    assert adapter_parameters(80, 8192, 10_240, 16) == 44_564_480
    with torch.device("meta"):
        model = Llama(LLAMA2_70B, 8192)
    trained = add_adapters(model, 16, 32, 0.1)
    assert sum(p.numel() for p in trained) == 44_564_480
    assert not any(p.requires_grad for name, p in model.named_parameters() if "adapter" not in name)


def test_adapters_start_as_the_base_and_only_they_learn():
    torch.manual_seed(0)
    model = Llama(TINY, 16)
    model.reset_parameters()
    batch = torch.randint(0, TINY.vocab_size, (2, 17))
    base = next_token_loss(model, batch).item()
    trained = add_adapters(model, 4, 8, 0.0)
    assert next_token_loss(model, batch).item() == pytest.approx(base, abs=1e-6)  # B starts at zero
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    for _ in range(30):
        loss = next_token_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < base - 0.3
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    adapter = model.blocks[0].attention.qkv_adapter
    assert isinstance(adapter, LowRank) and adapter.scale == 2.0


def _rotate_half_attention_scores(q_weight, k_weight, x, heads, kv_heads, head_dim, theta=10_000.0):
    """Hugging Face's rotary (halves rotated) over its permuted weights: q.k scores of every position pair."""
    seq = x.shape[0]
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rope(t):
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], -1)
        return t * cos[:, None, :] + rotated * sin[:, None, :]

    q = rope((x @ q_weight.T).view(seq, heads, head_dim))
    k = rope((x @ k_weight.T).view(seq, kv_heads, head_dim)).repeat_interleave(heads // kv_heads, 1)
    return torch.einsum("shd,thd->hst", q, k)


def test_hugging_face_row_order_gives_the_same_attention(tmp_path):
    # A checkpoint written by trainperf (Hugging Face's order) and read back is the model; and Hugging Face's
    # half-rotating rotary over its permuted rows gives the scores this Llama's interleaved one gives.
    torch.manual_seed(1)
    model = Llama(TINY, 16).double()
    model.reset_parameters()
    hf.write(model, TINY, tmp_path, dtype=torch.float32)
    checkpoint = hf.Checkpoint(tmp_path)
    assert checkpoint.config == TINY
    back = Llama(TINY, 16)
    checkpoint.load_into(back)
    for (name, a), b in zip(model.named_parameters(), back.parameters(), strict=True):
        assert torch.allclose(a.float(), b), name
    from safetensors.torch import load_file

    tensors = {k: v.double() for k, v in load_file(str(tmp_path / hf.SINGLE)).items()}
    x = torch.randn(16, TINY.dim, dtype=torch.float64)
    theirs = _rotate_half_attention_scores(tensors["model.layers.0.self_attn.q_proj.weight"],
                                           tensors["model.layers.0.self_attn.k_proj.weight"], x, 4, 2, 8)
    attention = model.blocks[0].attention
    from trainperf.workloads.common.llm.model import apply_rotary, rotary_tables

    cos, sin = rotary_tables(TINY, 16)
    q = apply_rotary((x @ attention.wq.weight.T).view(1, 16, 4, 8), cos.double(), sin.double())[0]
    k = apply_rotary((x @ attention.wk.weight.T).view(1, 16, 2, 8), cos.double(), sin.double())[0]
    ours = torch.einsum("shd,thd->hst", q, k.repeat_interleave(2, 1))
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_fused_qkv_checkpoint_is_split_into_q_k_and_v(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(2)
    model = Llama(TINY, 16)
    model.reset_parameters()
    hf.write(model, TINY, tmp_path, dtype=torch.float32)
    tensors = load_file(str(tmp_path / hf.SINGLE))
    for i in range(TINY.layers):
        prefix = f"model.layers.{i}.self_attn."
        tensors[prefix + "qkv_proj.weight"] = torch.cat([tensors.pop(prefix + f"{p}_proj.weight") for p in "qkv"])
    save_file(tensors, str(tmp_path / hf.SINGLE))
    back = Llama(TINY, 16)
    hf.Checkpoint(tmp_path).load_into(back)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), back.parameters(), strict=True))


@pytest.mark.parametrize("damage, message", [
    ("drop", "no tensor model.layers.1.mlp.up_proj.weight"),
    ("misplaced", "no tensor model.layers.1.mlp.up_proj.weight, which"),
    ("outside", "maps to '../model.safetensors', expected a shard's file name in this folder"),
    ("scaling", "rope_scaling of type 'linear'"),
    ("shape", "has shape [64, 31], the config says [64, 32]"),
    ("dtype", "is I32, expected BF16, F16 or F32"),
    ("config", "config.json: not a Llama config.json"),
    ("shard", "missing (the shard"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(3)
    model = Llama(TINY, 16)
    hf.write(model, TINY, tmp_path, dtype=torch.float32)
    tensors = load_file(str(tmp_path / hf.SINGLE))
    name = "model.layers.1.mlp.up_proj.weight"
    if damage == "drop":
        del tensors[name]
    elif damage == "shape":
        tensors[name] = tensors[name][:, :31].contiguous()
    elif damage == "dtype":
        tensors[name] = tensors[name].to(torch.int32)
    save_file(tensors, str(tmp_path / hf.SINGLE))
    if damage == "config":
        (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    if damage == "scaling":
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "linear", "factor": 2}}))
    if damage in ("misplaced", "outside"):
        other = {n: ("../model.safetensors" if damage == "outside" else "model.safetensors") for n in tensors}
        if damage == "misplaced":
            del tensors[name]
            save_file(tensors, str(tmp_path / hf.SINGLE))
            other[name] = "model.safetensors"
        (tmp_path / hf.INDEX).write_text(json.dumps({"weight_map": other}))
    if damage == "shard":
        (tmp_path / hf.INDEX).write_text(json.dumps({"weight_map": {n: "model-00002-of-00002.safetensors"
                                                                    for n in tensors}}))
    with pytest.raises(TrainperfError, match=re.escape(message)) as caught:
        hf.Checkpoint(tmp_path).load_into(Llama(TINY, 16))
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)


def test_the_recipes_follow_the_reference_and_the_rules():
    from trainperf.workloads.llama2_70b_lora.recipes import FULL_RECIPES, MINI, first_eval_samples

    assert [first_eval_samples(g) for g in (8, 16, 32, 128)] == [1_536, 1_920, 2_688, 7_296]
    assert {r.name: (r.global_batch_size, r.base_lr) for r in FULL_RECIPES.values()} == {
        "gbs8": (8, 4e-4), "gbs16": (16, 4e-4), "gbs32": (32, 4e-4), "gbs128": (128, 1e-3)}
    for r in (*FULL_RECIPES.values(), MINI):
        assert (r.lora_rank, r.lora_alpha, r.lora_dropout, r.max_grad_norm, r.weight_decay) == (16, 32, 0.1, 0.3, 1e-4)
        assert (r.beta1, r.beta2, r.eps, r.warmup_steps, r.end_lr_fraction) == (0.9, 0.999, 1e-8, 0, 0.0)
    assert all(r.max_steps == 1_024 and r.seq_len == 8_192 and r.eval_samples == 173 for r in FULL_RECIPES.values())
    with pytest.raises(TrainperfError, match="tensor parallelism splits the heads"):
        MINI.with_overrides(["tp=3"])  # the heads, not the adapters' rank, bound tensor parallelism


def _rows_file(tmp_path, damage):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainperf.workloads.llama2_70b_lora import data as gov

    ids = [np.arange(10), np.arange(5, 17)]
    labels = [np.r_[[-100] * 6, np.arange(6, 10)], np.r_[[-100] * 8, np.arange(13, 17)]]
    if damage == "length":
        labels[1] = labels[1][:-1]
    elif damage == "shifted":
        labels[0] = np.r_[[-100] * 5, np.arange(6, 10), -100]
    elif damage == "vocab":
        ids[0][3] = 500
    elif damage == "unlabelled":
        labels[0][:] = -100
    path = tmp_path / "train-00000-of-00001.parquet"
    if damage == "column":
        pq.write_table(pa.table({"input_ids": [a.tolist() for a in ids]}), path)
    elif damage == "floats":
        pq.write_table(pa.table({"input_ids": [a.astype(float).tolist() for a in ids],
                                 "labels": [b.tolist() for b in labels]}), path)
    elif damage == "nulls":
        pq.write_table(pa.table({"input_ids": [[1, None, 3], [4, 5]], "labels": [[1, 2, 3], [4, 5]]}), path)
    else:
        gov.write_rows(path, ids, labels)
    return path


@pytest.mark.parametrize("damage, message", [
    ("column", "no column labels"), ("length", "row 1: 12 ids and 11 labels"),
    ("vocab", "row 0: token id outside the vocabulary of 64"), ("unlabelled", "row 0: labels must be token ids"),
    ("shifted", "row 0: labels differ from input_ids where kept"),
    ("floats", "column input_ids is list<element: double>, expected lists of integer token ids"),
    ("nulls", "column input_ids holds nulls"),
])
def test_damaged_rows_are_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    from trainperf.workloads.llama2_70b_lora import data as gov

    path = _rows_file(tmp_path, damage)
    with pytest.raises(TrainperfError, match=re.escape(message)) as caught:
        gov.read_rows(path, 64, 128)
    assert str(path) in str(caught.value)


def test_the_losses_take_the_labelled_tokens_only():
    from trainperf.workloads.llama2_70b_lora import data as gov

    path_ids = [torch.tensor([1, 2, 3, 4]).numpy(), torch.tensor([5, 6, 7]).numpy()]
    path_labels = [torch.tensor([-100, -100, 3, 4]).numpy(), torch.tensor([-100, 6, 7]).numpy()]  # = the ids
    batch = gov.stack(path_ids, path_labels, [0, 1], 6)
    assert batch.shape == (2, 2, 6) and batch[1, 1, 3:].tolist() == [-100] * 3

    class NextToken(torch.nn.Module):  # at each position, probability 1/2 on the id one further on, the
        def forward(self, ids):         # rest spread over the other 7 of 8 ids
            following = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
            logits = torch.zeros((*ids.shape, 8))
            logits.scatter_(-1, following[..., None], math.log(7.0))
            return logits

    # The shifted labels (ids[t + 1] predicted at t) cost ln 2 each; an unshifted or unmasked label would cost
    # ln 14 at some position, and mean over all positions would count the padding's.
    per_sample = gov.sample_losses(NextToken(), batch)
    assert torch.allclose(per_sample, torch.full((2,), math.log(2)), atol=1e-6)
    assert gov.summary_loss(NextToken(), batch).item() == pytest.approx(math.log(2))


def test_every_row_weighs_the_same_whatever_its_labelled_length():
    # The reference trains one row per device and averages the rows' token means; a micro-batch of several
    # rows must give the same loss, so a row with 1 labelled token counts as much as one with 5.
    from trainperf.workloads.llama2_70b_lora import data as gov

    ids = [np.array([7, 2, 3, 4, 5, 6]), np.arange(1, 7)]
    labels = [np.array([-100, -100, -100, -100, -100, 6]), np.array([-100, 2, 3, 4, 5, 6])]
    batch = gov.stack(ids, labels, [0, 1], 6)

    class Costly(torch.nn.Module):  # a row starting with 7 predicts uniformly over 8 ids, the other is certain
        def forward(self, ids):
            following = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
            certain = torch.zeros((*ids.shape, 8)).scatter_(-1, following[..., None], 100.0)
            return torch.where((ids[:, :1] == 7)[..., None], torch.zeros_like(certain), certain)

    rows = gov.sample_losses(Costly(), batch)
    assert rows[0].item() == pytest.approx(math.log(8)) and rows[1].item() == pytest.approx(0.0, abs=1e-6)
    assert gov.summary_loss(Costly(), batch).item() == pytest.approx(math.log(8) / 2)  # token-weighted: ln 8 / 5
    one_by_one = torch.stack([gov.summary_loss(Costly(), batch[i:i + 1]) for i in range(2)])
    assert gov.summary_loss(Costly(), batch).item() == pytest.approx(one_by_one.mean().item())


def _lora_losses(tp: int = 1, steps: int = 8) -> list[float]:
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext
    from trainperf.runtime import distributed
    from trainperf.runtime.fsdp import FSDPEngine
    from trainperf.runtime.step import TrainStep
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    fsdp = "RANK" in __import__("os").environ
    ctx = distributed.init_from_env("cpu") if fsdp else RuntimeContext(device=torch.device("cpu"))
    try:
        workload = registry.get("llama2_70b_lora")
        recipe = workload.recipe("mini").with_overrides(["lora_dropout=0.0", "global_batch_size=4", f"tp={tp}"])
        torch.manual_seed(0)
        parts = workload.build(recipe, ctx, Assets(workload.assets(recipe, None)))
        parts = FSDPEngine().apply(parts.parallel, parts, recipe, ctx)
        step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx)
        ids, labels, _ = synthetic.samples(4, 99)
        batch = gov.stack(ids, labels, [0, 1, 2, 3], synthetic.SEQ_LEN)
        data_parallel = fsdp and tp == 1  # with tp=2 both processes read every row
        if data_parallel:
            batch = batch[ctx.rank * 2:(ctx.rank + 1) * 2]
        return mean_step_losses(step, batch, steps, ctx)
    finally:
        if fsdp:
            distributed.shutdown()


@pytest.mark.second_tier
@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp2", "tp2"])
def test_two_processes_fine_tune_as_one(tp):
    # FSDP2 over two data-parallel processes, or the blocks and their adapters split between two tensor-
    # parallel ones (A replicated beside q|k|v and split beside the output projection, B the other way).
    alone = _lora_losses()
    both = launch(_lora_losses, tp)
    assert alone[-1] < alone[0] - 0.5  # the adapters learn; the base read from the shipped checkpoint
    for rank in (0, 1):
        assert both[rank] == pytest.approx(alone, rel=1e-4, abs=1e-4), (rank, both[rank], alone)


@pytest.mark.to_target
@pytest.mark.slow
def test_the_mini_reaches_its_target_with_a_log_that_passes(tmp_path):
    from tests.conftest import read_log
    from trainperf.cli import main
    from trainperf.results.compliance import check

    out = tmp_path / "run"
    assert main(["run", "llama2_70b_lora", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    records = read_log(out / "mlperf_log.txt")
    logged = {r["key"]: r["value"] for r in records}
    assert logged["lora_rank"] == 16 and logged["lora_alpha"] == 32 and logged["train_samples"] == 2_048
    evals = [r for r in records if r["key"] == "eval_accuracy"]
    assert evals[0]["metadata"]["samples_count"] == 1_536 and evals[-1]["value"] <= 0.45
    verdict = check(out / "mlperf_log.txt", None)
    assert verdict.valid and verdict.division == "open", verdict.output


def test_make_lora_base_writes_a_checkpoint_the_reader_takes(tmp_path, capsys):
    from trainperf.cli import main
    from trainperf.workloads.llama2_70b_lora import synthetic

    assert main(["make-lora-base", "--steps", "2", "--out", str(tmp_path)]) == 0
    assert "held-out language-model loss" in capsys.readouterr().out
    checkpoint = hf.Checkpoint(tmp_path)
    assert checkpoint.config == synthetic.BASE_CONFIG
    assert json.loads((tmp_path / "base.json").read_text())["steps"] == 2
    checkpoint.load_into(Llama(checkpoint.config, synthetic.SEQ_LEN))


def test_the_full_scale_reads_the_references_files(tmp_path, capsys):
    # The dataset's two parquet files and a Hugging Face base beside them, at a toy size: prepare names what
    # is missing, a full-scale run loads the base on the meta device's path, trains the adapters, evaluates.
    from tests.conftest import read_log
    from trainperf.cli import main
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    ids, labels, _ = synthetic.samples(40, 5)
    gov.write_rows(tmp_path / gov.TRAIN, ids[:32], labels[:32])
    assert main(["prepare", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path)]) == 2
    assert "validation-00000-of-00001.parquet: missing" in capsys.readouterr().err
    gov.write_rows(tmp_path / gov.VALID, ids[32:], labels[32:])
    assert main(["prepare", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path)]) == 2
    assert "base/config.json: missing" in capsys.readouterr().err  # not "ready" without the base (issue 60, 14)
    small = LlamaConfig(layers=1, dim=32, heads=4, kv_heads=2, ffn_dim=64, vocab_size=96, rope_theta=10_000.0,
                        rope_factor=0.0, rope_original_context=4096)
    torch.manual_seed(4)
    base = Llama(small, 128)
    base.reset_parameters()
    hf.write(base, small, tmp_path / "base", dtype=torch.bfloat16)
    assert main(["prepare", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path)]) == 0
    assert "32 rows" in capsys.readouterr().out
    sets = ["model.layers=1", "model.dim=32", "model.heads=4", "model.kv_heads=2", "model.ffn_dim=64",
            "model.vocab_size=96", "seq_len=128", "eval_samples=8", "eval_batch_size=4", "max_samples=32",
            "eval_every_samples=16", "eval_first_samples=16", "precision=fp32", "fused_optimizer=false"]
    out = tmp_path / "run"
    code = main(["run", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path), "--out", str(out), "--quiet",
                 *[x for s in sets for x in ("--set", s)]])
    assert code == 1  # a random base: the budget ends it, as a valid log says
    records = read_log(out / "mlperf_log.txt")
    assert [r["metadata"]["samples_count"] for r in records if r["key"] == "eval_accuracy"] == [16, 32]
    assert next(r["value"] for r in records if r["key"] == "train_samples") == 32
    # A base of another shape than the recipe's, or missing a tensor, is refused in one line naming the file,
    # before any run folder is written (as a missing config.json is: one rule, exit 2).
    capsys.readouterr()
    code = main(["run", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path), "--out", str(tmp_path / "x"),
                 "--quiet", *[x for s in sets if not s.startswith("model.dim") for x in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "x").exists()
    assert len(err) == 1 and "base/config.json: dim 32 in the checkpoint, 8192 in the recipe" in err[0], err
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "base" / hf.SINGLE)
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "base" / hf.SINGLE)
    code = main(["run", "llama2_70b_lora", "--scale", "full", "--data", str(tmp_path), "--out", str(tmp_path / "x"),
                 "--quiet", *[x for s in sets for x in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "x").exists()
    assert len(err) == 1 and "no tensor model.layers.0.mlp.down_proj.weight" in err[0], err


def test_bench_counts_the_frozen_base_as_forward_and_input_gradients():
    from trainperf import registry
    from trainperf.bench.throughput import run_bench

    workload = registry.get("llama2_70b_lora")
    recipe = workload.recipe("full").with_overrides([*workload.step_probe, "precision=fp32", "checkpointing=none"])
    result = run_bench(workload, recipe, "full", None, True, steps=1, warmup=1, device="cpu")
    c = recipe.model
    frozen = c.parameters() - c.vocab_size * c.dim
    # torch's counter (no attention on a CPU's flash kernel): the frozen products twice (forward, input
    # gradients; the first block's input needs none, 3 % less), the adapters' three times; the formula adds
    # attention's.
    assert result.flops_per_sample == pytest.approx(4 * frozen * 256, rel=0.05)
    assert result.formula_flops_per_sample > result.flops_per_sample
    assert result.parameters == adapter_parameters(2, 512, 512 + 2 * 8 * 64, 16)


def test_a_bf16_base_with_fp32_adapters_runs_outside_autocast():
    # One process holds the base in bf16 and the adapters in fp32 with no FSDP cast between them: the
    # adapters take their input in their own dtype (the GPU round's bench crashed on it).
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext
    from trainperf.runtime.fsdp import FSDPEngine
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    workload = registry.get("llama2_70b_lora")
    recipe = workload.recipe("mini").with_overrides(["precision=bf16"])
    ctx = RuntimeContext(device=torch.device("cpu"))
    parts = workload.build(recipe, ctx, Assets(workload.assets(recipe, None)))
    parts = FSDPEngine().apply(parts.parallel, parts, recipe, ctx)
    model = parts.model
    assert model.blocks[0].attention.wq.weight.dtype == torch.bfloat16
    assert model.blocks[0].attention.qkv_adapter.lora_a.weight.dtype == torch.float32
    ids, labels, _ = synthetic.samples(2, 1)
    loss = gov.summary_loss(model, gov.stack(ids, labels, [0, 1], synthetic.SEQ_LEN))
    loss.backward()
    assert math.isfinite(loss.item()) and model.blocks[0].attention.o_adapter.lora_b[0].weight.grad is not None


def test_recomputed_blocks_draw_the_adapters_dropout_masks_again():
    # Full checkpointing with dropout 0.1: the adapters' gradients equal those without recomputation (they
    # differed by 35 % when the recomputation drew new masks).
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext
    from trainperf.runtime.fsdp import FSDPEngine
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    workload = registry.get("llama2_70b_lora")
    ids, labels, _ = synthetic.samples(4, 2)
    batch = gov.stack(ids, labels, [0, 1, 2, 3], synthetic.SEQ_LEN)
    grads = []
    for checkpointing in ("none", "full"):
        recipe = workload.recipe("mini").with_overrides([f"checkpointing={checkpointing}"])
        ctx = RuntimeContext(device=torch.device("cpu"))
        torch.manual_seed(0)
        parts = workload.build(recipe, ctx, Assets(workload.assets(recipe, None)))
        parts = FSDPEngine().apply(parts.parallel, parts, recipe, ctx)
        for p in parts.model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.02)  # B non-zero: gradients reach A through the dropout too
        torch.manual_seed(1)
        gov.summary_loss(parts.model, batch).backward()
        grads.append(torch.cat([p.grad.flatten() for p in parts.model.parameters() if p.requires_grad]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_fp8_runs_the_frozen_products_in_float8_and_keeps_the_adapters():
    pytest.importorskip("torchao.float8")
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext
    from trainperf.runtime import speedups
    from trainperf.runtime.step import TrainStep
    from trainperf.workloads.llama2_70b_lora import data as gov
    from trainperf.workloads.llama2_70b_lora import synthetic

    workload = registry.get("llama2_70b_lora")
    ids, labels, _ = synthetic.samples(4, 3)
    batch = gov.stack(ids, labels, [0, 1, 2, 3], synthetic.SEQ_LEN)
    losses = {}
    for precision in ("bf16", "fp8"):
        recipe = workload.recipe("mini").with_overrides([f"precision={precision}", "lora_dropout=0.0"])
        ctx = RuntimeContext(device=torch.device("cpu"))
        torch.manual_seed(0)
        parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
        kinds = {type(m).__name__ for name, m in parts.model.named_modules() if "adapter" not in name}
        adapters = {type(m).__name__ for name, m in parts.model.named_modules() if "lora_" in name} - {"ModuleList"}
        if precision == "fp8":
            # Every frozen product of the base (7 a block and the output layer) in float8; the adapters as they are.
            frozen = [m for m in parts.model.modules() if type(m).__name__.startswith("Frozen")]
            assert len(frozen) == 7 * recipe.model.layers + 1 and "Linear" not in kinds
            assert adapters == {"Linear"}
        step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx)
        losses[precision] = [float(step(batch)) for _ in range(6)]
    assert losses["fp8"][0] == pytest.approx(losses["bf16"][0], rel=0.03)
    assert losses["fp8"][-1] < losses["fp8"][0] - 0.3  # the adapters learn through the float8 base


def test_a_replaced_shipped_base_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    """Issue 60, 3: a base rebuilt over the shipped one made the mini miss its calibrated target with no
    word. The shipped base's SHA-256 is checked at use, as BERT's phase-1 checkpoint and MiniGo's target."""
    import shutil

    from trainperf.cli import main
    from trainperf.workloads.llama2_70b_lora import synthetic

    synthetic.verify_shipped_base(synthetic.BASE)  # the shipped one passes
    copy = tmp_path / "base"
    shutil.copytree(synthetic.BASE, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(synthetic, "BASE", copy)
    assert main(["run", "llama2_70b_lora", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors: SHA-256 differs" in err[0], err
    assert not (tmp_path / "run").exists()  # refused before any run folder is written
