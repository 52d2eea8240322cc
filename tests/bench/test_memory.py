"""The memory a bench needs, estimated before it runs: a batch that would not fit is refused in one
line (bench) or replaced by one that fits (predict), instead of the kernel's OOM killer."""

from __future__ import annotations

import dataclasses

import pytest

from trainperf import registry
from trainperf.bench import memory, throughput
from trainperf.contract import Assets, RuntimeContext
from trainperf.runtime import speedups
from trainperf.science import measure


def _parts(name: str, batch: int):
    workload = registry.get(name)
    recipe = workload.recipe("mini").with_overrides([f"global_batch_size={batch}"])
    ctx = RuntimeContext.create("cpu")
    return workload, recipe, ctx, speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))


def test_the_estimate_grows_with_the_batch_as_the_activations_do():
    workload, recipe, ctx, parts = _parts("resnet", 8)
    found = memory.estimate(workload, recipe, ctx, parts)
    params = sum(p.numel() * 4 for p in parts.model.parameters())
    # weights, gradients and SGD's momentum
    assert parts.optimizer.defaults["momentum"] > 0 and found.fixed_bytes == 3 * params
    assert found.per_sample_bytes > 0
    assert found.need(64) > found.need(8) and found.need(64) - found.need(8) == pytest.approx(
        56 * found.per_sample_bytes * memory.MARGIN, rel=1e-6, abs=2)


def test_a_bench_that_would_not_fit_is_one_line_naming_the_batch_that_fits(monkeypatch):
    workload, recipe, ctx, parts = _parts("resnet", 64)
    found = memory.estimate(workload, recipe, ctx, parts)
    # The device's free memory excludes the weights already on it; the estimate adds them back.
    resident = sum(p.numel() * 4 for p in parts.model.parameters())
    monkeypatch.setattr(memory, "available", lambda device: found.need(40) - resident)
    with pytest.raises(memory.BatchTooLarge) as err:
        memory.check_fits(workload, recipe, ctx, parts)
    assert "\n" not in str(err.value) and "a step at batch 64 needs about" in str(err.value)
    # The option named is one every benching command has (bench has no --bench-batch).
    assert 0 < err.value.fits <= 40
    assert f"at most {err.value.fits:,} per device fits (--set global_batch_size={err.value.fits})" in str(err.value)
    monkeypatch.setattr(memory, "available", lambda device: found.fixed_bytes - resident)
    with pytest.raises(memory.BatchTooLarge, match="no batch fits") as err:
        memory.check_fits(workload, recipe, ctx, parts)
    assert err.value.fits == 0


def test_predict_benches_at_a_batch_that_fits_and_says_so(monkeypatch):
    workload = registry.get("resnet")
    recipe = workload.recipe("mini")
    monkeypatch.setattr(memory, "available", lambda device: 3 * 2**30)
    real = memory.estimate

    def per_sample_100mb(*args):
        return memory.Estimate(real(*args).fixed_bytes, 100 * 2**20, memory.available(None))

    monkeypatch.setattr(memory, "estimate", per_sample_100mb)
    said = []
    result, _how = measure.bench_at(workload, recipe, "mini", None, 512, 1, 0, "cpu", say=said.append)
    assert len(said) == 1 and "a step at batch 512 needs about" in said[0]
    fits = int(said[0].rsplit("benching at batch ", 1)[1].split()[0].replace(",", ""))
    assert 0 < fits < 512 and result.batch_size == fits
    assert isinstance(result, throughput.BenchResult)


def test_a_token_budget_is_estimated_per_token_not_per_sentence(monkeypatch):
    # The H100 round of 2026-11-25 refused the Transformer's 8,192 tokens per GPU as 8,192 sentences
    # (375 GiB); a batch of tokens needs per token what a batch of sentences of 32 tokens needs per 32.
    workload, recipe, ctx, parts = _parts("transformer", 512)
    assert recipe.BATCH_UNIT == "tokens"
    per_token = memory.estimate(workload, recipe, ctx, parts).per_sample_bytes
    rows = workload.synthetic_batch(dataclasses.replace(recipe, global_batch_size=64), ctx, parts.model)
    assert workload.batch_samples(rows) == 2  # two sentences of 32 tokens
    monkeypatch.setattr(memory, "TOKENS_PER_SAMPLE", 64)  # a probe twice as large: the same per token
    per_token_again = memory.estimate(workload, recipe, ctx, parts).per_sample_bytes
    assert per_token > 0 and per_token_again == pytest.approx(per_token, rel=0.1)
    monkeypatch.setattr(memory, "available", lambda device: 0)
    with pytest.raises(memory.BatchTooLarge, match="of activations per token"):
        memory.check_fits(workload, recipe, ctx, parts)


def test_tables_with_sparse_gradients_and_plain_sgd_count_once():
    # DLRM's tables: sparse gradients (the rows a batch touches) and SGD without momentum (no state), so
    # the weights count once, not four times (the H100 round refused Criteo's tables as 103 GiB).
    workload, recipe, ctx, parts = _parts("dlrm", 64)
    found = memory.estimate(workload, recipe, ctx, parts)
    tables = sum(p.numel() * 4 for m in parts.model.modules() if getattr(m, "sparse", False)
                 for p in m.parameters(recurse=False))
    dense = sum(p.numel() * 4 for p in parts.model.parameters()) - tables
    assert tables > 0 and not parts.optimizer.defaults.get("momentum")
    assert found.fixed_bytes == tables + 2 * dense


def test_state_the_forward_did_not_make_is_not_counted_per_sample():
    # FBGEMM's fused Adagrad keeps each table's accumulator among the lookup's saved tensors: counted as
    # activations, DLRM-DCNv2's tables (capped at 1,000 rows: 13 MB of accumulator) read as 6.5 MB a sample and
    # refused a batch of 8,192 at full width on a 24 GB machine.
    pytest.importorskip("torchrec")
    workload = registry.get("dlrm_dcnv2")
    recipe = workload.recipe("full").with_overrides(["max_ind_range=1000", "global_batch_size=8192"])
    ctx = RuntimeContext.create("cpu")
    parts = speedups.assemble(workload, recipe, ctx, Assets({}))
    found = memory.estimate(workload, recipe, ctx, parts)
    # What a sample keeps: the 3,456-wide interaction's inputs and outputs through three cross layers, the MLPs'.
    assert 20_000 < found.per_sample_bytes < 1_000_000, found.per_sample_bytes
