"""How many GPUs a fully sharded model needs, and in which layout: for each tensor-parallel size and
activation checkpointing, the smallest data-parallel group whose per-GPU memory fits, from the model's
parameter count (built on the meta device: nothing allocated) and its own count of what one sequence
keeps for the backward (`activation_bytes(seq_len, tp, checkpointing)`).

Per GPU of N = dp x tp, with FSDP2 over dp and tensor/sequence parallelism over tp (runtime/fsdp.py):
- sharded state over N: 16 bytes a trained parameter (its fp32 weight and gradient, AdamW's two moments),
  a frozen one's weight as stored (LoRA's base: bf16, no gradient, no optimizer state);
- gathered for compute: two blocks' bf16 weights (the one running and the one prefetched) and one block's
  fp32 gradient of its trained parameters before its reduce-scatter, over tp; the parameters outside the
  blocks (embeddings, output layer: FSDP's root unit) in bf16 with the fp32 gradient of the trained ones,
  over tp;
- the activations of one micro-batch of one sequence (the references' micro-batch);
all times bench.memory's MARGIN (allocator slack, temporaries, the CUDA context). Pipeline parallelism is
not built (the 405B reference adds PP 9 and CP 4 to spread the activations of its 126 blocks).

A mixture-of-experts model (a recipe with `ep`) is laid out over expert parallelism instead of tensor
parallelism: every GPU data-parallel (N = dp, a multiple of ep), each MoE layer's routed experts split over
ep and fully sharded over N / ep, so the state is still sharded N ways, but a block gathers its own share
of the experts only (its routed experts / ep). Its activations assume balanced routing (each GPU's experts
receive as many rows as its tokens send out): a skewed router needs more."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from trainperf.bench.memory import MARGIN
from trainperf.contract import Assets, FullyShard, Recipe, RuntimeContext, ShardedModel, Workload, bare_model
from trainperf.contract.parallel import CHECKPOINTING
from trainperf.errors import TrainperfError

TP_SIZES = (1, 2, 4, 8)  # within one node's NVLink domain, as tensor parallelism is run
EP_SIZES = (1, 2, 4, 8, 16, 32, 64)  # the all-to-all spans nodes (DeepSeek-V3's reference: EP 64)
STATE_BYTES = 16  # fp32 weight + fp32 gradient + two fp32 AdamW moments


@dataclass(frozen=True)
class Layout:
    tp: int
    checkpointing: str
    dp: int
    state: int  # bytes per GPU, each part before the margin
    gathered: int
    activations: int
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp

    @property
    def need(self) -> int:
        return int((self.state + self.gathered + self.activations) * MARGIN)


@dataclass(frozen=True)
class Shape:
    """What the plan reads from the model: parameters in all, of its largest block, outside its blocks (and
    of each, those trained), the bytes of the frozen ones as stored."""

    parameters: int
    block: int
    outside: int
    model: torch.nn.Module
    seq_len: int
    trained: int = -1  # -1: all
    block_trained: int = -1
    outside_trained: int = -1
    frozen_bytes: int = 0
    block_routed: int = 0  # of the largest block, the routed experts' parameters (split by expert parallelism)

    def __post_init__(self) -> None:
        for name, whole in (("trained", self.parameters), ("block_trained", self.block),
                            ("outside_trained", self.outside)):
            if getattr(self, name) < 0:
                object.__setattr__(self, name, whole)


def shape_of(workload: Workload, recipe: Recipe) -> Shape:
    """The full-scale model built on the meta device (no memory, no data): its FullyShard spec checked."""
    meta = torch.device("meta")
    with meta:
        parts = workload.build(recipe, RuntimeContext(device=meta), Assets())
    if not isinstance(parts.parallel, FullyShard):
        raise TrainperfError(f"plan {workload.name}: its model is not fully sharded (FSDP); nothing to lay out")
    model = bare_model(parts.model)
    if not isinstance(model, ShardedModel) or type(model).activation_bytes is ShardedModel.activation_bytes:
        raise TrainperfError(f"plan {workload.name}: {type(model).__name__} needs to be a spec.ShardedModel with "
                             "`activation_bytes(seq_len, tp, checkpointing)` for a memory plan")
    units = [*model.blocks, *model.shard_units()]  # what FSDP gathers one at a time
    sizes = [sum(p.numel() for p in block.parameters()) for block in units]
    trained_sizes = [sum(p.numel() for p in block.parameters() if p.requires_grad) for block in units]
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    routed = sum(p.numel() for name, p in units[largest].named_parameters() if ".experts." in f".{name}")
    return Shape(total, sizes[largest], total - sum(sizes), model, int(recipe.seq_len), trained,
                 trained_sizes[largest], trained - sum(trained_sizes), frozen_bytes, routed)


def layout(shape: Shape, tp: int, checkpointing: str, dp: int, ep: int = 1) -> Layout:
    gpus = dp * tp
    state = (shape.trained * STATE_BYTES + shape.frozen_bytes) // gpus
    # Expert parallelism leaves a block (ep - 1) / ep of its routed experts to the other GPUs of its group.
    block = shape.block - shape.block_routed + shape.block_routed // ep
    block_trained = shape.block_trained - shape.block_routed + shape.block_routed // ep
    gathered = (block * 2 * 2 + block_trained * 4 + shape.outside * 2 + shape.outside_trained * 4) // tp
    activations = int(shape.model.activation_bytes(shape.seq_len, tp, checkpointing))
    return Layout(tp, checkpointing, dp, state, gathered, activations, ep)


# No cluster holds more data-parallel replicas than this: the search for the fewest that fit stops here
# (it once walked every number up to the global batch: `--batch-size 1000000000000` never ended).
MAX_DP = 1 << 20


def data_parallel_sizes(global_batch: int) -> list[int]:
    """Every dp that divides the global batch (each replica takes an equal share), up to MAX_DP."""
    return [d for d in range(1, min(global_batch, MAX_DP) + 1) if global_batch % d == 0]


def plan(workload: Workload, recipe: Recipe, memory: int, devices: int | None = None) -> list[dict[str, Any]]:
    """One row per (tp, checkpointing) the model's shape allows: the fewest GPUs that fit `memory` each
    (None: none up to the global batch), and, with `devices`, the need at that count."""
    shape = shape_of(workload, recipe)
    if hasattr(recipe, "ep"):
        return _expert_plan(workload, recipe, shape, memory, devices)
    rows = []
    for tp in TP_SIZES:
        try:
            candidate = dataclasses.replace(recipe, tp=tp)
            candidate.validate()
            workload.check_recipe(candidate)
        except TrainperfError:
            continue  # a size the heads or the feed-forward do not split by
        for checkpointing in CHECKPOINTING:
            fewest = next((candidate for dp in data_parallel_sizes(recipe.global_batch_size)
                           if (candidate := layout(shape, tp, checkpointing, dp)).need <= memory), None)
            row: dict[str, Any] = {"tp": tp, "checkpointing": checkpointing,
                                   "fewest": dataclasses.asdict(fewest) | {"gpus": fewest.gpus, "need": fewest.need}
                                   if fewest else None}
            if devices is not None:
                if devices % tp or recipe.global_batch_size % (devices // tp):
                    row["at_devices"] = None
                else:
                    at = layout(shape, tp, checkpointing, devices // tp)
                    row["at_devices"] = dataclasses.asdict(at) | {"gpus": at.gpus, "need": at.need,
                                                                 "fits": at.need <= memory}
            rows.append(row)
    return rows


def _expert_plan(workload: Workload, recipe: Recipe, shape: Shape, memory: int, devices: int | None
                 ) -> list[dict[str, Any]]:
    rows = []
    for ep in EP_SIZES:
        try:
            candidate = dataclasses.replace(recipe, ep=ep)
            candidate.validate()
        except TrainperfError:
            continue  # a size the experts do not split by
        for checkpointing in CHECKPOINTING:
            fewest = next((candidate for dp in data_parallel_sizes(recipe.global_batch_size) if dp % ep == 0
                           and (candidate := layout(shape, 1, checkpointing, dp, ep)).need <= memory), None)
            row: dict[str, Any] = {"tp": 1, "ep": ep, "checkpointing": checkpointing,
                                   "fewest": dataclasses.asdict(fewest) | {"gpus": fewest.gpus, "need": fewest.need}
                                   if fewest else None}
            if devices is not None:
                if devices % ep or recipe.global_batch_size % devices:
                    row["at_devices"] = None
                else:
                    at = layout(shape, 1, checkpointing, devices, ep)
                    row["at_devices"] = dataclasses.asdict(at) | {"gpus": at.gpus, "need": at.need,
                                                                 "fits": at.need <= memory}
            rows.append(row)
    return rows


def _gib(count: int) -> str:
    return f"{count / 2**30:,.1f}"


def plan_table(rows: list[dict[str, Any]], devices: int | None) -> str:
    axis = "ep" if any("ep" in row for row in rows) else "tp"
    head = (f"| {axis} | checkpointing | fewest GPUs ({'dp' if axis == 'ep' else 'dp x tp'}) | GiB per GPU: state + "
            "gathered + activations, x margin |")
    rule = "|---|---|---|---|"
    if devices is not None:
        head += f" at {devices} GPUs |"
        rule += "---|"
    lines = [head, rule]
    for row in rows:
        fewest = row["fewest"]
        if fewest:
            cell = (f"{fewest['gpus']:,}" + ("" if axis == "ep" else f" ({fewest['dp']} x {fewest['tp']})"),
                    f"{_gib(fewest['state'])} + {_gib(fewest['gathered'])} + {_gib(fewest['activations'])} "
                    f"→ {_gib(fewest['need'])}")
        else:
            cell = ("does not fit", "-")
        line = f"| {row[axis]} | {row['checkpointing']} | {cell[0]} | {cell[1]} |"
        if devices is not None:
            at = row.get("at_devices")
            line += (" not a layout of them |" if at is None
                     else f" {_gib(at['need'])} GiB {'fits' if at['fits'] else 'does not fit'} |")
        lines.append(line)
    return "\n".join(lines)
