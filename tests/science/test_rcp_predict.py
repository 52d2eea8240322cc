"""Epochs to converge from the official RCP files, and the time-to-train prediction, checked against
the checker's own statistics and against published NVIDIA v1.0 logs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from mlperf_logging.rcp_checker import rcp_checker

from trainperf import registry
from trainperf.contract import Cadence
from trainperf.errors import TrainperfError
from trainperf.science import predict
from trainperf.science.rcp import epochs_to_converge

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "mlperf-results-v1.0" / "NVIDIA" / "results"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures is not here (a user's clone)")


def _reference_runs(benchmark: str, batch: int) -> list[float]:
    path = Path(os.path.dirname(rcp_checker.__file__)) / "training_1.0.0" / f"rcps_{benchmark}.json"
    return next(sorted(r["Epochs to converge"]) for r in json.loads(path.read_text()).values() if r["BS"] == batch)


def test_a_reference_batch_gives_the_olympic_mean_of_its_reference_runs():
    runs = _reference_runs("resnet", 3264)
    conv = epochs_to_converge("resnet", "1.0.0", 3264)
    assert conv.how == "reference point"
    assert conv.mean == pytest.approx(np.mean(runs[1:-1])) and conv.stdev == pytest.approx(np.std(runs))
    # SSD at 2048 is a reference point the checker prunes (slower than its neighbours' line): the runs win.
    assert epochs_to_converge("ssd", "1.0.0", 2048).mean == pytest.approx(np.mean(_reference_runs("ssd", 2048)[1:-1]))


def test_between_reference_batches_the_checker_interpolates_and_so_do_we():
    checker = rcp_checker.RCP_Checker("training", "1.0.0", "resnet", False)
    low, high = checker._find_top_min_rcp(3000, "pruned_rcps"), checker._find_bottom_max_rcp(3000, "pruned_rcps")
    _, official = checker._create_interp_rcp(3000, low, high)
    conv = epochs_to_converge("resnet", "1.0.0", 3000)
    assert conv.how == "interpolated" and conv.mean == pytest.approx(official["RCP Mean"])
    # Seed 004's SSD table: larger batches need more epochs (1024: 50, 2048: 65, 4096: 90; the RCP mean at 4096 is 87).
    means = [epochs_to_converge("ssd", "1.0.0", b).mean for b in (1024, 2048, 3072, 4096)]
    assert means == sorted(means) and means[0] == pytest.approx(50) and means[-1] == pytest.approx(87)


def test_outside_the_reference_batches_it_says_so():
    assert epochs_to_converge("resnet", "1.0.0", 256).how == "below the smallest reference batch"
    assert epochs_to_converge("resnet", "1.0.0", 10**6).how == "extrapolated"
    # DLRM, retired from the checker's run-count table, still reads (its RCPs are epoch_num, 1-based).
    assert epochs_to_converge("dlrm", "1.0.0", 55296).mean == pytest.approx(1.9, abs=0.01)
    with pytest.raises(TrainperfError, match="no reference convergence points for gnmt"):
        epochs_to_converge("gnmt", "0.7.0", 1024)


def test_convergence_points_become_samples_in_the_logs_convention():
    assert predict.samples_at(35, "epochs", 1000) == 35_000
    assert predict.samples_at(1.9, "1+epochs", 1000) == pytest.approx(900)
    assert predict.samples_at(2_500_000, "samples", None) == 2_500_000
    # Evaluations a converging run goes through: ResNet evaluates after epochs 3, 7, 11, ... (every 4 from 3).
    resnet = Cadence(every=4, first=3, max_epochs=40)
    assert predict.evaluations_until(resnet, 35 * 1000, 1000) == 9
    assert predict.evaluations_until(Cadence(per_epoch=20, max_epochs=1), 0.9 * 1000, 1000) == 18
    assert predict.evaluations_until(Cadence(every_samples=100, max_samples=10**6), 1050, None) == 11


def test_a_prediction_is_rcp_samples_over_throughput_plus_evaluations():
    workload = registry.get("resnet")
    recipe = workload.recipe("full")
    p = predict.predict(workload, recipe, 8, samples_per_s=20_000.0, throughput_source="given", spread=0.1)
    conv = epochs_to_converge("resnet", "1.0.0", recipe.global_batch_size)
    assert p.samples_to_train == pytest.approx(conv.mean * 1_281_167)
    assert p.eval_s == pytest.approx(50_000 / (3 * 20_000))
    assert p.time_to_train_s == pytest.approx(p.samples_to_train / 20_000 + p.evaluations * p.eval_s)
    assert p.low_s < p.time_to_train_s < p.high_s
    with pytest.raises(TrainperfError, match="--epochs"):
        predict.predict(registry.get("gnmt"), registry.get("gnmt").recipe("full"), 1, 1000.0, "given")


@needs_fixtures
@pytest.mark.parametrize(("workload", "folder"), [("resnet", "dgxa100_ngc21.05_mxnet/resnet"),
                                                  ("dlrm", "dgxa100_ngc21.05_merlin_hugectr/dlrm")])
def test_published_runs_are_predicted_from_their_own_throughput_and_the_rcps(workload, folder):
    checks = [predict.check_log(f, registry.get(workload)) for f in sorted((FIXTURES / folder).glob("result_*.txt"))]
    converged = [c for c in checks if c.converged]
    # ResNet's result_1 ran out of epochs at 0.7584 (aborted): its time is no time-to-train.
    assert len(checks) == 5 and len(converged) == (4 if workload == "resnet" else 5)
    for c in converged:
        # Measured: 1710.7-1729.7 s (ResNet), 116.9-124.2 s (DLRM); errors -1.6..-0.7 % and -5.3..-0.1 %.
        assert abs(c.error) < 0.06, c
        assert abs(c.error_own_epochs) < 0.03, c
    assert np.mean([abs(c.error) for c in converged]) < 0.02
