"""Each speedup switch changes what it claims, and keeps the loss close to fp32's."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from trainperf.bench import ablate, throughput
from trainperf.cli import main
from trainperf.contract import Assets, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.runtime import speedups
from trainperf.runtime.step import TrainStep
from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload

CPU = torch.device("cpu")
BASE = MINI_RECIPE.with_overrides(["channels_last=false", "global_batch_size=16"])


def _parts(recipe):
    workload = ResNetWorkload()
    ctx = RuntimeContext.create("cpu")
    torch.manual_seed(0)
    return workload, ctx, speedups.assemble(workload, recipe, ctx, Assets())


def _losses(recipe, steps: int = 4) -> list[float]:
    workload, ctx, parts = _parts(recipe)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    step = TrainStep(parts, 100, recipe, CPU)
    return [float(step(batch)) for _ in range(steps)]


def test_channels_last_puts_conv_weights_in_nhwc():
    _, _, off = _parts(BASE)
    _, _, on = _parts(BASE.with_overrides(["channels_last=true"]))
    conv_off = off.model.stem[0].weight
    conv_on = on.model.stem[0].weight
    assert conv_off.is_contiguous() and not conv_off.is_contiguous(memory_format=torch.channels_last)
    assert conv_on.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_puts_3d_conv_weights_in_ndhwc():
    # torch refuses channels_last for a 5-D tensor (3D U-Net's --channels-last crashed on the H100 round).
    model = torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3), torch.nn.InstanceNorm3d(4, affine=True),
                                torch.nn.Conv2d(4, 4, 1))
    speedups.to_channels_last(model)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert not model[0].weight.is_contiguous()
    assert model[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(model[0].weight, torch.nn.Parameter) and model[1].weight.dim() == 1


def test_autocast_dtype_seen_inside_the_step():
    recipe = BASE.with_overrides(["precision=bf16"])
    workload, ctx, parts = _parts(recipe)
    seen = []
    parts.model.stem[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    TrainStep(parts, 10, recipe, CPU)(workload.synthetic_batch(recipe, ctx, parts.model))
    assert seen == [torch.bfloat16]
    assert parts.model.stem[0].weight.dtype == torch.float32  # master weights stay fp32


def test_fp16_uses_a_grad_scaler():
    recipe = BASE.with_overrides(["precision=fp16"])
    _, _, parts = _parts(recipe)
    step = TrainStep(parts, 10, recipe, CPU)
    assert isinstance(step.scaler, torch.amp.GradScaler)
    assert TrainStep(parts, 10, BASE, CPU).scaler is None


@pytest.mark.parametrize("overrides, tolerance", [
    (["channels_last=true"], 1e-4),
    (["precision=bf16"], 5e-2),
    (["fused_optimizer=true"], 1e-4),
])
def test_loss_parity_with_fp32(overrides, tolerance):
    reference = _losses(BASE)
    other = _losses(BASE.with_overrides(overrides))
    assert other == pytest.approx(reference, rel=tolerance, abs=tolerance)


@pytest.mark.second_tier
def test_compile_compiles_and_keeps_the_loss():
    reference = _losses(BASE, steps=2)
    recipe = BASE.with_overrides(["compile=true"])
    workload, ctx, parts = _parts(recipe)
    assert isinstance(parts.model, torch._dynamo.eval_frame.OptimizedModule)
    step = TrainStep(parts, 100, recipe, CPU)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    assert [float(step(batch)) for _ in range(2)] == pytest.approx(reference, rel=1e-3, abs=1e-3)


def test_warm_up_restores_the_weights():
    workload, ctx, parts = _parts(BASE)
    before = {k: v.clone() for k, v in parts.model.state_dict().items()}
    speedups.warm_up(workload, BASE, ctx, parts, lambda: TrainStep(parts, 1, BASE, CPU), steps=2)
    after = parts.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not parts.optimizer.state


def test_graphed_evaluations_warm_twice_and_mark_each_batch(monkeypatch):
    # CUDA graph trees warm a function at its first call and record it at its second, so the warm-up runs
    # each evaluation size twice; every evaluation batch starts a new iteration of the trees. The compiler and
    # the GPU are not needed to see it: the calls are counted on the CPU (cuda_graphs set past its GPU check).
    workload, ctx, parts = _parts(BASE)
    marks, sizes = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    parts.eval_forward = lambda model, batch: sizes.append(len(batch[0]))
    graphed = BASE.with_overrides(["cuda_graphs=true"])
    speedups.warm_up(workload, graphed, ctx, parts, lambda: TrainStep(parts, 1, BASE, CPU), steps=1)
    full = len(workload.synthetic_eval_batch(graphed, ctx, parts.model)[0])
    assert sizes == [full, full, full // 2, full // 2, 1, 1]
    assert len(marks) == len(sizes)
    sizes.clear()
    speedups.warm_up(workload, BASE, ctx, parts, lambda: TrainStep(parts, 1, BASE, CPU), steps=1)
    assert len(sizes) == 3 and len(marks) == 6  # not graphed: once each, no marks


def test_cuda_graphs_need_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(TrainperfError, match="CUDA Graphs need a CUDA GPU"):
        speedups.check_supported(ResNetWorkload(), BASE.with_overrides(["cuda_graphs=true"]), CPU)


@pytest.mark.gpu
def test_cuda_graphs_capture_once_and_replay():
    from torch._inductor import metrics

    recipe = BASE.with_overrides(["cuda_graphs=true", "channels_last=true", "precision=bf16"])
    workload = ResNetWorkload()
    ctx = RuntimeContext.create("cuda")
    parts = speedups.assemble(workload, recipe, ctx, Assets())
    step = TrainStep(parts, 100, recipe, ctx.device)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    metrics.reset()
    losses = [float(step(batch)) for _ in range(6)]
    assert all(math.isfinite(x) for x in losses)
    assert metrics.generated_kernel_count > 0


def test_unsupported_switch_is_a_clear_error():
    class NoConv(ResNetWorkload):
        speedups = frozenset({"precision"})

    with pytest.raises(TrainperfError, match="channels_last=True: not supported by resnet"):
        speedups.check_supported(NoConv(), BASE.with_overrides(["channels_last=true"]), CPU)


def test_flop_count_of_a_known_layer():
    from trainperf.contract import ModelParts

    torch.manual_seed(0)
    model = nn.Linear(64, 32, bias=False)
    parts = ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                       loss_fn=lambda m, b: m(b[0]).sum(), lr_schedule=lambda spe: (lambda s: 1.0))
    flops = throughput.count_flops(TrainStep(parts, 1), (torch.randn(8, 64),))
    # forward 2*8*64*32, backward: grad of weight (the input needs none) 2*8*64*32
    assert flops == 2 * (2 * 8 * 64 * 32)


def test_cpu_peak_is_an_estimate_from_cores_clock_and_simd(tmp_path, monkeypatch):
    """The CPU peak: cores x first core's clock x 2 FMA units x 2 x lanes (x2 with bf16 dot products)."""
    import os

    from trainperf.runtime import environment

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Test CPU\ncpu MHz\t\t: 2000.000\n"
                    "flags\t\t: fpu sse avx2 avx512f avx512_bf16\n\nprocessor\t: 1\ncpu MHz\t\t: 1000.0\n")
    real = environment.cpuinfo
    monkeypatch.setattr(environment, "cpuinfo", lambda: real(fake))
    cores = len(os.sched_getaffinity(0))
    peak, source = throughput.cpu_peak_tflops("fp32")
    assert peak == pytest.approx(cores * 2000e6 * 64 / 1e12) and source.startswith("estimate: ")
    assert "AVX-512" in source
    assert throughput.cpu_peak_tflops("bf16")[0] == pytest.approx(2 * peak)
    monkeypatch.setattr(environment, "cpuinfo", lambda: real(tmp_path / "missing"))
    assert throughput.cpu_peak_tflops("fp32") == (None, "unknown CPU")


