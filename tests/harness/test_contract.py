"""The contract's capabilities, each on the small fake workload that needs it (tests/harness/fakes.py):
a two-metric target, Python objects gathered to rank 0, asynchronous host scoring in a process and
on several ranks, a cadence in samples, training data the model produces, lists of images as
batches and token-weighted losses, clipping with an after-step hook and EMA evaluation weights, a
compiled evaluation forward that leaves nothing to compile after run_start, explicit seeds and
assets."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import launch, read_log
from tests.harness import fakes
from trainperf.contract import Assets, ModelParts, RunResult, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.harness import RunConfig, run
from trainperf.results.compliance import check
from trainperf.runtime import distributed
from trainperf.runtime.step import TrainStep


def _run(tmp_path: Path, workload: Any, recipe: Any = None, division: str = "open", ctx: RuntimeContext | None = None,
         name: str = "log.txt", seed: int = 7) -> tuple[RunResult, list[dict]]:
    log = tmp_path / name
    config = RunConfig(workload=workload, recipe=recipe or workload.recipe("mini"), scale="mini", data_dir=tmp_path,
                       seed=seed, log_path=log, division=division)
    return run(config, ctx or RuntimeContext.create("cpu")), read_log(log)


def _values(records: list[dict], key: str = "eval_accuracy") -> list[tuple[Any, Any]]:
    return [(r["metadata"].get("epoch_num"), r["value"]) for r in records if r["key"] == key]


# -- 1. quality as named values, a target each ----------------------------------------------------
def test_two_metrics_both_must_be_met_and_the_log_passes_the_closed_rules(tmp_path):
    scores = [{"BBOX": 0.30, "SEGM": 0.20}, {"BBOX": 0.40, "SEGM": 0.33}, {"BBOX": 0.38, "SEGM": 0.35}]
    result, records = _run(tmp_path, fakes.TwoMetrics(scores), division="closed")
    assert result.status == "success" and result.epochs_to_target == 3  # epoch 2: BBOX met, SEGM not
    assert _values(records) == [(1, scores[0]), (2, scores[1]), (3, scores[2])]
    assert result.target == {"BBOX": 0.377, "SEGM": 0.339}
    assert result.final_metric == scores[2]
    json.dumps(result.to_dict())  # result.json holds the dicts as they are
    verdict = check(tmp_path / "log.txt")
    assert verdict.valid, verdict.output  # the official closed Mask R-CNN rules: BBOX >= 0.377 and SEGM >= 0.339


def test_two_metrics_that_never_both_meet_abort_naming_both_targets(tmp_path):
    recipe = fakes.TwoMetrics([]).recipe("mini").with_overrides(["max_epochs=2"])
    workload = fakes.TwoMetrics([{"BBOX": 0.5, "SEGM": 0.1}, {"BBOX": 0.1, "SEGM": 0.5}])
    result, records = _run(tmp_path, workload, recipe, division="closed")
    assert result.status == "aborted"
    assert result.abort_reason == "target ap BBOX >= 0.377 and SEGM >= 0.339 not reached within 2 epochs"
    assert not check(tmp_path / "log.txt").valid  # the closed rules agree: no evaluation met both


def test_score_and_report_carry_both_metrics(tmp_path, capsys):
    from tests.conftest import Page
    from trainperf.cli import main

    run_dir = tmp_path / "results" / "sys" / "maskrcnn"
    run_dir.mkdir(parents=True)
    scores = [{"BBOX": 0.30, "SEGM": 0.20}, {"BBOX": 0.38, "SEGM": 0.35}]
    for i in range(2):
        _run(run_dir, fakes.TwoMetrics(list(scores)), division="closed", name=f"result_{i}.txt")
    assert main(["score", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "BBOX 0.3800, SEGM 0.3500" in out
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "results"), "-o", str(html)]) == 0
    page = Page(html.read_text())
    assert len(page.images) == 1  # the convergence figure, one line per named value
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "results"), str(tmp_path / "results")]) == 0
    assert "maskrcnn" in capsys.readouterr().out
    # A run folder (result.json) carries the targets too: one target line per named value.
    from trainperf.report import collect, render
    from trainperf.results import run_folder

    folder = tmp_path / "run"
    folder.mkdir()
    result, _ = _run(folder, fakes.TwoMetrics(list(scores)), name="mlperf_log.txt")
    run_folder.save(folder, result)
    group = collect.collect([folder]).groups[0]
    assert group.target == {"BBOX": 0.377, "SEGM": 0.339} and group.runs[0].evals[-1][1] == scores[-1]
    figure = render.convergence_figure("maskrcnn", [group], 0)
    assert figure is not None and figure.png[:4] == b"\x89PNG"


# -- 2. Python objects gathered to rank 0 ----------------------------------------------------------
def test_object_gather_scores_decoded_strings_on_one_process(tmp_path):
    workload = fakes.ObjectGather()
    result, records = _run(tmp_path, workload)
    assert result.status == "success" and result.final_metric == 1.0
    values = [v for _, v in _values(records)]
    assert values[0] < 1.0 and values == sorted(values)  # the strings get right as y = 2x is learnt


def _object_gather_run(tmp: str, async_eval: bool) -> dict[str, Any]:
    ctx = distributed.init_from_env("cpu")
    try:
        workload = fakes.ObjectGather()
        recipe = workload.recipe("mini").with_overrides([f"async_eval={str(async_eval).lower()}"])
        log = Path(tmp) / f"log-{async_eval}.txt" if ctx.is_main else None
        result = run(RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=Path(tmp), seed=7,
                               log_path=log), ctx)
        return {"status": result.status, "values": [e.value for e in result.evaluations],
                "epochs": result.epochs_to_target, "world": ctx.world_size}
    finally:
        distributed.shutdown()


@pytest.mark.second_tier
def test_object_gather_on_two_processes_agrees_with_one(tmp_path):
    single, _ = _run(tmp_path, fakes.ObjectGather(), name="single.txt")
    ranks = launch(_object_gather_run, str(tmp_path), False)
    assert ranks[0]["world"] == 2 and ranks[0] == ranks[1]  # every rank took rank 0's verdict
    assert ranks[0]["status"] == "success" and ranks[0]["epochs"] == single.epochs_to_target
    assert ranks[0]["values"] == pytest.approx([e.value for e in single.evaluations])


# -- 3. asynchronous host scoring: a worker process, several ranks ---------------------------------
@pytest.mark.second_tier
def test_async_scoring_in_a_worker_process_on_two_ranks(tmp_path):
    single, _ = _run(tmp_path, fakes.ObjectGather(), name="single.txt")
    ranks = launch(_object_gather_run, str(tmp_path), True)
    assert ranks[0] == ranks[1] and ranks[0]["status"] == "success"
    # Scored in the background, the results are the same evaluations, logged in order; training
    # may run past the evaluation that met the target before rank 0 knows it.
    assert ranks[0]["values"] == pytest.approx([e.value for e in single.evaluations])
    records = read_log(tmp_path / "log-True.txt")
    keys = [r["key"] for r in records]
    for epoch_num, _ in _values(records):  # each result logged after the evaluation it scores started
        start = next(i for i, r in enumerate(records) if r["key"] == "eval_start"
                     and r["metadata"]["epoch_num"] == epoch_num)
        assert start < next(i for i, r in enumerate(records) if r["key"] == "eval_accuracy"
                            and r["metadata"]["epoch_num"] == epoch_num)
    assert keys[-1] == "run_stop" and check(tmp_path / "log-True.txt").valid


@pytest.mark.slow
def test_async_scoring_in_a_worker_process_on_one_rank(tmp_path):
    workload = fakes.ObjectGather()
    recipe = workload.recipe("mini").with_overrides(["async_eval=true"])
    result, records = _run(tmp_path, workload, recipe)
    assert result.status == "success" and result.final_metric == 1.0
    epochs = [e for e, _ in _values(records)]
    assert epochs == sorted(epochs) and records[-1]["metadata"]["status"] == "success"


@pytest.mark.slow
def test_async_process_scoring_needs_a_module_level_metric(tmp_path):
    workload = fakes.UnpicklableMetric()
    recipe = workload.recipe("mini").with_overrides(["async_eval=true"])
    result, records = _run(tmp_path, workload, recipe)
    assert result.status == "aborted"
    assert "host_scoring='process' needs a module-level metric function" in result.abort_reason
    assert records[-1]["key"] == "run_stop"


def test_scoring_error_on_rank_0_ends_the_run_with_its_message(tmp_path):
    class Failing(fakes.ObjectGather):
        def evaluate(self, recipe, ctx, forward):
            partial = super().evaluate(recipe, ctx, forward)
            partial.objects["predictions"] = partial.objects["predictions"][:-1]  # one sample missing
            return partial

    result, _ = _run(tmp_path, Failing())
    assert result.status == "aborted" and "evaluation samples not scored exactly once" in result.abort_reason


# -- 4. a cadence in samples, no epochs ------------------------------------------------------------
def test_sample_cadence_logs_samples_blocks_and_no_epochs(tmp_path):
    workload = fakes.SampleCadence(scores=[0.1, 0.2, 0.3, 0.4, 0.5], recipe=fakes.sample_recipe())
    result, records = _run(tmp_path, workload)
    keys = [r["key"] for r in records]
    assert "epoch_start" not in keys and "epoch_stop" not in keys
    assert [e for e, _ in _values(records)] == [8, 16, 24, 32, 40]  # every 8 samples (2 steps of 4)
    blocks = [(r["metadata"]["first_epoch_num"], r["metadata"]["epoch_count"]) for r in records
              if r["key"] == "block_start"]
    assert blocks == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8)]
    assert keys.count("block_start") == keys.count("block_stop")
    assert result.status == "aborted" and result.abort_reason.endswith("not reached within 40 samples")
    assert result.steps == 10 and result.samples == 40  # across epochs of 16 samples
    assert check(tmp_path / "log.txt").valid  # BERT's open rules


def test_sample_cadence_stops_at_the_evaluation_that_meets_the_target(tmp_path):
    workload = fakes.SampleCadence(scores=[0.1, 0.5, 0.95], recipe=fakes.sample_recipe(max_samples=400))
    result, records = _run(tmp_path, workload)
    assert result.status == "success" and result.samples_to_target == 24
    assert [r["key"] for r in records][-3:] == ["eval_accuracy", "block_stop", "run_stop"]


def test_listed_epochs_and_a_budget_end_are_evaluated(tmp_path):
    recipe = fakes.fake_recipe(eval_epochs=(2, 3), max_epochs=5)
    result, records = _run(tmp_path, fakes.Regression([0.1] * 5, recipe))
    assert [e for e, _ in _values(records)] == [2, 3, 5]  # the budget's end is evaluated too
    blocks = [(r["metadata"]["first_epoch_num"], r["metadata"]["epoch_count"]) for r in records
              if r["key"] == "block_start"]
    assert blocks == [(1, 2), (3, 1), (4, 2)]


def test_reference_epoch_cadence_is_rescaled_to_the_data(tmp_path):
    """Counts in epochs of a reference size (3D U-Net: 168 samples) are rescaled to the data's epoch:
    here 8, 4 and 20 epochs of 4 samples become 2, 1 and 5 epochs of the fake's 16."""
    recipe = fakes.fake_recipe(eval_first=8, eval_every=4, max_epochs=20, cadence_epoch_samples=4)
    result, records = _run(tmp_path, fakes.Regression([0.1] * 5, recipe))
    assert [e for e, _ in _values(records)] == [2, 3, 4, 5]
    assert result.cadence["first"] == 2 and result.cadence["max_epochs"] == 5


