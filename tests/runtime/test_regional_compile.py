"""--regional-compile compiles a model's repeated blocks one by one (each block's code once per distinct shape),
and --graphs-backend chooses what records --cuda-graphs' graphs: both change how a model is compiled, never
what it computes."""

from __future__ import annotations

import pytest
import torch

from trainperf import registry
from trainperf.contract import Assets, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.runtime import speedups
from trainperf.runtime.step import TrainStep


def _run(monkeypatch, name: str, sets: list[str], steps: int = 2) -> tuple[list[float], int, int]:
    """Losses of `steps` steps of the workload's mini model (the full one's blocks, narrower), the graphs dynamo
    traced and the regions named, compiled with a backend that counts the graphs and runs them as traced."""
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(speedups, "compile_options", lambda recipe: {"backend": counting})
    workload = registry.get(name)
    recipe = workload.recipe("mini").with_overrides(["global_batch_size=8", *sets])
    ctx = RuntimeContext.create("cpu")
    torch.manual_seed(0)
    torch._dynamo.reset()
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    losses = [float(step(batch)) for _ in range(steps)]
    torch._dynamo.reset()
    return losses, len(graphs), len(parts.regions)


def test_bert_s_layers_are_compiled_once_and_train_as_the_whole_model_compiled(monkeypatch):
    whole, whole_graphs, _ = _run(monkeypatch, "bert", ["model.layers=3", "checkpoint=none", "compile=true"])
    regional, graphs, regions = _run(monkeypatch, "bert", ["model.layers=3", "checkpoint=none", "compile=true",
                                                        "regional_compile=true"])
    assert regions == 3 and whole_graphs == 1
    assert graphs == 1, "the three layers share one compiled graph"
    assert regional == whole


def test_resnet_s_bottlenecks_compile_once_per_distinct_shape(monkeypatch):
    stages = ["blocks=3,2,2", "compile=true"]
    whole, _, _ = _run(monkeypatch, "resnet", stages)
    regional, graphs, regions = _run(monkeypatch, "resnet", [*stages, "regional_compile=true"])
    assert regions == 7
    # Each of the three stages: its first block (strided, with a projection) and the repeats after it.
    assert graphs == 6
    assert regional == whole


@pytest.mark.parametrize(("name", "sets", "said"), [
    ("bert", ["regional_compile=true"], "add --compile"),
    ("bert", ["graphs_backend=cudagraphs"], "add --cuda-graphs"),
    ("transformer", ["compile=true", "regional_compile=true"], "regional_compile=True: not supported by transformer"),
])
def test_a_refinement_without_what_it_refines_is_refused_in_one_line(name, sets, said):
    workload = registry.get(name)
    recipe = workload.recipe("full").with_overrides([*workload.step_probe, *sets])
    with pytest.raises(TrainperfError, match=said) as caught:
        speedups.check_supported(workload, recipe, torch.device("cpu"))
    assert "\n" not in str(caught.value)


def test_an_unknown_graphs_backend_names_the_field():
    recipe = registry.get("bert").recipe("full")
    with pytest.raises(TrainperfError, match="graphs_backend='tensorrt' is not one of: inductor, cudagraphs"):
        recipe.with_overrides(["graphs_backend=tensorrt"]).validate()


def test_each_engine_compiles_with_the_options_the_switches_ask_for():
    recipe = registry.get("bert").recipe("full")
    assert speedups.compile_options(recipe.with_overrides(["compile=true"])) == {}
    assert speedups.compile_options(recipe.with_overrides(["cuda_graphs=true"])) == {"mode": "reduce-overhead"}
    assert speedups.compile_options(recipe.with_overrides(["cuda_graphs=true", "graphs_backend=cudagraphs"])) == {
        "backend": "cudagraphs"}


def test_graphs_recorded_without_inductor_compute_what_eager_does():
    # On a CPU dynamo's cudagraphs backend runs its traced graphs unrecorded: the traced step itself is checked.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    eager = model(x).sum()
    eager.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, **speedups.compile_options(
        registry.get("bert").recipe("full").with_overrides(["cuda_graphs=true", "graphs_backend=cudagraphs"])))
    out = compiled(x).sum()
    out.backward()
    torch._dynamo.reset()
    assert torch.allclose(out, eager)
    assert all(torch.allclose(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA Graphs need a CUDA GPU")
def test_bert_trains_under_cuda_graphs_recorded_without_inductor():
    workload = registry.get("bert")
    recipe = workload.recipe("full").with_overrides([*workload.step_probe, "cuda_graphs=true",
                                                      "graphs_backend=cudagraphs", "precision=bf16"])
    ctx = RuntimeContext.create("cuda")
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    losses = [float(step(batch)) for _ in range(4)]
    assert all(map(lambda v: v == v, losses)) and losses[-1] < losses[0]
