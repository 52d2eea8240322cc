"""Every registered workload held to the contract, in one place: what a new workload must satisfy to
join (its folder, its docs page, a calibration, a fuzzed reader) is checked here, not copied into each
workload's tests. Those keep only what is particular to the workload (a rule its log must break when
a value is wrong, the RCP file its recipes come from).

- its declarations: ruleset known to the official checker, runs and scoring rule, recipes valid;
- every full recipe: built (on the meta device: no memory, no data), its hyperparameters, the values
  it logs once the data is open and during the run, the tensors it initialises, in a closed-division
  log the official checker accepts under the recipe's ruleset;
- the mini recipe: a synthetic batch counted, split and trained on;
- the mini data: prepared, then prepared again without a file rewritten;
- a docs page, a calibration that reaches its target on at least 9 of 10 seeds, a fuzzed reader.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import mlperf_logging
import pytest
import torch

from tests.conftest import mini_data, write_minimal_closed_log
from tests.fuzz.readers import READERS
from trainperf import calibration, registry
from trainperf.cli import main
from trainperf.contract import DataParallel, RuntimeContext, Workload, bare_model
from trainperf.harness.run import disclosure
from trainperf.results.compliance import check
from trainperf.runtime import parallel
from trainperf.runtime.speedups import SWITCHES

ROOT = Path(__file__).resolve().parents[1]
CHECKER = Path(mlperf_logging.__file__).parent / "compliance_checker"
NAMES = registry.names()
MINIS = [name for name in NAMES if "mini" in registry.get(name).scales]
FULL = [(name, recipe) for name in NAMES for recipe in registry.get(name).recipes("full")]


@pytest.mark.parametrize("name", NAMES)
def test_what_the_workload_declares(name):
    w = registry.get(name)
    assert w.name == name, "a workload's name is its package's"
    assert re.fullmatch(r"[a-z0-9_]+", w.benchmark) and w.summary.strip()
    rules = CHECKER / f"training_{w.mlperf.ruleset}"
    assert rules.is_dir(), f"{name}: the official checker has no ruleset {w.mlperf.ruleset}"
    if w.mlperf.own_rules is None:
        closed = rules / f"closed_{w.benchmark}.yaml"
        assert closed.is_file(), f"{name}: {w.mlperf.ruleset} has no rules for {w.benchmark}"
    else:
        assert w.mlperf.own_rules.is_file()
    assert w.mlperf.runs > 2 * w.mlperf.olympic_drop >= 2
    assert w.speedups <= {s.name for s in SWITCHES} | {"fp8"}
    assert w.host_scoring in ("thread", "process")
    assert w.mlperf.open_recipes <= set(w.recipes("full"))
    assert "full" in w.scales  # the product; a mini is its proof where the rules leave room for one
    for scale in w.scales:
        for recipe in w.recipes(scale).values():
            w.check_recipe(recipe)
            recipe.cadence  # noqa: B018 - a recipe's cadence and budget are valid
    for count in (w.mlperf.full_epoch_samples, w.mlperf.full_eval_samples, w.mlperf.full_eval_forwards):
        assert count is None or count > 0


def _quality(w: Workload, target: float | tuple[float, ...]) -> float | dict[str, float]:
    """A quality exactly at the target (the rules' comparisons include it), or just past it where they compare
    strictly."""
    def at(value: float) -> float:
        return math.nextafter(value, math.inf if w.metric.higher_is_better else -math.inf) if w.metric.strict else value

    if w.metric.parts:
        return {part: at(v) for part, v in zip(w.metric.parts, target, strict=True)}
    return at(float(target))


def _first_eval_epoch_num(w: Workload, recipe) -> float:
    cadence = recipe.cadence.resolve(w.mlperf.full_epoch_samples)
    if recipe.log_epoch_num == "samples":
        return next(cadence.sample_evals())
    first = cadence.epochs[0] if cadence.epochs else cadence.first
    return first + 1 if recipe.log_epoch_num == "1+epochs" else first


@pytest.mark.parametrize(("name", "recipe_name"), FULL)
def test_every_full_recipe_passes_the_closed_rules(tmp_path, name, recipe_name):
    w = registry.get(name)
    recipe = w.recipe("full", recipe_name)
    ctx = RuntimeContext(device=torch.device("meta"), world_size=w.reference_devices(recipe))
    with torch.device("meta"):  # the reference model's structure, without its memory
        parts = w.build(recipe, ctx, {})
    declared = w.parallelism(recipe)  # what run checks before building must be what build gives
    assert declared is None or declared == parts.parallel, (declared, parts.parallel)
    hyper = w.mlperf_hyperparameters(recipe, ctx)
    if parts.epoch_hyperparameters is not None:
        steps = w.mlperf.full_epoch_samples // recipe.global_batch_size if w.mlperf.full_epoch_samples else None
        hyper.update(parts.epoch_hyperparameters(steps))
    hyper.update(w.logged_during_run(recipe))
    hyper.update(disclosure(w, recipe, parts.parallel or DataParallel(), ctx, hyper))  # what 6.1.0 asks
    log = tmp_path / "closed.txt"
    first = _first_eval_epoch_num(w, recipe)
    # The first evaluation's samples_count: its samples on a sample cadence (6.1.0 checks DeepSeek-V3's).
    # train_samples: the epoch's where the workload knows it (dlrmv4's rules check it), as a full run logs it.
    samples = first if recipe.log_epoch_num == "samples" else w.mlperf.full_epoch_samples or 1000
    write_minimal_closed_log(log, w.benchmark, recipe.global_batch_size, hyper, _quality(w, recipe.target),
                             first, train_samples=w.mlperf.full_epoch_samples or samples, samples_count=samples,
                             eval_samples=w.mlperf.full_eval_samples or 100,
                             initialized=w.initialized_tensors(recipe, bare_model(parts.model)))
    verdict = check(log, recipe.ruleset or w.mlperf.ruleset)
    if recipe_name in w.mlperf.open_recipes:
        assert not verdict.valid, f"{name} {recipe_name} is declared open but passes the closed rules"
    else:
        assert verdict.valid and verdict.division == "closed", verdict.output


@pytest.mark.parametrize("name", NAMES)
def test_the_mini_trains_on_a_synthetic_batch(name):
    w = registry.get(name)
    # A full-scale-only workload: its full step at a CPU's size (step_probe), through its engine where
    # its model is built on the meta device (initialised there, after sharding).
    recipe = (w.recipe("mini") if "mini" in w.scales
              else w.recipe("full").with_overrides([*w.step_probe, "global_batch_size=2"]))
    ctx = RuntimeContext.create("cpu")
    torch.manual_seed(0)
    parts = w.build(recipe, ctx, {})
    if any(p.is_meta for p in parts.model.parameters()):
        parts = parallel.engine_for(parts.parallel).apply(parts.parallel, parts, recipe, ctx)
    batch = w.synthetic_batch(recipe, ctx, parts.model)
    samples = w.batch_samples(batch)
    assert samples > 0
    halves = w.split_batch(batch, 2)
    assert len(halves) == 2 and sum(w.batch_samples(h) for h in halves) == samples
    parts.model.train()
    loss = parts.loss_fn(parts.model, halves[0])
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in parts.model.parameters() if p.requires_grad]
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads), f"{name}: no gradient reached the model"


@pytest.mark.slow
@pytest.mark.parametrize("name", MINIS)
def test_the_mini_data_prepares_once(name, capsys):
    w = registry.get(name)
    root = mini_data(name)
    assert w.data_problems("mini", root) == []
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    assert main(["prepare", name, "--data", str(root)]) == 0
    assert "already present" in capsys.readouterr().out
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and p in before}
    assert after == before, f"{name}: preparing ready data again rewrote files"


@pytest.mark.parametrize("name", NAMES)
def test_a_docs_page_and_a_calibration(name):
    w = registry.get(name)
    page = ROOT / "docs" / "workloads" / f"{name}.md"
    assert page.is_file(), f"{page.relative_to(ROOT)}: every workload has a page"
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# ") and f"(`{name}`)" in text.splitlines()[0]
    assert f"<!-- generated:summary:{name} -->" in text and "## What differs from the reference" in text
    if "mini" not in w.scales:
        assert "**Full scale only.**" in text, f"{page.relative_to(ROOT)}: says why it has no mini"
        assert calibration.main(name) is None
        return
    found = calibration.main(name)
    assert found is not None, f"{name}: no calibration (python benchmarks/mini_ttt.py {name} --runs 10 --record)"
    assert found.target == calibration.target_text(w.metric, w.recipe("mini").target), \
        f"{name}: the mini target changed since its calibration ({found.target}): calibrate again"
    assert found.seeds >= 10 and found.reached >= 0.9 * found.seeds
    assert found.baseline and found.best, f"{name}: the calibration states no trivial baseline and best quality"


@pytest.mark.parametrize("name", NAMES)
def test_its_data_formats_are_fuzzed(name):
    assert any(name in reader.workloads for reader in READERS), \
        f"{name}: no reader in tests/fuzz/readers.py names this workload"


def test_a_recalibration_replaces_its_entry_in_place_and_keeps_baseline_and_best(tmp_path):
    import dataclasses
    import shutil

    path = tmp_path / "calibration.json"
    shutil.copy(calibration.PATH, path)
    before = calibration.load(path)
    old = calibration.main("rnnt", path)
    calibration.record(dataclasses.replace(old, median_s=1.5, baseline="", best=""), path)
    after = calibration.load(path)
    assert [c.variant for c in after] == [c.variant for c in before]  # same place, same order
    new = calibration.main("rnnt", path)
    assert new.median_s == 1.5 and (new.baseline, new.best) == (old.baseline, old.best)
    assert "–" in path.read_text(encoding="utf-8") or "–" not in calibration.PATH.read_text(encoding="utf-8")