# -- 5. training data the model produces, of unknown length ----------------------------------------
def test_self_play_data_uses_the_model_and_logs_inside_the_timed_region(tmp_path):
    workload = fakes.SelfPlay(scores=[0.1, 0.2, 0.95])
    result, records = _run(tmp_path, workload)
    assert result.status == "success" and result.epochs_to_target == 3
    assert all(view.model is workload.seen["model"] for view in workload.seen["views"])
    keys = [r["key"] for r in records]
    games = [r for r in records if r["key"] == "actual_selfplay_games_per_generation"]
    assert [g["value"] for g in games] == [2, 3, 4]
    for g in games:
        assert keys.index("run_start") < records.index(g) < keys.index("run_stop")
    # The training samples are only known at the end: logged once, then.
    assert keys.count("train_samples") == 1 and keys.index("train_samples") == len(keys) - 2
    train = next(r for r in records if r["key"] == "train_samples")
    assert train["value"] == (2 + 3 + 4) * 4 == result.samples and result.train_samples is None
    assert check(tmp_path / "log.txt").valid  # MiniGo's open rules


@pytest.mark.parametrize("untimed", [False, True])
def test_untimed_evaluations_are_left_out_of_the_time_to_train(tmp_path, untimed):
    """MiniGo's rules time training up to the passing generation's save: with `untimed_evaluation` the
    clock stands still while an evaluation runs, and the log's times go on from where it stopped."""
    workload = fakes.SelfPlay(scores=[0.1, 0.2, 0.95])
    workload.untimed_evaluation = untimed
    slow = workload.evaluate

    def evaluate(recipe, ctx, forward):
        time.sleep(0.4)
        return slow(recipe, ctx, forward)

    workload.evaluate = evaluate
    result, records = _run(tmp_path, workload)
    assert result.status == "success" and result.epochs_to_target == 3
    if untimed:
        assert result.time_to_train_s < 0.6  # three evaluations of 0.4 s left out
        starts = [r["time_ms"] for r in records if r["key"] == "eval_start"]
        stops = [r["time_ms"] for r in records if r["key"] == "eval_stop"]
        assert all(b - a < 50 for a, b in zip(starts, stops, strict=True))
    else:
        assert result.time_to_train_s >= 1.2
    times = [r["time_ms"] for r in records]
    assert times == sorted(times) and check(tmp_path / "log.txt").valid


