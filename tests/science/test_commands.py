"""tune-batch, predict and scale --project end to end on this machine (CPU, gloo)."""

from __future__ import annotations

import json

import pytest

from trainperf import cli
from trainperf.errors import TrainperfError
from trainperf.science import tune


@pytest.mark.second_tier
def test_tune_batch_measures_each_batch_and_recommends_the_fastest(tmp_path, capsys):
    out = tmp_path / "tune"
    code = cli.main(["tune-batch", "resnet", "--batch-sizes", "32,64", "--runs", "1", "--steps", "3", "--warmup",
                     "1", "--out", str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "batch 64: global_batch_size 32 -> 64, base_lr 0.2 -> 0.4" in printed  # the linear rule, stated
    study = json.loads((out / "tune.json").read_text())
    rows = {r["batch"]: r for r in study["rows"]}
    assert set(rows) == {32, 64} and study["lr_rule"] == "linear" and study["base_batch"] == 32
    for batch, r in rows.items():
        assert r["samples_per_s"] > 0 and r["time_per_iteration_ms"] == pytest.approx(
            batch / r["samples_per_s"] * 1e3)
        if r["converged"]:
            # Iterations per epoch halve with the batch; total iterations = epochs x iterations per epoch.
            assert r["total_iterations"] == pytest.approx(r["epochs_to_converge"] * r["iterations_per_epoch"],
                                                          rel=0.05)
            assert r["predicted_s"] == pytest.approx(r["total_iterations"] * r["time_per_iteration_ms"] / 1e3)
    assert rows[32]["iterations_per_epoch"] == pytest.approx(2 * rows[64]["iterations_per_epoch"], rel=0.05)
    assert study["recommended"] in (32, 64, None) and "fastest to train" in study["verdict"] or \
        "no batch size" in study["verdict"]
    assert (out / "tune.png").stat().st_size > 1000 and (out / "tune.csv").is_file()
    with pytest.raises(TrainperfError, match="at least two distinct"):
        tune.parse_batches("64")


@pytest.mark.slow
def test_predict_full_from_a_short_synthetic_bench(tmp_path, capsys):
    code = cli.main(["predict", "resnet", "--scale", "full", "--bench-batch", "2", "--steps", "2", "--warmup", "1",
                     "--device", "cpu", "--json", str(tmp_path / "p.json")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["converge_source"] == "reference point" and p["ruleset"] == "1.0.0"
    assert "synthetic batches: data loading not included" in p["throughput_source"]
    assert p["time_to_train_s"] == pytest.approx(p["samples_to_train"] / p["samples_per_s"] + p["evaluations"]
                                                 * p["eval_s"])
    assert "initialization: excluded" in printed and "band" in printed
    assert cli.main(["predict", "resnet", "--scale", "mini"]) == 2
    assert cli.main(["predict", "transformer", "--samples-per-s", "100"]) == 2  # no RCPs in 0.7.0: --epochs needed
    assert "--epochs" in capsys.readouterr().err
    assert cli.main(["predict", "transformer", "--samples-per-s", "100", "--epochs", "3"]) == 0


@pytest.mark.second_tier
def test_scale_project_with_a_measured_link_between_two_processes(tmp_path, capsys):
    out = tmp_path / "proj"
    code = cli.main(["scale", "ncf", "--project", "1,2,4", "--steps", "3", "--warmup", "1", "--out", str(out),
                     "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    study = json.loads((out / "projection.json").read_text())
    assert study["link"]["source"].startswith("measured: all_reduce") and study["link"]["bandwidth_gbs"] > 0
    assert [r["devices"] for r in study["rows"]] == [1, 2, 4] and study["rows"][0]["speedup"] == 1.0
    assert study["gradient_bytes"] > 0 and (out / "projection.png").is_file() and (out / "allreduce.json").is_file()


@pytest.mark.slow
def test_scale_project_another_device_from_counted_flops(tmp_path, capsys):
    out = tmp_path / "proj"
    code = cli.main(["scale", "resnet", "--scale", "full", "--project", "1,8", "--batch-size", "256", "--peak-tflops",
                     "125", "--mfu", "0.35", "--bandwidth", "150", "--latency", "10", "--bench-batch", "1", "--out",
                     str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    study = json.loads((out / "projection.json").read_text())
    one, eight = study["rows"]
    # ResNet-50 at 224 px: 4.1 GMAC forward = 8.2 GFLOP, x 3 with backward; 25.6 M parameters, 102 MB of fp32 gradients.
    assert 22e9 < study["compute_s"] * 125e12 * 0.35 / 256 < 27e9
    assert 100e6 < study["gradient_bytes"] < 105e6
    assert one["global_batch"] == 256 and eight["global_batch"] == 2048
    assert one["epochs_source"].startswith("RCP 1.0.0") and eight["epochs"] > one["epochs"]
    assert 6 < eight["speedup"] < 8
    assert cli.main(["scale", "resnet", "--project", "1,2", "--mfu", "0.3"]) == 2