def test_ablation_configurations_cumulative_and_alone():
    switches = ablate.applicable(ResNetWorkload(), MINI_RECIPE, CPU)
    names = [n for n, _ in switches]
    assert names == ["channels_last", "bf16", "fused_optimizer", "compile"]  # no CUDA Graphs on a CPU
    configs = ablate.configurations(switches)
    assert configs[0][1] == "baseline" and len(configs) == 1 + 2 * len(switches)
    assert configs[2][0] == "channels_last+bf16" and "precision=bf16" in configs[2][2]
    assert configs[-1][0] == "compile alone" and "channels_last=false" in configs[-1][2]


def test_bench_command_prints_the_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "resnet", "--synthetic", "--steps", "5", "--warmup", "1", "--precision", "bf16",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in ("samples/s", "p50", "p90", "peak memory", "FLOP per sample", "MFU", "precision=bf16"):
        assert needle in text
    figures = json.loads(out.read_text())
    assert figures["flops_per_sample"] > 0 and figures["speedups"]["precision"] == "bf16"


@pytest.mark.second_tier
def test_mini_with_every_cpu_switch_reaches_target(tmp_path):
    run_dir = tmp_path / "all-switches"
    assert main(["run", "resnet", "--seed", "0", "--out", str(run_dir), "--quiet", "--precision", "bf16",
                 "--channels-last", "--compile", "--fused-optimizer"]) == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "success"
    assert result["recipe"]["compile"] and result["recipe"]["precision"] == "bf16"
    log = (run_dir / "mlperf_log.txt").read_text()
    assert '"trainperf_speedups"' in log and '"compile": true' in log
    assert result["init_time_s"] > 0


