"""Data parallelism on 2 gloo processes (CPU), started through torch's elastic launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import build_parts, launch, read_log, score
from trainperf.cli import main
from trainperf.contract import ModelParts, RuntimeContext
from trainperf.results.compliance import check
from trainperf.runtime import distributed, speedups
from trainperf.runtime.slurm import sbatch_script
from trainperf.runtime.step import TrainStep

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


# -- functions run inside the launched processes (module level: spawn pickles them by name) ------
def _sharded_top1(data_dir: str) -> tuple[float, int]:
    from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload

    ctx = distributed.init_from_env("cpu")
    try:
        workload = ResNetWorkload()
        recipe = MINI_RECIPE.with_overrides(["global_batch_size=4"])
        torch.manual_seed(3)
        parts = build_parts(workload, recipe, ctx)
        data = workload.load_data(recipe, Path(data_dir), ctx)
        parts.model.eval()
        partial = data.evaluate(speedups.evaluate_with(parts, recipe, ctx.device))
        combined = ctx.combine(partial)
        verdict = (partial.metric(combined), int(combined["count"])) if ctx.is_main else None
        # Every rank learns rank 0's verdict, as the harness shares it.
        return ctx.broadcast_object(verdict)
    finally:
        distributed.shutdown()


def _tiny_parts() -> ModelParts:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

    def loss_fn(m: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)

    return ModelParts(model=model, optimizer=opt, loss_fn=loss_fn, lr_schedule=lambda spe: (lambda s: 1.0))


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def _one_ddp_step() -> list[torch.Tensor]:
    ctx = distributed.init_from_env("cpu")
    try:
        parts = distributed.wrap_data_parallel(_tiny_parts(), ctx)
        x, y = _global_batch()
        mine = ctx.shard(x.shape[0])
        TrainStep(parts, steps_per_epoch=1)((x[mine.start:mine.stop], y[mine.start:mine.stop]))
        return [p.detach().clone() for p in parts.model.module.parameters()]
    finally:
        distributed.shutdown()


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.second_tier
def test_sharded_evaluation_equals_single_process_on_odd_eval_set(tmp_path):
    from tests.conftest import imagenet_folder
    from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload

    data = imagenet_folder(tmp_path / "d", classes=3, train_per_class=2, val_per_class=3, size=(32, 32))
    (data / "val" / "n01440762" / "n01440762_2.JPEG").unlink()  # 8 val images ...
    (data / "val" / "n01440761" / "n01440761_2.JPEG").unlink()  # ... 7: odd, uneven shards
    workload = ResNetWorkload()
    recipe = MINI_RECIPE.with_overrides(["global_batch_size=4"])
    ctx = RuntimeContext.create("cpu")
    torch.manual_seed(3)
    parts = build_parts(workload, recipe, ctx)
    single = score(parts, workload.load_data(recipe, data, ctx), recipe, ctx)
    results = launch(_sharded_top1, str(data))
    assert results[0] == results[1] == (single, 7)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_one_step_equals_one_process_double_batch():
    parts = _tiny_parts()
    TrainStep(parts, steps_per_epoch=1)(_global_batch())
    expected = [p.detach() for p in parts.model.parameters()]
    results = launch(_one_ddp_step)
    for rank in (0, 1):
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.second_tier
def test_run_nproc_2_reaches_target_with_one_log(tmp_path, capsys):
    out = tmp_path / "ddp"
    assert main(["run", "resnet", "--nproc", "2", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "success" and result["environment"]["world_size"] == 2
    assert result["samples_to_target"] == result["epochs_to_target"] * 1437
    records = read_log(out / "mlperf_log.txt")
    keys = [r["key"] for r in records]
    for key in ("init_start", "init_stop", "run_start", "run_stop", "seed", "train_samples", "eval_samples",
                "global_batch_size", "submission_benchmark"):
        assert keys.count(key) == 1, key
    epochs = [r["metadata"]["epoch_num"] for r in records if r["key"] == "epoch_start"]
    assert epochs == list(range(1, len(epochs) + 1))
    assert len([k for k in keys if k == "eval_accuracy"]) == result["epochs_to_target"]
    assert check(out / "mlperf_log.txt").valid
    assert "on 2 processes" in capsys.readouterr().out


def _descendants_with_rank(root_pid: int, rank: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TRAINPERF_COLLECTIVE_TIMEOUT_S=20" in environ \
                and "python" in stat:
            found.append(int(entry.name))
    return found


@pytest.mark.second_tier
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the worker")
def test_killed_rank_ends_run_aborted_within_bounded_time(tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "TRAINPERF_COLLECTIVE_TIMEOUT_S": "20", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trainperf", "run", "resnet", "--nproc", "2", "--seed", "0",
                             "--out", str(out), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    log = out / "mlperf_log.txt"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and '"epoch_start"' in log.read_text()):
        time.sleep(0.1)
    victims = _descendants_with_rank(proc.pid, 1)
    assert victims, "rank 1 not found"
    killed_at = time.time()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=90)
    assert time.time() - killed_at < 60
    assert proc.returncode != 0, stderr
    assert "rank 1 failed first (signal 9)" in stderr
    records = read_log(log)
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "aborted"
    time.sleep(0.5)
    assert not _descendants_with_rank(proc.pid, 0) and not _descendants_with_rank(proc.pid, 1), "orphans left"


def test_env_placement_from_torchrun_and_slurm():
    assert distributed.env_placement({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == (3, 1, 8)
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu[07-08,11],login1"}
    assert distributed.env_placement(env) == (5, 1, 8)
    assert env["MASTER_ADDR"] == "gpu07" and env["MASTER_PORT"] == str(20000 + 4242)
    assert distributed.env_placement({}) is None
    assert distributed.expand_nodelist("n[1-3],x") == ["n1", "n2", "n3", "x"]


def test_sbatch_script_is_valid_shell_and_quotes_arguments(tmp_path):
    script = sbatch_script("resnet", 2, 8, ["--scale", "full", "--data", "/data/my imagenet", "--set",
                                            "base_lr=10; rm -rf /"], partition="gpu")
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # Run it with stand-ins for scontrol/srun/torchrun that print the arguments torchrun receives.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node17\necho node18\n")
    (bin_dir / "srun").write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec \"$@\"\n")
    (bin_dir / "torchrun").write_text("#!/bin/bash\nfor a in \"$@\"; do echo \"<$a>\"; done\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[17-18]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "99"}
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, check=True).stdout
    args = [line[1:-1] for line in out.splitlines()]
    assert "--rdzv-endpoint=node17:29500" in args and "--nnodes=2" in args and "--rdzv-id=99" in args
    assert args[args.index("--data") + 1] == "/data/my imagenet"
    assert args[args.index("--set") + 1] == "base_lr=10; rm -rf /"
    assert args[-2:] == ["--out", "runs/resnet-99"]


def test_slurm_command_prints_the_script(capsys):
    assert main(["slurm", "resnet", "--nodes", "1", "--gpus-per-node", "4", "--", "--scale", "full"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash") and "--nproc-per-node=4" in out and "run resnet --scale full" in out


@pytest.mark.second_tier
def test_a_launched_group_of_one_trains_as_a_plain_process(tmp_path):
    """`torchrun --nproc_per_node 1`: the process joins a group of one (DDP, collectives, the backend a
    GPU would use: NCCL there, gloo here) and trains exactly as a plain process with the same seed."""
    group, plain = tmp_path / "group", tmp_path / "plain"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    launched = subprocess.run([*torchrun, "-m", "trainperf", "run", "resnet", "--device", "cpu", "--seed", "4",
                               "--out", str(group), "--quiet"], capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert main(["run", "resnet", "--device", "cpu", "--seed", "4", "--out", str(plain), "--quiet"]) == 0
    a, b = (json.loads((d / "result.json").read_text()) for d in (group, plain))
    assert [e["value"] for e in a["evaluations"]] == [e["value"] for e in b["evaluations"]]
    assert a["status"] == "success" and check(group / "mlperf_log.txt").valid