# -- 6. batches that are not dim-0 tensors; token-weighted losses ----------------------------------
def _params_after_one_step(workload: fakes.ImageList, batch: Any, accum: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    ctx = RuntimeContext.create("cpu")
    recipe = workload.recipe("mini").with_overrides([f"grad_accum_steps={accum}"])
    parts = workload.build(recipe, ctx, Assets())
    TrainStep(parts, 1, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)(batch)
    return [p.detach().clone() for p in parts.model.parameters()]


def test_a_list_of_images_splits_into_uneven_micro_batches_weighted_by_samples():
    workload = fakes.ImageList()
    batch = fakes.image_batch(5)
    assert workload.batch_samples(batch) == 5  # images, not the first image's 3 channels
    whole = _params_after_one_step(workload, batch, accum=1)
    split = _params_after_one_step(workload, batch, accum=2)  # 3 + 2 images
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_list_of_images_is_counted_in_the_run(tmp_path):
    result, _ = _run(tmp_path, fakes.ImageList(), fakes.fake_recipe(global_batch_size=5, max_epochs=2,
                                                                   grad_accum_steps=2))
    assert result.samples == 2 * 3 * 5 and result.steps == 6


def _token_parts(seed: int = 0) -> ModelParts:
    torch.manual_seed(seed)
    model = nn.Embedding(10, 1)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        tokens, mask = batch
        return ((m(tokens).squeeze(-1) - 1.0) ** 2 * mask).sum()  # summed over real tokens

    return ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), loss_fn=loss_fn,
                      lr_schedule=lambda spe: (lambda s: 1.0), loss_units=lambda batch: batch[1].sum())


