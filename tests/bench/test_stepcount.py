"""What a training step asks of the host, counted on a CPU: the counter finds what is planted in a step,
and every workload's full-scale step stays within its budget of operators, synchronisations and
host-data tensors (benchmarks/step_ops.py prints the figures; the README's GPU section has the table).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from tests.conftest import launch
from trainperf import registry
from trainperf.bench import stepcount
from trainperf.contract import Assets, ModelParts, Recipe, RuntimeContext, StepBudget, StepProbe

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
    default = StepProbe("default", ())
    _within(name, default, counts.to_dict(), stepcount.allowed(registry.get(name), default))
    assert counts.ops <= budget.ops, (f"{name}: {counts.ops:,.0f} operators per step, budget {budget.ops:,}; "
                                      f"most dispatched: {counts.top_ops}")


def _within(name: str, configuration: StepProbe, counts: dict, allowed: dict[str, int]) -> None:
    over = {kind: n for kind, n in counts["syncs"].items() if n > allowed.get(kind, 0)}
    assert not over, f"{name} ({configuration.name}): host-device synchronisations {over}, from: {counts['sites']}"
    assert counts["host_data"] <= BUDGETS[name].host_data + configuration.host_data, (
        f"{name} ({configuration.name}): new host-to-device transfers, from: {counts['sites']}")


# The configurations besides the default one (--static-shapes, expert parallelism on two processes): each as
# long to count as the default, so they are the second tier's.
OTHERS = [(name, configuration) for name in sorted(BUDGETS)
          for configuration in stepcount.configurations(registry.get(name))[1:]]


@pytest.mark.second_tier
@pytest.mark.parametrize(("name", "configuration"), OTHERS, ids=[f"{n}-{c.name}" for n, c in OTHERS])
def test_every_configuration_users_run_stays_within_its_budget(name, configuration):
    workload = registry.get(name)
    if configuration.processes > 1:
        ranks = launch(_probe_in_process, name, list(configuration.sets), nproc=configuration.processes)
    else:
        ranks = {0: stepcount.probe(workload, CPU, list(configuration.sets), steps=2, timed_steps=0).to_dict()}
    for counts in ranks.values():
        _within(name, configuration, counts, stepcount.allowed(workload, configuration))
        if configuration.syncs:  # an inherent synchronisation is named where it is, and is there
            assert counts["syncs"] == {**dict.fromkeys(counts["syncs"], 0), **configuration.syncs}, counts["sites"]


def _probe_in_process(name: str, sets: list[str]) -> dict:
    """`stepcount.probe` in one of the launched processes (gloo on the CPU): its counts as a dict."""
    from trainperf.runtime import distributed

    ctx = distributed.init_from_env("cpu")
    try:
        return stepcount.probe(registry.get(name), ctx, sets, steps=2, timed_steps=0).to_dict()
    finally:
        distributed.shutdown()


def test_every_configuration_with_an_inherent_synchronisation_says_why():
    for name in BUDGETS:
        for configuration in stepcount.configurations(registry.get(name)):
            assert not configuration.syncs or len(configuration.why) > 40, (name, configuration.name)


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
    # torch.tensor(..., device=) copies from pageable memory without non_blocking: a blocking copy.
    assert counts.syncs == {"item": 1, "data-dependent shape": 2, "host copy": 1, "blocking copy": 1,
                            "device synchronize": 0}
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


# -- the counter's former blind spots (issue 62): each planted step was counted 0 before ------------------------
DEVICE = torch.device("cpu")  # what the step's code passes: a torch.device is the step's device


def _count(loss_fn, batch=None) -> stepcount.StepCounts:
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    parts = ModelParts(model=model, optimizer=opt, loss_fn=loss_fn, lr_schedule=lambda s: (lambda k: 1.0))
    make = batch or (lambda: torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    recipe = _PlantedRecipe(name="p", global_batch_size=8, max_epochs=1, target=1.0, eval_every=1, eval_first=1)
    return stepcount.count_step(_PlantedWorkload(parts, make), recipe, CPU, Assets(), [], steps=1, timed_steps=0)


def test_a_library_s_host_data_inside_the_step_counts_as_torch_s_would_not():
    """torchvision's detection transform makes its mean and std with torch.as_tensor(device=) for every image:
    a file of torchvision is not torch's own, though ".../torch" prefixes ".../torchvision"."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    transform = GeneralizedRCNNTransform(8, 8, [0.5] * 3, [0.2] * 3, fixed_size=(8, 8))

    def loss(model, batch):
        images, _ = transform([torch.rand(3, 8, 8, device=DEVICE) for _ in range(2)])
        return model(batch).pow(2).mean() + images.tensors.mean() * 0

    counts = _count(loss)
    assert counts.syncs["blocking copy"] == 4, counts.sites  # mean and std, two images
    assert all("torchvision/models/detection/transform.py" in site and "via " in site and "test_stepcount.py" in site
               for site in counts.sites), counts.sites
    assert stepcount.in_torch(torch.nn.functional.__file__) and not stepcount.in_torch(
        GeneralizedRCNNTransform.__init__.__code__.co_filename)


