"""GPU device handling, tested on a CPU against strict fakes of torch's CUDA entry points
(tests/fakegpu.py): a bare `cuda` resolved to an indexed device, every CUDA call given one, and whole
commands run through their GPU-only branches."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import read_log
from tests.fakegpu import BareDevice, FakeCuda, gpu_machine
from trainperf import devices
from trainperf.cli import main
from trainperf.contract import RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.loaders import DevicePrefetcher
from trainperf.results.compliance import check
from trainperf.runtime import distributed, environment

SRC = Path(__file__).resolve().parents[2] / "src" / "trainperf"
CUDA_PREFIXES = ("torch.cuda", "torch.backends.cudnn", "torch.version.cuda")
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for key in LAUNCHER_ENV:
        monkeypatch.delenv(key, raising=False)


def test_the_fakes_reject_a_device_without_an_index_as_torch_does(monkeypatch):
    with gpu_machine(monkeypatch, count=2) as gpu:
        with pytest.raises(BareDevice, match="Expected a torch.device with a specified index"):
            torch.cuda.set_device(torch.device("cuda"))
        with pytest.raises(BareDevice):
            torch.cuda.synchronize()  # stricter than torch: no implicit current device either
        with pytest.raises(RuntimeError, match="invalid device ordinal 2"):
            torch.cuda.synchronize(torch.device("cuda", 2))
        with pytest.raises(BareDevice):
            torch.zeros(2, device="cuda")  # a factory given a bare device
        assert torch.zeros(2, device=torch.device("cuda", 1)).device.type == "cpu"
        assert ("zeros", 1) in gpu.calls


def test_the_default_device_on_a_gpu_machine_is_indexed(monkeypatch):
    # The crash every GPU user met: RuntimeContext.create() called set_device(torch.device("cuda")).
    with gpu_machine(monkeypatch) as gpu:
        for spec in (None, "cuda"):
            ctx = RuntimeContext.create(spec)
            assert ctx.device == torch.device("cuda", 0)
            ctx.synchronize()
    assert ("set_device", 0) in gpu.calls and ("synchronize", 0) in gpu.calls


@pytest.mark.parametrize(("spec", "env", "current", "expected"), [
    ("cuda", {}, 0, 0),
    ("cuda", {}, 1, 1),  # no launcher: the current device
    ("cuda", {"LOCAL_RANK": "1"}, 0, 1),
    (None, {"SLURM_LOCALID": "1"}, 0, 1),
    ("cuda:1", {"LOCAL_RANK": "0"}, 0, 1),  # an explicit index wins
])
def test_a_bare_cuda_resolves_to_the_local_rank_or_the_current_device(monkeypatch, spec, env, current, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with gpu_machine(monkeypatch, count=2, current=current):
        assert devices.resolve(spec) == torch.device("cuda", expected)


def test_one_visible_gpu_per_task_is_device_zero_whatever_the_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")  # Slurm's GPU binding: each task sees only its own GPU
    with gpu_machine(monkeypatch, count=1):
        assert devices.resolve("cuda") == torch.device("cuda", 0)


@pytest.mark.parametrize(("spec", "message"), [
    ("gpu", "--device 'gpu': expected cpu, cuda or cuda:N"),
    ("cuda:2", "--device 'cuda:2': this machine shows 2 GPU(s) (cuda:0 to cuda:1)"),
    ("meta", "--device 'meta': only cpu and cuda devices are supported"),
    ("cuda:x", "--device 'cuda:x': expected cpu, cuda or cuda:N"),
])
def test_bad_devices_are_one_line(monkeypatch, spec, message):
    with gpu_machine(monkeypatch, count=2), pytest.raises(TrainperfError) as err:
        devices.resolve(spec)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_more_local_ranks_than_gpus_is_one_line(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    with gpu_machine(monkeypatch, count=4), pytest.raises(TrainperfError, match="local rank 5: this machine shows 4"):
        devices.resolve("cuda")


def test_cuda_on_a_machine_without_gpus_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TrainperfError, match="no CUDA GPU is visible"):
        devices.resolve("cuda")
    assert devices.resolve(None) == torch.device("cpu")


def test_a_launched_process_joins_its_group_on_the_gpu_of_its_local_rank(monkeypatch):
    joined = {}
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: joined.update(kwargs))
    for key, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(key, value)
    with gpu_machine(monkeypatch, count=2) as gpu:
        ctx = distributed.init_from_env("cuda")
    assert ctx.device == torch.device("cuda", 1) and (ctx.rank, ctx.world_size, ctx.local_rank) == (3, 4, 1)
    assert joined["backend"] == "nccl" and joined["device_id"] == torch.device("cuda", 1)
    assert ("set_device", 1) in gpu.calls


def test_every_cuda_entry_point_is_given_an_indexed_device(monkeypatch):
    with gpu_machine(monkeypatch, count=2, current=1) as gpu:
        dev = devices.resolve("cuda")
        devices.activate(dev)
        devices.synchronize(dev)
        devices.reset_peaks(dev)
        peaks = devices.memory_peaks(dev)
        assert (peaks.allocated_mib, peaks.reserved_mib, peaks.in_use_mib) == (1024, 2048, 3072)
        assert devices.name(dev) == gpu.gpu_name and devices.names() == [gpu.gpu_name] * 2
        assert devices.total_memory(dev) == 80 * 2**30
        assert devices.versions() == {"cuda": "13.0", "cudnn": "91900", "nccl": "2.27.3"}
        stream = devices.side_stream(dev)
        moved = devices.copy_async(torch.ones(2), dev, stream)
        devices.hand_over((moved,), dev, stream)
        env = environment.describe(dev, 8)
        assert env["platform"] == f"8x{gpu.gpu_name}" and env["cuda"] == "13.0" and env["gpus"] == [gpu.gpu_name] * 2
    every = {"set_device", "synchronize", "reset_peak_memory_stats", "mem_get_info", "max_memory_allocated",
             "max_memory_reserved", "get_device_name", "get_device_properties", "Stream", "stream", "current_stream",
             "Stream.wait_stream", "record_stream", "to"}
    assert every <= gpu.names_called()
    assert all(idx == 1 for name, idx in gpu.calls if name not in ("get_device_name", "record_stream", "to"))


def test_a_bare_device_that_reaches_a_cuda_call_is_caught_by_trainperf_too():
    with pytest.raises(ValueError, match="without an index"):
        devices.synchronize(torch.device("cuda"))


def test_the_prefetcher_copies_on_a_side_stream_and_hands_each_batch_over(monkeypatch):
    batches = [(torch.full((2,), float(i)), torch.tensor([i])) for i in range(3)]
    with gpu_machine(monkeypatch) as gpu:
        out = list(DevicePrefetcher(batches, devices.resolve("cuda")))
    assert [int(b[1]) for b in out] == [0, 1, 2]
    names = [name for name, _ in gpu.calls]
    assert names.count("record_stream") == 6 and names.count("Stream.wait_stream") == 3 and names.count("Stream") == 1


def _cuda_calls(tree: ast.AST) -> list[str]:
    """`torch.cuda…`, `torch.backends.cudnn…`, `torch.version.cuda`, `.cuda()` and a bare "cuda" literal
    given as a device, in one module."""
    found = []
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}  # torch.cuda in torch.cuda.x
    for node in ast.walk(tree):
        text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.Call)) else ""
        if isinstance(node, ast.Attribute) and id(node) not in inner and text.startswith(CUDA_PREFIXES):
            found.append(f"line {node.lineno}: {text}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.cuda"):
            found.append(f"line {node.lineno}: from {node.module} import …")
        elif isinstance(node, ast.Call):
            literal_args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            literal_kw = [k.value.value for k in node.keywords
                          if k.arg == "device" and isinstance(k.value, ast.Constant)]
            if (text.startswith("torch.device(") and "cuda" in literal_args) or "cuda" in literal_kw:
                found.append(f"line {node.lineno}: {text} (a bare cuda device)")
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not node.args:
                found.append(f"line {node.lineno}: {text} (the current device, implicitly)")
    return found


@pytest.mark.slow
def test_no_module_but_devices_calls_cuda():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "devices.py" and path.parent == SRC:
            continue
        offenders += [f"{path.relative_to(SRC)} {hit}" for hit in _cuda_calls(ast.parse(path.read_text()))]
    assert not offenders, "CUDA calls outside trainperf/devices.py (go through it):\n" + "\n".join(offenders)


def test_the_source_scan_finds_what_it_looks_for():
    bad = ast.parse('import torch\ntorch.cuda.set_device(torch.device("cuda"))\nx.cuda()\n'
                    'torch.zeros(1, device="cuda")\n')
    assert len(_cuda_calls(bad)) == 4


@pytest.mark.slow
@pytest.mark.to_target
# -- whole commands on the fake GPU machine -----------------------------------------------------------
def test_run_on_a_gpu_machine_with_the_default_device(monkeypatch, tmp_path):
    out = tmp_path / "run"
    with gpu_machine(monkeypatch) as gpu:
        code = main(["run", "resnet", "--seed", "0", "--out", str(out), "--quiet", "--set", "max_epochs=1",
                     "--set", "target=0.1"])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["environment"]["device"] == "cuda:0"
    assert result["environment"]["platform"] == f"1x{gpu.gpu_name}"
    records = read_log(out / "mlperf_log.txt")
    assert next(r for r in records if r["key"] == "submission_platform")["value"] == f"1x{gpu.gpu_name}"
    assert check(out / "mlperf_log.txt").valid
    assert {"set_device", "synchronize"} <= gpu.names_called()


@pytest.mark.slow
@pytest.mark.to_target
def test_a_series_describes_the_gpu_system(monkeypatch, tmp_path):
    with gpu_machine(monkeypatch) as gpu:
        assert main(["run", "resnet", "--runs", "1", "--seed", "0", "--out", str(tmp_path), "--quiet",
                     "--set", "max_epochs=1", "--set", "target=0.1"]) == 0
    (system,) = (tmp_path / "systems").glob("*.json")
    desc = json.loads(system.read_text())
    assert system.stem == "1xnvidia_h100_80gb_hbm3"
    assert desc["accelerator_model_name"] == gpu.gpu_name and desc["accelerator_memory_capacity"] == "80 GB"
    assert desc["accelerators_per_node"] == "1"
    assert desc["other_software_stack"]["cudnn_version"] == "91900"


def test_bench_reports_the_memory_a_batch_needs(monkeypatch, tmp_path):
    out = tmp_path / "bench.json"
    with gpu_machine(monkeypatch) as gpu:
        assert main(["bench", "resnet", "--synthetic", "--steps", "2", "--warmup", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # Reserved (graph pools included) is the headline; live tensors and the whole device beside it.
    assert result["peak_memory_mb"] == 2048 and "CUDA Graph pools" in result["peak_memory_kind"]
    assert result["peak_allocated_mb"] == 1024 and result["device_in_use_mb"] == 3072
    assert result["device"] == "cuda:0" and result["peak_source"].startswith(gpu.gpu_name)
    assert {"reset_peak_memory_stats", "max_memory_reserved"} <= gpu.names_called()


@pytest.mark.parametrize("workload", ["dlrm", "bert"])
def test_the_gpu_data_paths_of_minis_run_on_real_batches(monkeypatch, workload, tmp_path):
    # Each of these opens its data differently on a GPU (pinned copies; DLRM: a prefetch thread).
    from tests.conftest import mini_data

    mini_data(workload)
    with gpu_machine(monkeypatch) as gpu:
        assert main(["bench", workload, "--steps", "2", "--warmup", "1", "--json", str(tmp_path / "b.json")]) == 0
    assert "pin_memory" in gpu.names_called()
    assert json.loads((tmp_path / "b.json").read_text())["device"] == "cuda:0"


@pytest.mark.slow
def test_the_streamed_full_scale_loaders_run_on_a_gpu_machine(monkeypatch, tmp_path):
    """ResNet's loader workers with the side-stream prefetcher, and the COCO loaders' pinned batches."""
    from tests.conftest import imagenet_folder
    from tests.workloads.test_ssd import _coco_tree

    imagenet = imagenet_folder(tmp_path / "imagenet", size=(64, 64))
    coco = _coco_tree(tmp_path / "coco")
    assert main(["prepare", "ssd", "--scale", "full", "--data", str(coco)]) == 0
    with gpu_machine(monkeypatch) as gpu:
        assert main(["bench", "resnet", "--scale", "full", "--data", str(imagenet), "--batch-size", "2", "--steps", "1",
                     "--warmup", "1", "--set", "num_workers=0"]) == 0
        assert {"Stream", "stream", "record_stream", "Stream.wait_stream"} <= gpu.names_called()
        gpu.calls.clear()
        assert main(["bench", "ssd", "--scale", "full", "--data", str(coco), "--batch-size", "2", "--steps", "1",
                     "--warmup", "1", "--set", "num_workers=0"]) == 0
        assert "pin_memory" in gpu.names_called()


def test_allreduce_refuses_a_device_it_cannot_use(capsys):
    assert main(["allreduce", "--device", "gpu"]) == 2
    assert "--device 'gpu': expected cpu, cuda or cuda:N" in capsys.readouterr().err


def test_fake_machine_counts_are_its_own():
    assert FakeCuda(count=3).count == 3