@pytest.mark.to_target
@pytest.mark.slow
def test_mini_with_async_eval_reaches_target_and_passes_checker(tmp_path):
    from trainperf.results.compliance import check

    run_dir = tmp_path / "async"
    assert main(["run", "resnet", "--seed", "1", "--out", str(run_dir), "--quiet", "--async-eval"]) == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "success" and result["recipe"]["async_eval"]
    assert result["final_metric"] >= MINI_RECIPE.target
    assert check(run_dir / "mlperf_log.txt").valid


# -- precision=fp8: torchao's float8 training layers (a CPU emulates the float8 products) --------------
def _tiny_bert(*sets):
    from trainperf.workloads.bert import BertWorkload

    workload = BertWorkload()
    recipe = workload.recipe("full").with_overrides(
        ["global_batch_size=2", "max_seq_length=32", "max_predictions=4", "layers=2", "hidden=64", "heads=4",
         "intermediate=128", "vocab_size=512", "checkpoint=none", "dropout=0", *sets])
    return workload, recipe


def test_fp8_swaps_the_linear_layers_and_trains_like_bf16():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    losses = {}
    for precision in ("bf16", "fp8"):
        workload, recipe = _tiny_bert(f"precision={precision}")
        ctx = RuntimeContext.create("cpu")
        torch.manual_seed(0)
        parts = speedups.assemble(workload, recipe, ctx, Assets())
        swapped = [m for m in parts.model.modules() if isinstance(m, Float8Linear)]
        assert (len(swapped) > 10) == (precision == "fp8")
        batch = workload.synthetic_batch(recipe, ctx, parts.model)
        step = TrainStep(parts, 10, recipe, CPU, split=workload.split_batch, count=workload.batch_samples)
        losses[precision] = [float(step(batch)) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses["fp8"])
    assert abs(losses["fp8"][0] - losses["bf16"][0]) < 0.05 * abs(losses["bf16"][0])
    assert losses["fp8"][-1] < losses["fp8"][0]  # it learns


