"""The compile check (trainperf/bench/graphcheck.py): it finds a planted graph break and a planted recompile, and
every workload that offers --cuda-graphs compiles its full-scale step as one graph per shape bucket, forward
and backward, with no recompile over steps (benchmarks/graph_breaks.py prints the table in docs/gpus.md)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from tests.bench.test_stepcount import _PlantedRecipe, _PlantedWorkload
from trainperf import registry
from trainperf.bench import graphcheck
from trainperf.contract import ModelParts, RuntimeContext

CPU = RuntimeContext(device=torch.device("cpu"))


class _Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum().item() > 1e9:  # a value read back to decide the path: a graph break
            y = y * 2
        return y


class _Recompiles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) * (1 + self.calls % 2)  # a Python number that changes every step: a guard fails


class _Workload(_PlantedWorkload):
    step_probe = ()

    def recipe(self, scale, name=None):
        return _PlantedRecipe(name="p", global_batch_size=8, max_epochs=1, target=1.0, eval_every=1, eval_first=1)

    def assets(self, recipe, data_dir):
        return {}

    def synthetic_batches(self, recipe, ctx, model):
        return [self.make_batch()]


def _workload(module: nn.Module) -> _Workload:
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    parts = ModelParts(model=module, optimizer=opt, loss_fn=lambda m, b: m(b).pow(2).mean(),
                       lr_schedule=lambda s: (lambda k: 1.0))
    return _Workload(parts, lambda: torch.randn(8, 4))


def test_the_check_names_a_planted_break_and_counts_a_planted_recompile():
    broken = graphcheck.check(_workload(_Breaks()), CPU, steps=2)
    lines, first = inspect.getsourcelines(_Breaks.forward)
    line = first + next(i for i, text in enumerate(lines) if ".item()" in text)
    assert broken.broken is not None and f"test_graphcheck.py:{line}:" in broken.broken, broken.broken
    assert not broken.one_graph
    recompiled = graphcheck.check(_workload(_Recompiles()), CPU, steps=3)
    assert recompiled.broken is None and recompiled.graphs == 1 and recompiled.recompiles >= 1
    assert not recompiled.one_graph
    clean = graphcheck.check(_workload(nn.Linear(4, 1)), CPU, steps=3)
    assert clean.one_graph and (clean.graphs, clean.recompiles) == (1, 0)


GRAPHED = sorted(name for name in registry.names() if "cuda_graphs" in registry.get(name).speedups)
# A few buckets are enough to show one graph each and no recompile between them (all of them: the benchmark).
FEWER_BUCKETS = {"transformer": ["bucket_lengths=16,32,256"], "gnmt": ["bucket_lengths=16,49"],
                 "retinanet": ["bucket_boxes=8,16"], "maskrcnn": ["bucket_boxes=8"],
                 "rnnt": ["max_duration=1", "bucket_frames=32,64", "bucket_labels=8"]}


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.parametrize("name", GRAPHED)
def test_every_workload_offering_cuda_graphs_compiles_one_graph_per_bucket(name):
    workload = registry.get(name)
    sets = (["static_shapes=true"] if "static_shapes" in workload.speedups else []) + FEWER_BUCKETS.get(name, [])
    found = graphcheck.check(workload, CPU, steps=2, sets=sets)
    assert found.one_graph, found