def _token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Four sequences of 1, 6, 2 and 5 real tokens (padded to 6)."""
    lengths = [1, 6, 2, 5]
    tokens = torch.tensor([[(i * 3 + j) % 10 for j in range(6)] for i in range(4)])
    mask = torch.tensor([[1.0 if j < n else 0.0 for j in range(6)] for n in lengths])
    return tokens, mask


def _token_step_on_ranks() -> list[torch.Tensor]:
    ctx = distributed.init_from_env("cpu")
    try:
        parts = distributed.wrap_data_parallel(_token_parts(), ctx)
        tokens, mask = _token_batch()
        mine = ctx.shard(4)
        recipe = fakes.fake_recipe(grad_accum_steps=2)
        TrainStep(parts, 1, recipe, ctx.device, ctx=ctx)((tokens[mine.start:mine.stop], mask[mine.start:mine.stop]))
        return [p.detach().clone() for p in parts.model.module.parameters()]
    finally:
        distributed.shutdown()


def test_token_weighted_loss_divides_by_the_tokens_of_the_whole_batch():
    """The gradient is that of (sum of token losses) / (tokens in the global batch), whatever the
    micro-batching: short and long sequences weigh by their tokens, not by their count."""
    tokens, mask = _token_batch()
    reference = _token_parts()
    expected_loss = reference.loss_fn(reference.model, (tokens, mask)) / mask.sum()
    expected_loss.backward()
    expected = [p.detach() - 0.5 * p.grad for p in reference.model.parameters()]
    for accum in (1, 2):
        parts = _token_parts()
        loss = TrainStep(parts, 1, fakes.fake_recipe(grad_accum_steps=accum))((tokens, mask))
        assert float(loss) == pytest.approx(float(expected_loss.detach()))
        torch.testing.assert_close(list(parts.model.parameters())[0].detach(), expected[0])


@pytest.mark.second_tier
def test_token_weighted_loss_on_two_processes_equals_one():
    tokens, mask = _token_batch()
    single = _token_parts()
    TrainStep(single, 1, fakes.fake_recipe(grad_accum_steps=2))((tokens, mask))
    results = launch(_token_step_on_ranks)
    for rank in (0, 1):  # rank 0 holds 8 real tokens, rank 1 holds 7: unequal shares weigh right
        torch.testing.assert_close(results[rank][0], list(single.model.parameters())[0].detach())


# -- 7. clipping after unscaling, an after-step hook, EMA weights for evaluation -------------------
def test_clipping_happens_on_unscaled_fp16_gradients():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    parts = ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                       loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), lr_schedule=lambda spe: (lambda s: 1.0))
    before = [p.detach().clone() for p in model.parameters()]
    batch = (torch.randn(8, 4) * 10, torch.randn(8, 1) * 10)
    recipe = fakes.fake_recipe(precision="fp16", max_grad_norm=0.5)
    step = TrainStep(parts, 1, recipe, torch.device("cpu"))
    assert step.scaler is not None
    for _ in range(40):  # the scaler skips steps whose scaled gradients overflow, lowering its scale
        step(batch)
        change = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters(), strict=True)])
        if float(change.norm()) > 0:
            break
    assert step.scaler.get_scale() > 1  # the applied step's gradients were scaled
    # lr 1: the update is the clipped gradient, of norm 0.5 exactly (the raw gradient's norm is far
    # above); clipping the still-scaled gradients would have moved the weights by 0.5 / scale.
    assert float(change.norm()) == pytest.approx(0.5, rel=1e-3)


def test_after_step_hook_and_ema_weights_are_what_evaluation_scores(tmp_path):
    workload = fakes.ClippedEMA(scores=[0.1, 0.95], recipe=fakes.fake_recipe(max_grad_norm=1.0))
    result, _ = _run(tmp_path, workload)
    assert result.status == "success" and workload.seen["after_step"] == result.steps == 8
    ema = workload.seen["ema"]
    assert workload.seen["eval_models"] and all(m is ema for m in workload.seen["eval_models"])
    trained = workload.seen["model"].weight
    assert not torch.equal(ema.module.weight, trained)  # an average, not the last weights
    assert result.recipe["max_grad_norm"] == 1.0


# -- 8. a compiled evaluation forward, warmed up before run_start -----------------------------------
@pytest.mark.second_tier
def test_compiled_eval_forward_leaves_nothing_to_compile_after_run_start(tmp_path):
    from torch._dynamo.utils import counters

    workload = fakes.CompiledDecode(scores=[0.1, 0.2, 0.95],
                                    recipe=fakes.fake_recipe(compile=True, precision="bf16"))
    torch._dynamo.reset()
    result, _ = _run(tmp_path, workload)
    assert result.status == "success" and result.init_time_s > 0
    # Evaluation batches of 3 and then 1 (7 samples): no new graph once the clock ran.
    assert counters["stats"]["unique_graphs"] == workload.seen["graphs_at_run_start"] > 0
    assert set(workload.seen["eval_dtypes"]) == {torch.bfloat16}  # evaluated under the recipe's precision


def test_warm_up_restores_model_ema_and_optimizer(tmp_path):
    """Compilation runs training steps on synthetic data before run_start: nothing of them remains."""
    from trainperf.runtime import speedups

    workload = fakes.ClippedEMA(recipe=fakes.fake_recipe())
    ctx = RuntimeContext.create("cpu")
    recipe = workload.recipe("mini")
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets())
    def saved(module):  # tensors, and extra state such as the EMA's count of updates
        return {k: v.clone() if torch.is_tensor(v) else dict(v) for k, v in module.state_dict().items()}

    def same(a, b):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k]
                                            for k in a)

    before, ema_before = saved(parts.model), saved(parts.eval_model)
    speedups.warm_up(workload, recipe, ctx, parts, lambda: TrainStep(parts, 1, recipe, ctx.device), steps=3)
    assert workload.seen["after_step"] == 3
    assert same(before, saved(parts.model))
    assert same(ema_before, saved(parts.eval_model))
    assert parts.eval_model.updates == 0  # the warm-up's three updates are forgotten: the first real one copies
    assert not parts.optimizer.state


# -- 9. explicit seeds and assets -------------------------------------------------------------------
def test_the_seed_reaches_the_workload_explicitly_and_decides_the_run(tmp_path):
    def weights(seed: int) -> list[float]:
        workload = fakes.ObjectGather(fakes.fake_recipe(target=1.0, max_epochs=3, lr=0.05))
        result, _ = _run(tmp_path, workload, name=f"log-{seed}-{uuid.uuid4().hex[:4]}.txt", seed=seed)
        assert workload.seen["seed"] == seed
        return [float(workload.seen["model"].weight.detach()), float(workload.seen["model"].bias.detach())]

    assert weights(3) == weights(3)
    assert weights(3) != weights(4)


def test_build_reads_its_declared_asset(tmp_path):
    torch.manual_seed(1)
    start = nn.Linear(1, 1)
    torch.save(start.state_dict(), tmp_path / "start.pt")
    workload = fakes.WithAsset(scores=[0.95])
    result, _ = _run(tmp_path, workload, recipe=fakes.fake_recipe(lr=0.0))
    assert result.status == "success"
    assert torch.equal(workload.seen["model"].weight, start.weight)  # lr 0: still the checkpoint's


@pytest.mark.parametrize("content, message", [
    (None, "start.pt: missing (start checkpoint)"),
    (b"not a checkpoint", "start.pt: cannot load start checkpoint"),
])
def test_a_missing_or_broken_asset_is_one_line_naming_the_file(tmp_path, content, message):
    if content is not None:
        (tmp_path / "start.pt").write_bytes(content)
    result, records = _run(tmp_path, fakes.WithAsset(scores=[0.95]))
    assert result.status == "aborted" and message in result.abort_reason
    assert "\n" not in result.abort_reason and result.abort_reason.endswith("(during initialisation)")
    assert records[-1]["key"] == "run_stop"


def test_asset_errors_are_trainperf_errors():
    with pytest.raises(TrainperfError, match="was not declared"):
        Assets({})["backbone"]


def test_per_epoch_schedule_needs_the_epoch_length():
    from trainperf.contract import per_epoch_schedule

    schedule = per_epoch_schedule("fake", lambda steps: lambda step: step / steps)
    assert schedule(10)(5) == 0.5
    with pytest.raises(TrainperfError, match="^fake: the LR schedule is in epochs and needs the steps per epoch$"):
        schedule(None)


# -- hyperparameters: metadata, and values counted in iterations of the opened data ----------------
def test_logged_metadata_and_epoch_counted_hyperparameters_reach_the_log(tmp_path):
    result, records = _run(tmp_path, fakes.EpochCountedHyperparameters(scores=[1.0]))
    assert result.status == "success"
    length = next(r for r in records if r["key"] == "max_sequence_length")
    assert length["value"] == 7 and length["metadata"]["method"] == "discard"
    keys = [r["key"] for r in records]
    # Logged once, when the data is open: after run_start, with the data's steps per epoch (4).
    assert keys.count("remain_steps") == 1 and keys.index("remain_steps") > keys.index("run_start")
    assert next(r["value"] for r in records if r["key"] == "remain_steps") == 12
    assert next(r["value"] for r in records if r["key"] == "decay_interval") == 2


# -- the parallelism capability ----------------------------------------------------------------------
def test_a_workloads_parallelism_is_applied_by_its_engine_and_only_once(tmp_path, monkeypatch):
    from trainperf.runtime import parallel
    from trainperf.runtime.engine import Engine

    seen = []

    class Recording(Engine):
        def check(self, spec, recipe, ctx):
            seen.append(("check", spec.label))

        def apply(self, spec, parts, recipe, ctx):
            seen.append(("apply", spec.label, type(parts.model).__name__))
            return parts

    monkeypatch.setitem(parallel.ENGINES, "recorded", Recording())
    result, _ = _run(tmp_path, fakes.Distributed(scores=[0.5, 0.95]))
    assert result.status == "success"
    assert seen == [("check", "mine"), ("apply", "mine", "Linear")]


def test_ddp_and_torchrec_are_two_answers_of_the_same_capability():
    from trainperf.contract import DataParallel, FullyShard, ShardedTables
    from trainperf.runtime import parallel

    assert isinstance(parallel.engine_for(None), parallel.DDPEngine)  # a workload that says nothing
    assert isinstance(parallel.engine_for(DataParallel()), parallel.DDPEngine)
    assert isinstance(parallel.engine_for(ShardedTables()), parallel.TorchRecEngine)
    assert type(parallel.engine_for(FullyShard())).__name__ == "FSDPEngine"
    with pytest.raises(TrainperfError, match="parallelism 'recorded': no engine for it"):
        parallel.engine_for(fakes.Recorded())
    # TorchRec's engine compiles the dense modules around the sharded tables itself; the others leave the
    # whole model to the runtime.
    assert parallel.engine_for(ShardedTables()).compiles_model and not parallel.engine_for(None).compiles_model
    parallel.engine_for(ShardedTables()).check(ShardedTables(), fakes.fake_recipe(compile=True),
                                               RuntimeContext.create("cpu"))