@pytest.mark.parametrize(("read", "kind"), [
    (lambda t: torch.as_tensor(t, device="cpu"), "host copy"),
    (lambda t: torch.tensor(t, device="cpu"), "host copy"),
    (lambda t: t.to("cpu"), "host copy"),
    (lambda t: torch.empty(t.shape, device="cpu").copy_(t), "host copy"),
    (lambda t: t.cpu(), "host copy"),
    (lambda t: t.detach().to(torch.float64), None),  # a dtype change stays on the device
])
def test_every_form_of_a_device_to_host_copy_is_counted(read, kind):
    def loss(model, batch):
        out = model(batch)
        read(out.detach())
        return out.pow(2).mean()

    syncs = {k: v for k, v in _count(loss).syncs.items() if v}
    assert syncs == ({kind: 1} if kind else {})


@pytest.mark.parametrize(("move", "blocking"), [
    (lambda host: host.to(DEVICE), 1),  # pageable, blocking: the stream is synchronised before the copy returns
    (lambda host: host.to(DEVICE, non_blocking=True), 0),
    (lambda host: host.to(device=DEVICE, dtype=torch.float32, non_blocking=True), 0),
    (lambda host: torch.as_tensor(host, device=DEVICE), 1),
    (lambda host: torch.empty(3, device=DEVICE).copy_(host), 1),
    (lambda host: torch.empty(3, device=DEVICE).copy_(host, non_blocking=True), 0),
    (lambda host: torch.tensor([1.0, 2.0, 3.0], device=DEVICE), 1),
])
def test_a_blocking_host_to_device_copy_is_a_synchronisation(move, blocking):
    def loss(model, batch):
        moved = move(torch.ones(3))
        return model(batch).pow(2).mean() + moved.sum() * 0

    counts = _count(loss)
    assert counts.host_data == 1
    assert counts.syncs["blocking copy"] == blocking, counts.sites


@pytest.mark.parametrize(("classes", "reads"), [(3, 0), (-1, 1)])
def test_one_hot_range_checks_a_gpu_does_not_make_are_not_counted(classes, reads):
    """On a CPU F.one_hot reads its input's minimum and maximum; on a GPU only the maximum, and only when it
    has to infer num_classes."""
    def loss(model, batch):
        hot = torch.nn.functional.one_hot(model(batch).argmax(1), classes)
        return model(batch).pow(2).mean() + hot.sum() * 0

    assert _count(loss).syncs["item"] == reads


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


# -- the GPU's truth: torch's own report of the step's synchronisations ----------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["retinanet", "maskrcnn", "gnmt", "llama31_8b", "dlrm_dcnv2"])
def test_the_counts_are_what_the_gpu_reports(name):
    """The counter (run on the GPU itself) and torch.cuda.set_sync_debug_mode("warn") agree on the step's
    synchronisations, and the docs' "counted on a CPU" figures can drop the qualifier where this passes."""
    ctx = RuntimeContext.create("cuda")
    workload = registry.get(name)
    counted = stepcount.probe(workload, ctx, steps=2, timed_steps=0)
    reported = stepcount.device_syncs(workload, ctx)
    assert counted.sync_total == reported["syncs"], (counted.sites, reported["sites"])
