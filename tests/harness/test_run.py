"""The MLPerf event sequence and clock rules of the harness, on a tiny fake workload."""

from __future__ import annotations

import dataclasses
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import read_log
from trainperf.contract import DataParts, EvalPartial, Metric, MLPerf, ModelParts, Recipe, RuntimeContext, Workload
from trainperf.errors import TrainperfError
from trainperf.harness import RunConfig, run


@dataclass(frozen=True)
class FakeRecipe(Recipe):
    lr: float = 0.1


class FakeWorkload(Workload):
    """Regression of y = 2x; the 'metric' is a scripted sequence so tests control when it converges."""

    name = "fake"
    benchmark = "resnet"
    mlperf = MLPerf(ruleset="1.0.0", runs=5)
    metric = Metric("score")
    summary = "test double"
    speedups = frozenset({"precision", "async_eval"})

    def __init__(self, scores: list[float], on_step: Any = None, fail_load: bool = False,
                 nan_at_epoch: int | None = None) -> None:
        self.scores = list(scores)
        self.on_step = on_step
        self.fail_load = fail_load
        self.nan_at_epoch = nan_at_epoch
        self.data_touched_before_run_start = False

    def recipes(self, scale: str) -> dict[str, Recipe]:
        return {"t": FakeRecipe(name="t", global_batch_size=4, max_epochs=8, target=0.9, eval_every=2,
                                eval_first=1)}

    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        return []

    def prepare(self, scale: str, data_dir: Path, say: Any) -> None:
        pass

    def mlperf_hyperparameters(self, recipe: Recipe, ctx: Any) -> dict[str, Any]:
        return {"opt_name": "sgd", "opt_base_learning_rate": recipe.lr}

    def build(self, recipe: Recipe, ctx: Any, assets: Any) -> ModelParts:
        model = nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=recipe.lr)
        nan_at = self.nan_at_epoch
        state = {"epoch": 0}
        self._state = state

        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            x, y = batch
            loss = ((m(x) - y) ** 2).mean()
            if nan_at is not None and state["epoch"] >= nan_at:
                loss = loss * float("nan")
            return loss

        return ModelParts(model=model, optimizer=opt, loss_fn=loss_fn, lr_schedule=lambda spe: (lambda s: 1.0),
                          eval_forward=lambda m, batch: m(batch))

    def synthetic_batch(self, recipe: Recipe, ctx: Any, model: Any = None) -> Any:
        return torch.zeros(4, 1), torch.zeros(4, 1)

    def load_data(self, recipe: Recipe, data_dir: Path, ctx: Any) -> DataParts:
        if self.fail_load:
            raise TrainperfError(f"{data_dir}/broken.JPEG: cannot decode image")
        x = torch.linspace(-1, 1, 16).unsqueeze(1)
        y = 2 * x
        scores = iter(self.scores)

        def batches(view):
            epoch = view.epoch
            self._state["epoch"] = epoch
            for i in range(0, 16, 4):
                if self.on_step:
                    self.on_step(epoch, i)
                yield x[i:i + 4], y[i:i + 4]

        def evaluate(forward) -> EvalPartial:
            forward(x)
            return EvalPartial(metric=lambda totals: totals["score"].item(),
                               sums={"score": torch.tensor(next(scores), dtype=torch.float64)})

        return DataParts(train_batches=batches, steps_per_epoch=4, train_samples=16, eval_samples=8,
                         evaluate=evaluate)


def _run(tmp_path: Path, workload: FakeWorkload, **overrides: Any):
    recipe = workload.recipe("mini")
    if overrides:
        recipe = recipe.with_overrides(f"{k}={v}" for k, v in overrides.items())
    log = tmp_path / "log.txt"
    cfg = RunConfig(workload=workload, recipe=recipe, scale="mini", data_dir=tmp_path, seed=7, log_path=log)
    return run(cfg, RuntimeContext.create("cpu")), read_log(log)