def test_fp8_products_see_rows_in_multiples_of_16_whatever_the_batch(monkeypatch):
    # torch._scaled_mm on a GPU refuses a dimension that is not a multiple of 16 (BERT's 75 packed
    # sequence slots on the H100 round); a CPU emulates it and would not: the rows are checked here.
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    seen = []
    real = Float8Linear.forward

    def watched(self, x):
        seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return real(self, x)

    monkeypatch.setattr(Float8Linear, "forward", watched)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48))
    reference = torch.nn.Linear(32, 48)
    reference.load_state_dict(model[0].state_dict())
    assert speedups.to_float8(model) == 1 and isinstance(model[0], Float8Linear)
    assert set(model.state_dict()) == {"0.weight", "0.bias"}  # checkpoints keep their keys
    layer = model[0]
    x = torch.randn(3, 25, 32, requires_grad=True)
    out = layer(x)
    assert out.shape == (3, 25, 48) and seen == [80]  # 75 rows padded to 80
    out.sum().backward()
    assert layer.weight.grad is not None and x.grad.shape == x.shape
    expected = reference(x.detach())
    assert torch.allclose(out.detach(), expected, atol=0.1 * expected.abs().max().item())


def test_a_frozen_fp8_layer_gives_torchaos_input_gradient_without_the_weights_or_the_saved_input():
    # LoRA's base: torchao's Float8Linear would compute the frozen weight's gradient (a third of the backward's
    # float8 products, thrown away) and keep the layer's input for it.
    pytest.importorskip("torchao.float8")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func.__name__.startswith(("mm", "_scaled_mm"))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    frozen, trained = (torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)) for _ in range(2))
    trained.load_state_dict(frozen.state_dict())
    frozen[0].weight.requires_grad_(False)
    speedups.to_float8(frozen)
    speedups.to_float8(trained)
    frozen, trained = frozen[0], trained[0]
    assert type(frozen).__name__.startswith("Frozen") and not type(trained).__name__.startswith("Frozen")
    results = {}
    for name, layer in (("frozen", frozen), ("trained", trained)):
        x = torch.randn(48, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
            out = layer(x)
        with Products() as products:
            out.square().sum().backward()
        results[name] = (out.detach(), x.grad, products.count, saved)
    assert torch.equal(results["frozen"][0], results["trained"][0])  # torchao's casts and product
    assert torch.equal(results["frozen"][1], results["trained"][1])
    assert frozen.weight.grad is None and trained.weight.grad is not None
    assert (results["frozen"][2], results["trained"][2]) == (1, 2)  # the input's gradient only
    assert all(t.shape == (64, 32) for t in results["frozen"][3])  # the weight (transposed), not the input
    assert any(t.shape == (48, 64) for t in results["trained"][3])


def test_fp8_where_it_cannot_run_is_one_line(monkeypatch):
    import sys

    from tests.fakegpu import gpu_machine

    with pytest.raises(TrainperfError, match="precision=fp8: not supported by resnet"):
        speedups.check_supported(ResNetWorkload(), BASE.with_overrides(["precision=fp8"]), CPU)
    workload, recipe = _tiny_bert("precision=fp8")
    with gpu_machine(monkeypatch, capability=(8, 0), gpu_name="NVIDIA A100-SXM4-80GB"):
        with pytest.raises(TrainperfError, match="A100-SXM4-80GB has compute capability 8.0; float8 needs 8.9"):
            speedups.check_supported(workload, recipe, torch.device("cuda", 0))
    with gpu_machine(monkeypatch, capability=(9, 0)):
        speedups.check_supported(workload, recipe, torch.device("cuda", 0))  # an H100: accepted
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    missing = r"precision=fp8: torchao.float8 cannot be imported .*pip install -e '.\[fp8\]'"
    with pytest.raises(TrainperfError, match=missing):
        speedups.to_float8(torch.nn.Linear(16, 16))
