"""What a training step asks of the host, counted on a CPU: the counter finds what is planted in a step,
and every workload's full-scale step stays within its budget of operators, synchronisations and
host-data tensors (benchmarks/step_ops.py prints the figures; the README's GPU section has the table).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from trainperf import registry
from trainperf.bench import stepcount
from trainperf.contract import Assets, ModelParts, Recipe, RuntimeContext, StepBudget

CPU = RuntimeContext(device=torch.device("cpu"))


# Each workload's budget is its own declaration (Workload.step_budget, beside its step_probe).
BUDGETS: dict[str, StepBudget] = {name: registry.get(name).step_budget for name in registry.names()}


def test_every_registered_workload_has_a_budget():
    assert [name for name, budget in BUDGETS.items() if not isinstance(budget, StepBudget)] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_the_full_training_step_stays_within_its_budget(name):
    counts = stepcount.probe(registry.get(name), CPU, steps=2, timed_steps=0)
    budget = BUDGETS[name]
    # The capture check: the same operators and output shapes in two steps, or the line where they part.
    assert (counts.unstable is None) == budget.replays, f"{name}: two steps of one batch: {counts.unstable}"
    over = {kind: n for kind, n in counts.syncs.items() if n > budget.syncs.get(kind, 0)}
    assert not over, f"{name}: new host-device synchronisations {over}, from: {counts.sites}"
    assert counts.host_data <= budget.host_data, f"{name}: new tensors built from host data, from: {counts.sites}"
    assert counts.ops <= budget.ops, (f"{name}: {counts.ops:,.0f} operators per step, budget {budget.ops:,}; "
                                      f"most dispatched: {counts.top_ops}")


# -- the counter itself -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _PlantedRecipe(Recipe):
    pass


class _Planted:
    """A step with known demands: one .item(), one boolean-mask index, one .tolist(), one torch.tensor."""


    name = "planted"
    step_probe = ()

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        out = model(batch).squeeze(-1)
        scale = out.abs().max().item()  # item
        kept = out[out > -1e9]  # boolean-mask index: nonzero on a GPU
        _ = batch[:, 0].tolist()  # host copy
        bias = torch.tensor(0.5, device=batch.device)  # made on the device from host data: a copy
        return (kept / (1 + scale)).pow(2).mean() + bias * 0


class _PlantedWorkload:
    """What count_step asks of a workload, around given parts and a batch."""

    name = "planted"
    speedups = frozenset({"precision", "compile", "fused_optimizer"})
    host_scoring = "thread"

    def __init__(self, parts, make_batch):
        self.parts, self.make_batch = parts, make_batch

    def check_recipe(self, recipe):
        pass

    def build(self, recipe, ctx, assets):
        return self.parts

    def synthetic_batch(self, recipe, ctx, model):
        return self.make_batch()

    def shape_buckets(self, recipe):
        return None

    def batch_samples(self, batch):
        return batch.shape[0]

    def split_batch(self, batch, n):
        return [batch]


def test_the_counter_finds_what_was_planted(monkeypatch):
    planted = _Planted()
    opt = torch.optim.Adam(planted.model.parameters(), lr=0.1)  # its host-side step counters are no syncs
    parts = ModelParts(model=planted.model, optimizer=opt, loss_fn=planted.loss, lr_schedule=lambda s: (lambda k: 1.0))
    recipe = _PlantedRecipe(name="p", global_batch_size=8, max_epochs=1, target=1.0, eval_every=1, eval_first=1)
    counts = stepcount.count_step(_PlantedWorkload(parts, lambda: torch.randn(8, 4)), recipe, CPU, Assets(), [],
                                  steps=2, timed_steps=1)
    # The boolean-mask index syncs twice: its forward and its backward each turn the mask into indices.
    assert counts.syncs == {"item": 1, "data-dependent shape": 2, "host copy": 1, "device synchronize": 0}
    assert counts.host_data == 1
    forward = {site for site in counts.sites if "test_stepcount.py" in site}
    assert len(forward) == 4 and sum(counts.sites[s] for s in forward) == 4  # item, mask, tolist, torch.tensor
    (backward,) = set(counts.sites) - forward  # the mask index's gradient, from the step's backward()
    assert backward.startswith("data-dependent shape: runtime/step.py") and "IndexBackward" in backward
    assert counts.ops > 20 and counts.kernels < counts.ops and counts.step_ms > 0 and counts.host_ms >= 0


@pytest.mark.parametrize(("make", "kind"), [
    (lambda x: x.nonzero(), "data-dependent shape"),
    (lambda x: x[x > 0], "data-dependent shape"),
    (lambda x: torch.repeat_interleave(x.long().abs()), "data-dependent shape"),
    (lambda x: x.sum().item(), "item"),
    (lambda x: x[torch.tensor([0, 1])], None),  # an index tensor of positions: no sync
    (lambda x: x * 2, None),
])
def test_sync_kinds(make, kind):
    mode = stepcount._Dispatched()
    with mode:
        make(torch.tensor([1.0, -2.0, 3.0]))
    assert dict(mode.syncs) == ({kind: 1} if kind else {})


# -- replays: what CUDA Graphs would capture once must be the same work every step --------------------------------
def _two_steps(loss_fn):
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    parts = ModelParts(model=model, optimizer=opt, loss_fn=loss_fn, lr_schedule=lambda s: (lambda k: 1.0))
    workload = _PlantedWorkload(parts, lambda: torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    recipe = _PlantedRecipe(name="p", global_batch_size=8, max_epochs=1, target=1.0, eval_every=1, eval_first=1)
    return stepcount.count_step(workload, recipe, CPU, Assets(), [], steps=3, timed_steps=0)


def test_a_step_that_does_the_same_work_every_time_replays():
    assert _two_steps(lambda model, batch: model(batch).pow(2).mean()).unstable is None


def test_a_step_whose_shapes_change_between_steps_is_named_at_its_line():
    calls = [0]

    def growing(model, batch):  # a step whose work depends on how many steps ran: no graph replays it
        calls[0] += 1
        rows = batch[: 2 + calls[0] % 3]
        return model(rows).pow(2).mean()

    unstable = _two_steps(growing).unstable
    assert unstable is not None and "test_stepcount.py" in unstable and "made [" in unstable, unstable


def test_a_step_that_takes_another_path_is_named():
    calls = [0]

    def branching(model, batch):
        calls[0] += 1
        out = model(batch)
        return (out.abs() if calls[0] % 2 else out.pow(2)).mean()

    unstable = _two_steps(branching).unstable
    assert unstable is not None and "another path" in unstable and "test_stepcount.py" in unstable, unstable