def _keys(records: list[dict]) -> list[str]:
    return [r["key"] for r in records]


def test_event_sequence_and_clock(tmp_path):
    result, records = _run(tmp_path, FakeWorkload(scores=[0.2, 0.5, 0.95]))
    keys = _keys(records)
    assert result.status == "success"
    # Header first, in MLPerf order; then init; then the timed region.
    assert keys[0] == "cache_clear"
    assert keys.index("init_start") > max(keys.index(k) for k in (
        "submission_org", "submission_platform", "submission_division", "submission_status",
        "submission_benchmark"))
    for key in ("seed", "global_batch_size", "gradient_accumulation_steps", "opt_name",
                "opt_base_learning_rate"):
        assert keys.index("init_start") < keys.index(key) < keys.index("init_stop")
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("train_samples")
    assert keys.index("eval_samples") < keys.index("block_start")
    assert keys[-1] == "run_stop"
    for key in ("init_start", "init_stop", "run_start", "run_stop", "seed", "train_samples", "eval_samples"):
        assert keys.count(key) == 1, key
    # Timestamps never go backwards; time-to-train is run_stop - run_start from the log's clock.
    times = [r["time_ms"] for r in records]
    assert times == sorted(times)
    start = next(r for r in records if r["key"] == "run_start")["time_ms"]
    stop = next(r for r in records if r["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success"
    assert result.time_to_train_s == pytest.approx((stop["time_ms"] - start) / 1000.0)
    # Schedule every 2 from epoch 1: evals after epochs 1, 3, 5; blocks [1], [2,3], [4,5].
    evals = [r["metadata"]["epoch_num"] for r in records if r["key"] == "eval_accuracy"]
    assert evals == [1, 3, 5]
    blocks = [(r["metadata"]["first_epoch_num"], r["metadata"]["epoch_count"])
              for r in records if r["key"] == "block_start"]
    assert blocks == [(1, 1), (2, 2), (4, 2)]
    epochs = [r["metadata"]["epoch_num"] for r in records if r["key"] == "epoch_start"]
    assert epochs == [1, 2, 3, 4, 5]
    assert [r["metadata"]["epoch_num"] for r in records if r["key"] == "epoch_stop"] == epochs
    assert result.epochs_to_target == 5 and result.samples_to_target == 5 * 16
    assert [e.value for e in result.evaluations] == [0.2, 0.5, 0.95]


def test_epoch_budget_exhausted_is_aborted(tmp_path):
    result, records = _run(tmp_path, FakeWorkload(scores=[0.1] * 10), max_epochs=3)
    assert result.status == "aborted"
    assert result.abort_reason == "target score >= 0.9 not reached within 3 epochs"
    stop = records[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted"
    # Budget 3 with evals at 1, 3: the last block is cut at the budget and still evaluated.
    assert [r["metadata"]["epoch_num"] for r in records if r["key"] == "eval_accuracy"] == [1, 3]


def test_non_finite_loss_aborts(tmp_path):
    result, records = _run(tmp_path, FakeWorkload(scores=[0.1] * 10, nan_at_epoch=2))
    assert result.status == "aborted"
    assert result.abort_reason == "non-finite training loss in epoch 2"
    assert records[-1]["metadata"]["status"] == "aborted"


def test_a_non_finite_loss_says_the_workloads_likely_cause(tmp_path):
    class WithoutWeights(FakeWorkload):
        def divergence_hint(self, recipe, scale):
            return f"expected at {scale} scale without --set backbone_weights=PATH"

    result, records = _run(tmp_path, WithoutWeights(scores=[0.1] * 10, nan_at_epoch=2))
    assert result.abort_reason == ("non-finite training loss in epoch 2 (expected at mini scale without "
                                   "--set backbone_weights=PATH)")
    assert records[-1]["metadata"]["reason"] == result.abort_reason


@pytest.mark.parametrize("name", ["maskrcnn", "retinanet", "ssd"])
def test_the_detectors_name_backbone_weights_when_a_full_run_diverges(name):
    from trainperf import registry

    workload = registry.get(name)
    for recipe in workload.recipes("full").values():
        assert "--set backbone_weights=PATH" in workload.divergence_hint(recipe, "full")
        assert workload.divergence_hint(recipe.with_overrides(["backbone_weights=/w.pt"]), "full") is None
    assert workload.divergence_hint(workload.recipe("mini"), "mini") is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_aborts_with_valid_log(tmp_path, sig):
    def on_step(epoch: int, i: int) -> None:
        if epoch == 2 and i == 8:
            os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    result, records = _run(tmp_path, FakeWorkload(scores=[0.1] * 10, on_step=on_step))
    assert result.status == "aborted"
    assert result.abort_reason == f"received {sig.name}"
    assert records[-1]["key"] == "run_stop"
    assert records[-1]["metadata"] == {**records[-1]["metadata"], "status": "aborted"}
    # The handler that was there before the run is restored afterwards.
    assert signal.getsignal(sig) is before


def test_signal_after_the_loop_waits_for_the_result_then_is_delivered(tmp_path):
    """A launcher stops the surviving ranks with SIGTERM while rank 0 is closing its run: the log's
    run_stop and the result file come first, then the signal reaches the handler that was there."""
    delivered: list[int] = []
    saved: list[str] = []

    def on_result(result: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        saved.append(result.status)

    workload = FakeWorkload(scores=[0.95])
    cfg = RunConfig(workload=workload, recipe=workload.recipe("mini"), scale="mini", data_dir=tmp_path, seed=7,
                    log_path=tmp_path / "log.txt")
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: delivered.append(signum))
    try:
        result = run(cfg, RuntimeContext.create("cpu"), on_result=on_result)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.status == "success" and saved == ["success"]
    assert delivered == [signal.SIGTERM]
    records = read_log(tmp_path / "log.txt")
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "success"


def test_data_error_in_timed_region_closes_the_log(tmp_path):
    result, records = _run(tmp_path, FakeWorkload(scores=[], fail_load=True))
    assert result.status == "aborted"
    assert "broken.JPEG: cannot decode image" in result.abort_reason
    keys = _keys(records)
    assert keys.index("run_start") < keys.index("run_stop")


def test_schedule_is_recorded_in_the_result(tmp_path):
    result, _ = _run(tmp_path, FakeWorkload(scores=[0.95]))
    assert result.recipe["eval_every"] == 2 and result.recipe["eval_first"] == 1
    env = result.environment
    assert env["versions"]["torch"] == torch.__version__
    assert env["cpu_count"] == os.cpu_count() and env["platform"]


@pytest.mark.slow
def test_async_eval_overlaps_training_and_stops_when_target_known(tmp_path):
    import threading
    import time as _time

    started = threading.Event()

    class SlowEval(FakeWorkload):
        def load_data(self, recipe, data_dir, ctx):
            data = super().load_data(recipe, data_dir, ctx)
            inner = data.evaluate

            def slow(forward):
                partial = inner(forward)
                metric = partial.metric

                def slow_metric(totals):
                    started.set()
                    _time.sleep(0.3)  # scoring long enough for training to go on meanwhile
                    return metric(totals)

                partial.metric = slow_metric
                return partial

            data.evaluate = slow
            return data

        def recipes(self, scale):
            return {"t": FakeRecipe(name="t", global_batch_size=4, max_epochs=12, target=0.9, eval_every=1,
                                    eval_first=1, async_eval=True)}

    def on_step(epoch, i):
        _time.sleep(0.01)

    result, records = _run(tmp_path, SlowEval(scores=[0.1, 0.5, 0.95, 0.97, 0.99] + [0.99] * 10, on_step=on_step))
    keys = _keys(records)
    assert result.status == "success"
    first_eval_stop = keys.index("eval_stop")
    assert keys.index("epoch_start", keys.index("eval_start")) < first_eval_stop  # training went on
    evals = [(r["metadata"]["epoch_num"], r["value"]) for r in records if r["key"] == "eval_accuracy"]
    assert evals == [(e, v) for e, v in zip(range(1, 4), [0.1, 0.5, 0.95], strict=True)]
    assert result.epochs_to_target == 3 and records[-1]["metadata"]["status"] == "success"
    assert result.recipe["async_eval"] is True


def test_async_eval_results_pending_at_budget_end_still_count(tmp_path):
    class LastEvalPasses(FakeWorkload):
        def recipes(self, scale):
            return {"t": FakeRecipe(name="t", global_batch_size=4, max_epochs=2, target=0.9, eval_every=1,
                                    eval_first=1, async_eval=True)}

    result, records = _run(tmp_path, LastEvalPasses(scores=[0.1, 0.95]))
    assert result.status == "success" and result.epochs_to_target == 2
    assert [r["key"] for r in records][-1] == "run_stop"


@pytest.mark.parametrize("per_epoch", [4, 8])
def test_evaluations_inside_an_epoch_stop_mid_epoch_and_close_it(tmp_path, per_epoch):
    """evals_per_epoch: evaluations after steps 1, 2, 3 of each 4-step epoch (8 per epoch cannot
    fit more, and none repeats the end-of-epoch one); a target met mid-epoch closes epoch and block."""
    workload = FakeWorkload([0.1, 0.2, 0.3, 0.4, 0.95])
    result, records = _run(tmp_path, workload, evals_per_epoch=per_epoch)
    assert result.status == "success"
    assert [e.epoch for e in result.evaluations] == [0.25, 0.5, 0.75, 1, 1.25]
    assert result.epochs_to_target == 1.25 and result.epochs == 1 and result.samples == 20
    evals = [r["metadata"]["epoch_num"] for r in records if r["key"] == "eval_accuracy"]
    assert evals == [0.25, 0.5, 0.75, 1, 1.25]
    keys = _keys(records)
    assert keys.count("epoch_start") == keys.count("epoch_stop") == 2
    assert keys.count("block_start") == keys.count("block_stop") == 2
    assert keys.index("run_stop") == len(keys) - 1 and keys[-2] == "block_stop"


def test_a_full_disk_ends_the_run_at_the_first_failed_write_in_one_line(tmp_path, monkeypatch, capsys):
    """As a full disk does it: the log's file takes 20 records, then every write fails with ENOSPC."""
    import errno
    import logging

    class FullAfter:
        def __init__(self, stream, room: int) -> None:
            self.stream, self.room = stream, room

        def write(self, text: str) -> int:
            if text.strip():
                self.room -= 1
            if self.room < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.stream.write(text)

        def __getattr__(self, name: str):
            return getattr(self.stream, name)

    real_open = logging.FileHandler._open
    monkeypatch.setattr(logging.FileHandler, "_open", lambda self: FullAfter(real_open(self), 20))
    result, records = _run(tmp_path, FakeWorkload(scores=[0.1] * 10))
    assert result.status == "aborted"
    assert result.abort_reason.startswith(f"{tmp_path / 'log.txt'}: cannot write the MLPerf log "
                                          "(No space left on device)")
    assert len(records) == 20  # what was written before is kept
    assert "Logging error" not in capsys.readouterr().err


def test_an_empty_evaluation_set_ends_the_run_before_training(tmp_path, monkeypatch):
    """The backstop behind the data checks: a workload with a fixed evaluation set that opens none."""
    workload = FakeWorkload(scores=[0.95])
    monkeypatch.setattr(type(workload), "mlperf", dataclasses.replace(workload.mlperf, full_eval_samples=100))
    load = workload.load_data
    monkeypatch.setattr(workload, "load_data", lambda *a: dataclasses.replace(load(*a), eval_samples=0))
    result, records = _run(tmp_path, workload)
    assert result.status == "aborted" and "the evaluation set is empty" in result.abort_reason
    assert "\n" not in result.abort_reason and not result.evaluations
