"""ResNet end to end through the CLI: the mini run reaches its target and its log passes the official
checker; the full-scale path runs on a tiny ImageNet-layout folder; aborted runs stay well-formed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import imagenet_folder, read_log
from trainperf.cli import main
from trainperf.results.compliance import check
from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload
from trainperf.workloads.resnet import data as D
from trainperf.workloads.resnet import images as resnet_images


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "resnet-mini"
    code = main(["run", "resnet", "--seed", "0", "--out", str(out), "--quiet"])
    assert code == 0
    return out


@pytest.mark.to_target
@pytest.mark.slow
def test_mini_reaches_target(mini_run):
    result = json.loads((mini_run / "result.json").read_text())
    assert result["status"] == "success"
    assert result["final_metric"] >= MINI_RECIPE.target
    assert result["evaluations"][-1]["value"] == result["final_metric"]
    assert result["epochs_to_target"] == result["evaluations"][-1]["epoch"] <= MINI_RECIPE.max_epochs
    assert result["train_samples"] == 1437 and result["eval_samples"] == 360
    assert result["samples_to_target"] == result["epochs_to_target"] * 1437
    assert 0 < result["time_to_train_s"] < 120
    assert result["recipe"]["name"] == "mini" and result["recipe"]["eval_every"] == 1
    assert result["environment"]["versions"]["mlperf-logging"]


@pytest.mark.slow
def test_mini_log_passes_official_checker(mini_run):
    verdict = check(mini_run / "mlperf_log.txt")
    assert verdict.valid, verdict.output
    assert (verdict.benchmark, verdict.division, verdict.ruleset) == ("resnet", "open", "1.0.0")
    records = read_log(mini_run / "mlperf_log.txt")
    keys = [r["key"] for r in records]
    for key in ("sgd_opt_base_learning_rate", "sgd_opt_end_learning_rate", "sgd_opt_weight_decay",
                "sgd_opt_momentum", "model_bn_span", "opt_learning_rate_warmup_epochs", "seed"):
        assert keys.count(key) == 1, key
    assert records[-1]["metadata"]["status"] == "success"


@pytest.mark.slow
def test_check_command_prints_the_verdict(mini_run, capsys):
    assert main(["check", str(mini_run / "mlperf_log.txt")]) == 0
    assert "SUCCESS" in capsys.readouterr().out


@pytest.mark.slow
def test_check_rejects_a_broken_log(mini_run, tmp_path, capsys):
    lines = (mini_run / "mlperf_log.txt").read_text().splitlines()
    broken = tmp_path / "broken.txt"
    broken.write_text("\n".join(line for line in lines if '"key": "run_start"' not in line) + "\n")
    assert main(["check", str(broken)]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.to_target
def test_aborted_run_log_is_well_formed(tmp_path, capsys):
    out = tmp_path / "aborted"
    code = main(["run", "resnet", "--seed", "0", "--out", str(out), "--quiet", "--set", "max_epochs=1"])
    assert code == 1
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "aborted" and "within 1 epochs" in result["abort_reason"]
    records = read_log(out / "mlperf_log.txt")
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
    verdict = check(out / "mlperf_log.txt")
    assert verdict.valid, verdict.output


@pytest.mark.second_tier
def test_sigint_mid_run_leaves_aborted_log(tmp_path):
    out = tmp_path / "interrupted"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trainperf", "run", "resnet", "--seed", "1", "--out", str(out),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    log = out / "mlperf_log.txt"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and '"epoch_start"' in log.read_text()):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr  # interrupted: docs/commands.md#exit-codes
    assert "Traceback" not in stderr
    records = read_log(log)
    assert records[-1]["key"] == "run_stop"
    assert records[-1]["metadata"]["status"] == "aborted"
    assert records[-1]["metadata"]["reason"] == "received SIGINT"
    assert json.loads((out / "result.json").read_text())["status"] == "aborted"


@pytest.mark.slow
def test_full_path_on_tiny_imagenet_folder(tmp_path):
    data = imagenet_folder(tmp_path / "imagenet")
    out = tmp_path / "full"
    code = main(["run", "resnet", "--scale", "full", "--data", str(data), "--seed", "0", "--out", str(out),
                 "--quiet", "--division", "open", "--set", "global_batch_size=4", "--set", "max_epochs=1",
                 "--set", "eval_first=1", "--set", "num_workers=2", "--set", "image_size=64",
                 "--set", "eval_resize=73", "--set", "eval_batch_size=3"])
    assert code == 1  # a ResNet-50 does not reach 75.9% in one step on noise
    result = json.loads((out / "result.json").read_text())
    assert result["epochs"] == 1 and result["samples"] == 8
    assert result["train_samples"] == 8 and result["eval_samples"] == 4
    assert len(result["evaluations"]) == 1 and 0.0 <= result["final_metric"] <= 1.0
    assert result["recipe"]["model"] == "resnet50" and result["recipe"]["optimizer"] == "lars"
    records = read_log(out / "mlperf_log.txt")
    keys = [r["key"] for r in records]
    for key in ("lars_opt_base_learning_rate", "lars_opt_end_learning_rate", "lars_epsilon",
                "lars_opt_learning_rate_decay_poly_power", "lars_opt_learning_rate_decay_steps",
                "lars_opt_learning_rate_warmup_epochs", "lars_opt_momentum", "lars_opt_weight_decay"):
        assert keys.count(key) == 1, key
    assert check(out / "mlperf_log.txt").valid


@pytest.mark.parametrize("name", list(ResNetWorkload().recipes("full")))
def test_the_batch_norm_span_is_the_per_process_batch(name):
    workload = ResNetWorkload()
    recipe = workload.recipe("full", name)
    hp = workload.mlperf_hyperparameters(recipe, type("Ctx", (), {"world_size": 8})())
    assert hp["model_bn_span"] == recipe.global_batch_size // 8


def test_prepare_mini_writes_imagenet_layout(tmp_path, capsys):
    root = tmp_path / "mini"
    assert main(["prepare", "resnet", "--data", str(root)]) == 0
    train = D.scan_split(root, "train")
    val = D.scan_split(root, "val", train.classes)
    assert train.classes == [f"n{d:08d}" for d in range(10)]
    assert (len(train.paths), len(val.paths)) == (1437, 360)
    assert all(p.suffix == ".JPEG" for p in train.paths[:20])
    assert tuple(resnet_images.decode(train.paths[0]).shape) == (3, 32, 32)
    assert not (set(p.name for p in train.paths) & set(p.name for p in val.paths))
    assert main(["prepare", "resnet", "--data", str(root)]) == 0
    assert "already present" in capsys.readouterr().out


def test_prepare_full_reports_what_is_missing(tmp_path, capsys):
    data = imagenet_folder(tmp_path / "imagenet")
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "8 train images in 2 classes, 4 val images" in out and "ILSVRC-2012 has 1281167" in out


@pytest.mark.slow
def test_verify_lists_bad_images_in_parallel_and_the_run_skips_them(tmp_path, capsys):
    data = imagenet_folder(tmp_path / "imagenet", train_per_class=4, val_per_class=3)
    corrupt = data / "train" / "n01440761" / "n01440761_2.JPEG"
    corrupt.write_bytes(b"not an image at all")
    truncated = data / "val" / "n01440760" / "n01440760_1.JPEG"
    truncated.write_bytes(truncated.read_bytes()[:300])  # a valid header, the data cut short
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(data), "--verify", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{corrupt}: cannot identify image file" in out and f"{truncated}: Truncated File Read" in out
    assert "2 unreadable sample(s)" in out and "2 images that do not decode are skipped" in out
    run_dir = tmp_path / "run"
    assert main(["run", "resnet", "--scale", "full", "--data", str(data), "--out", str(run_dir), "--quiet",
                 "--set", "num_workers=2", "--set", "global_batch_size=4", "--set", "max_epochs=1",
                 "--set", "eval_first=1", "--set", "image_size=32", "--set", "eval_resize=36"]) == 1
    result = json.loads((run_dir / "result.json").read_text())
    assert result["abort_reason"].startswith("target top1")
    assert result["train_samples"] == 7  # 8 train images, the corrupt one skipped
    assert result["eval_samples"] == 5  # 6 val images, the truncated one skipped
    # The folder changes: the list no longer describes it, and nothing trains on a stale list.
    (data / "val" / "n01440761" / "extra.JPEG").write_bytes((data / "val" / "n01440761" / "n01440761_0.JPEG")
                                                           .read_bytes())
    capsys.readouterr()
    assert main(["run", "resnet", "--scale", "full", "--data", str(data), "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed since it was verified" in err[0] and "--verify again" in err[0]


@pytest.mark.slow
def test_a_file_name_that_is_not_utf8_is_verified_listed_and_skipped(tmp_path, capsys):
    """A name with a byte that is not UTF-8 (Latin-1 'ÿ'): --verify lists it (as a Python literal), the
    list stays readable, and a plain prepare does not ask for --verify again (it used to: a loop)."""
    data = imagenet_folder(tmp_path / "imagenet")
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(data), "--verify", "--workers", "1"]) == 0
    folder = data / "train" / "n01440760"
    Path(os.fsdecode(os.fsencode(folder) + b"/n01440760_\xff.JPEG")).write_bytes(b"not an image")
    capsys.readouterr()
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(data), "--verify", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "n01440760_\\udcff.JPEG" in out and "1 unreadable sample(s)" in out
    assert main(["prepare", "resnet", "--scale", "full", "--data", str(data)]) == 0
    assert "1 images that do not decode are skipped" in capsys.readouterr().out


def test_lars_decay_steps_are_logged_in_steps_as_the_reference_logs_them():
    """`lars_opt_learning_rate_decay_steps` counts optimizer steps (the 1.1.0 RCPs: 14,523 at batch 3,264),
    not epochs (37): each full LARS recipe's logged value is its schedule's decay length, within the partial
    last batch of each epoch of the RCP's (steps here are ceil(samples / batch) an epoch)."""
    import math

    import mlperf_logging
    import torch

    from trainperf.contract import RuntimeContext

    rcps = json.loads((Path(mlperf_logging.__file__).parent / "rcp_checker" / "training_1.1.0"
                       / "rcps_resnet.json").read_text())
    workload = ResNetWorkload()
    compared = 0
    for name, recipe in workload.recipes("full").items():
        hyper = workload.mlperf_hyperparameters(recipe, RuntimeContext(device=torch.device("meta")))
        assert not any(key.endswith("decay_steps") for key in hyper), name  # logged once the data is open
        with torch.device("meta"):
            parts = workload.build(recipe, RuntimeContext(device=torch.device("meta")), {})
        steps_per_epoch = math.ceil(1_281_167 / recipe.global_batch_size)
        logged = parts.epoch_hyperparameters(steps_per_epoch)[f"{recipe.optimizer}_opt_learning_rate_decay_steps"]
        decay_epochs = recipe.train_epochs - recipe.warmup_epochs
        assert logged == pytest.approx(decay_epochs * steps_per_epoch, abs=1)
        rcp = rcps.get(f"resnet_ref_{recipe.global_batch_size}")
        if rcp and recipe.optimizer == "lars":
            assert abs(logged - rcp["Hyperparams"]["opt_learning_rate_decay_steps"]) <= decay_epochs + 1, name
            compared += 1
    assert compared >= 3
