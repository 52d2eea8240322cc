"""What a training step asks of the host, counted on a CPU: the counter finds what is planted in a step,
and every workload's full-scale step stays within its budget of operators, synchronisations and
host-data tensors (benchmarks/step_ops.py prints the figures; the README's GPU section has the table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from trainperf import registry
from trainperf.bench import stepcount
from trainperf.spec import Assets, ModelParts, Recipe, RuntimeContext

CPU = RuntimeContext(device=torch.device("cpu"))


@dataclass(frozen=True)
class Budget:
    """At most this many per step: operators dispatched, synchronisations of each kind, host-data tensors.
    Operators have ~10 % headroom over the measured count (torch versions differ a little); the
    synchronisations and host-data tensors have none: a change that adds one fails here. Lower a budget
    when a change removes work, so that it stays removed."""

    ops: int
    syncs: dict[str, int] = field(default_factory=dict)
    host_data: int = 0
    # Two steps of one batch do the same work (what CUDA Graphs replay); False: known not to, said why.
    replays: bool = True


BUDGETS: dict[str, Budget] = {
    "resnet": Budget(ops=2_300),
    "ncf": Budget(ops=150),
    "dlrm": Budget(ops=620),
    "ssd": Budget(ops=820),  # its matching had 3 boolean-mask indexes
    "retinanet": Budget(ops=2_200),  # had 7 syncs: one_hot's range check, nonzero, torchvision's box check
    "transformer": Budget(ops=3_870),
    "gnmt": Budget(ops=1_230, host_data=1),  # the packing permutation; torch's packing synced 8 times
    "bert": Budget(ops=5_260),  # 10,527 with the per-tensor LAMB
    "rnnt": Budget(ops=5_260),  # 10,469 before the lattice's loops were trimmed; the EMA synced twice
    "unet3d": Budget(ops=780),  # one_hot's range check synced twice
    # 2,934: had 45 data-dependent shapes (torchvision's RPN and RoI heads selecting proposals and samples,
    # 2,269 ops); the sync-free heads select by masks over fixed slots (workloads/maskrcnn/syncfree.py).
    "maskrcnn": Budget(ops=3_230),
    "minigo": Budget(ops=330),
    "llama31_8b": Budget(ops=700),  # 638: no sync (the causal mask is SDPA's, the loss a plain mean)
    "llama31_405b": Budget(ops=1_050),  # 967: llama31_8b's step with each block recomputed in the backward
    # 438 ops. Had 25 .item() in the backward (DDP's static_graph, TorchRec's default: one read per dense tensor
    # a step), a host copy in the forward (TorchRec reading each feature's value count back: now given), and
    # torch's per-tensor Adagrad 25 more (fused now). FBGEMM's copy of its feature dims to the host, once at
    # its first call, falls in the warm-up, which the counter watches: a host tensor after it, as on a GPU.
    "dlrm_dcnv2": Budget(ops=480),
    # 1,062: the frozen base's step recomputed, the adapters' products (B per q, k, v)
    "llama2_70b_lora": Budget(ops=1_170),
    # 921: 2 blocks (one windowed) of 8 experts, dropless routing sorted and counted on the device, one process
    "gpt_oss_20b": Budget(ops=1_010),
    # 1,738: a dense and an MoE block of latent attention, grouped sigmoid routing, a shared expert, the
    # sequence-wise balancing loss, multi-token prediction, the correction biases' update after the step
    "deepseekv3_671b": Budget(ops=1_900),
    # 1,445: a double and a single block of width 256 (the full rotary axes), the posterior sample, noise and
    # timesteps drawn on the device, the fp32 rotary tables made in the step
    "flux1": Budget(ops=1_600),
}


def test_every_registered_workload_has_a_budget():
    assert set(BUDGETS) == set(registry.names())


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
