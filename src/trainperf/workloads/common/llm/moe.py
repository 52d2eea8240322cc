"""Mixture-of-experts layers (the MoE pretraining benchmarks' GPT-OSS and DeepSeek-V3): a router choosing
the top k experts of each token, the experts computed as grouped matrix products over the tokens sorted by
expert, shared experts beside them, the load-balancing loss, and expert parallelism.

Dropless, as the references train (Megatron's dropless MoE): every token reaches all k of its experts. Within
one process the routing is sync-free and static in shape: the assignments are sorted by expert on the device,
each expert's count and offset computed there, and `torch._grouped_mm` takes the offsets as a device tensor
(a CUDA graph can hold it). Each expert's group is padded to `align` rows (16 on CUDA, as the grouped kernels
want) inside a buffer of static size, tokens x k + experts x (align - 1).

Expert parallelism (`shard_experts`): the experts of each layer split over the processes of an "ep" group,
each token's rows sent to the process holding its expert with `all_to_all_single` and sent back after it
(the same as torchtitan's and Megatron's dropless all-to-all dispatcher). Variable split sizes are host
integers in torch.distributed's all-to-all, so this path reads each layer's counts back once per forward:
the one host synchronisation of an MoE step, which the reference frameworks have too, and what keeps such a
step out of a CUDA graph.

A capacity factor (`capacity_factor` > 0; Switch/GShard's, Megatron's `--moe-expert-capacity-factor` with
`--moe-pad-expert-input-to-capacity` and the "position" drop policy) gives every expert a fixed number of
rows per process, ceil(factor x tokens x k / experts) (rounded up to the kernels' alignment): the first
assignments of each expert in token order fill it, the rest are dropped (they add nothing; the token keeps
its residual and its other experts). Every buffer then has a static shape, the all-to-all sends equal
splits and nothing is read back: the step can be captured at any ep. It changes the model's arithmetic
(tokens over capacity are dropped), so it is a recipe choice, off in the references' recipes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf import devices
from trainperf.contract.sharded import ExpertLayer
from trainperf.errors import TrainperfError

SCORINGS = ("softmax_topk", "softmax", "sigmoid")
ACTIVATIONS = ("swiglu", "gpt_oss_swiglu")
BALANCE = ("none", "global", "sequence")


@dataclass(frozen=True)
class MoEConfig:
    """One MoE feed-forward: `experts` routed experts of hidden size `hidden`, `top_k` per token, and
    `shared` always-on experts of the same size beside them."""

    experts: int = 8
    top_k: int = 2
    hidden: int = 256
    shared: int = 0
    # How the router turns logits into expert weights (see Router).
    scoring: str = "softmax_topk"
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "swiglu"
    # DeepSeek-V3's node-limited routing: experts in `groups` groups, each token's experts from its best
    # `topk_groups` groups (0: no grouping), the weights scaled by `routed_scale`.
    groups: int = 0
    topk_groups: int = 0
    routed_scale: float = 1.0
    # The load-balancing loss: over the whole micro-batch's tokens ("global", Switch/GShard's), per sequence
    # ("sequence", DeepSeek-V3's), or none.
    balance: str = "global"
    # Rows each expert takes per process, as a multiple of its even share (0: dropless, as the references).
    capacity_factor: float = 0.0
    # Qwen3-Next/Qwen3.5's gate on the shared experts: their output times sigmoid(x . w), w [dim].
    shared_gate: bool = False

    def check(self, where: str) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise TrainperfError(f"recipe field {where}.top_k={self.top_k}: expected 1 to experts={self.experts}")
        if self.scoring not in SCORINGS:
            raise TrainperfError(f"recipe field {where}.scoring={self.scoring!r}: expected one of "
                                 + ", ".join(SCORINGS))
        if self.activation not in ACTIVATIONS:
            raise TrainperfError(f"recipe field {where}.activation={self.activation!r}: expected one of "
                                 + ", ".join(ACTIVATIONS))
        if self.balance not in BALANCE:
            raise TrainperfError(f"recipe field {where}.balance={self.balance!r}: expected one of "
                                 + ", ".join(BALANCE))
        if self.groups and (self.experts % self.groups or not 1 <= self.topk_groups <= self.groups
                            or self.top_k > self.topk_groups * (self.experts // self.groups)):
            raise TrainperfError(f"recipe field {where}.groups={self.groups}: must divide experts={self.experts}, "
                                 f"with 1 <= topk_groups={self.topk_groups} <= groups and top_k within them")

    def routed_parameters(self, dim: int) -> int:
        """Parameters of all routed experts (three matrices each, biases where used)."""
        bias = (2 * self.hidden + dim) if self.expert_bias else 0
        return self.experts * (3 * dim * self.hidden + bias)

    def active_parameters(self, dim: int) -> int:
        """Parameters a token passes through: router, k routed and the shared experts."""
        per_expert = self.routed_parameters(dim) // self.experts
        router = dim * self.experts + (self.experts if self.router_bias else 0)
        return router + (self.top_k + self.shared) * per_expert - (
            self.shared * ((2 * self.hidden + dim) if self.expert_bias else 0)) + (
            dim if self.shared and self.shared_gate else 0)

    def parameters(self, dim: int) -> int:
        shared = self.shared * 3 * dim * self.hidden + (dim if self.shared_gate else 0)
        router = dim * self.experts + (self.experts if self.router_bias else 0)
        return self.routed_parameters(dim) + shared + router


class Router(nn.Module):
    """Each token's k experts and their weights.

    - "softmax_topk" (GPT-OSS): the k largest logits, their softmax as the weights;
    - "softmax" (Mixtral, Megatron's default): the softmax over all experts, its k largest as the weights;
    - "sigmoid" (DeepSeek-V3): sigmoid scores; the choice adds a per-expert correction bias (not trained by
      the loss: the reference's auxiliary-loss-free balancing adjusts it), limited to the best groups; the
      weights are the chosen scores normalised to sum 1, times `routed_scale`.
    The probabilities the balancing loss reads are the softmax over all experts (sigmoid: the normalised
    scores)."""

    def __init__(self, dim: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(dim, config.experts, bias=config.router_bias)
        if config.scoring == "sigmoid":
            self.register_buffer("correction", torch.zeros(config.experts), persistent=True)
        else:
            self.correction = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, dim] -> weights [N, k], experts [N, k] (int64), probabilities [N, experts] (fp32)."""
        c = self.config
        logits = self.gate(x).float()
        if c.scoring == "softmax_topk":
            top, chosen = logits.topk(c.top_k, dim=-1)
            return top.softmax(dim=-1), chosen, logits.softmax(dim=-1)
        if c.scoring == "softmax":
            probs = logits.softmax(dim=-1)
            weights, chosen = probs.topk(c.top_k, dim=-1)
            return weights, chosen, probs
        scores = logits.sigmoid()
        biased = scores + self.correction
        if c.groups:
            per_group = biased.view(-1, c.groups, c.experts // c.groups)
            group_score = per_group.topk(2, dim=-1).values.sum(-1) if per_group.shape[-1] > 1 else per_group[..., 0]
            keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(c.topk_groups, dim=-1).indices, 1.0)
            biased = biased.masked_fill(keep.repeat_interleave(c.experts // c.groups, dim=1) == 0, float("-inf"))
        chosen = biased.topk(c.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-20) * c.routed_scale
        return weights, chosen, scores / scores.sum(dim=-1, keepdim=True).clamp(min=1e-20)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows of x [M, a] grouped by expert (group e ends at row ends[e], int32 on x's device) times that
    expert's matrix w [E, a, b]. `torch._grouped_mm` where it runs (CUDA in bf16 on Hopper and later; a CPU
    in eager), a padded batched product elsewhere: each group placed in an [E, M, a] buffer (sync-free,
    static, E times the work: a fallback, not the fast path)."""
    if _grouped_kernel(x, w):
        return torch._grouped_mm(x, w, offs=ends)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]]).long()
    rows = torch.arange(x.shape[0], device=x.device)
    group = torch.searchsorted(ends.long(), rows, right=True).clamp(max=w.shape[0] - 1)
    inside = rows < ends[-1].long()
    slot = rows - starts[group]
    padded = x.new_zeros(w.shape[0], x.shape[0], x.shape[1])
    padded = padded.index_put((group, slot), torch.where(inside[:, None], x, 0))
    out = torch.bmm(padded, w)
    return torch.where(inside[:, None], out[group, slot], 0)


def _grouped_kernel(x: torch.Tensor, w: torch.Tensor) -> bool:
    # The kernels read rows at 16-byte strides.
    if not hasattr(torch, "_grouped_mm") or (x.shape[-1] * x.element_size()) % 16 or (
            w.shape[-1] * w.element_size()) % 16:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and devices.capability(x.device)[0] >= 9
    # torch's CPU kernel runs eagerly in any float type; its meta function (what torch.compile traces)
    # accepts bf16 only.
    return x.device.type == "cpu" and (x.dtype == torch.bfloat16 or not torch.compiler.is_compiling())


class GroupedExperts(nn.Module):
    """`experts` feed-forwards as three stacked weights [E, dim, hidden], [E, dim, hidden], [E, hidden, dim]
    (torchtitan's layout), run on the rows of each expert's group.

    "swiglu": w2(silu(x w1) * x w3); "gpt_oss_swiglu", GPT-OSS's: the gate clamped above at 7, the up
    projection clamped to [-7, 7], (up + 1) * gate * sigmoid(1.702 gate)."""

    def __init__(self, dim: int, config: MoEConfig, experts: int | None = None) -> None:
        super().__init__()
        n = config.experts if experts is None else experts
        self.activation = config.activation
        self.w1 = nn.Parameter(torch.empty(n, dim, config.hidden))
        self.w3 = nn.Parameter(torch.empty(n, dim, config.hidden))
        self.w2 = nn.Parameter(torch.empty(n, config.hidden, dim))
        if config.expert_bias:
            self.b1 = nn.Parameter(torch.empty(n, config.hidden))
            self.b3 = nn.Parameter(torch.empty(n, config.hidden))
            self.b2 = nn.Parameter(torch.empty(n, dim))
        else:
            self.b1 = self.b3 = self.b2 = None

    def forward(self, x: torch.Tensor, ends: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """x [M, dim] sorted by expert, `ends` each group's end row, `group` each row's expert (its bias)."""
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        x = x.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            gate = grouped_mm(x, self.w1.to(dtype), ends)
            up = grouped_mm(x, self.w3.to(dtype), ends)
            if self.b1 is not None:
                gate, up = gate + self.b1.to(dtype)[group], up + self.b3.to(dtype)[group]
            if self.activation == "gpt_oss_swiglu":
                gate, up = gate.clamp(max=7.0), up.clamp(min=-7.0, max=7.0)
                hidden = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            else:
                hidden = F.silu(gate) * up
            out = grouped_mm(hidden, self.w2.to(dtype), ends)
            if self.b2 is not None:
                out = out + self.b2.to(dtype)[group]
        return out


class SharedExperts(nn.Module):
    """The always-on experts (DeepSeek's), as one SwiGLU feed-forward of shared x hidden."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@dataclass
class ExpertGroup:
    """The processes one layer's experts are split over (expert parallelism): this process holds experts
    [rank x local, (rank + 1) x local)."""

    group: Any
    rank: int
    size: int


def balance_loss(probs: torch.Tensor, chosen: torch.Tensor, experts: int, sequences: int, kind: str
                 ) -> torch.Tensor:
    """Switch/GShard's load-balancing loss, experts x sum over experts of (share of the k x tokens routed
    to it) x (its mean router probability): 1 when balanced. "sequence" (DeepSeek-V3's): the same per
    sequence, averaged over the sequences (a batch split by sequences gives the same mean)."""
    if kind == "none":
        return probs.new_zeros(())
    groups = sequences if kind == "sequence" else 1
    top_k = chosen.shape[-1]
    probs = probs.view(groups, -1, experts)
    hits = torch.zeros(groups, experts, device=probs.device, dtype=torch.float32)
    hits.scatter_add_(1, chosen.view(groups, -1), torch.ones_like(chosen, dtype=torch.float32).view(groups, -1))
    share = hits / (probs.shape[1] * top_k)
    return experts * (share * probs.mean(dim=1)).sum(dim=1).mean()


class MoE(ExpertLayer):
    """The MoE feed-forward of a block: x [B, T, dim] -> (output, balancing loss). The loss is returned, not
    stored, so that compiled and recomputed blocks stay pure functions; the last step's tokens per expert
    are kept in the `load` buffer (device-side, read by `bench`)."""

    def __init__(self, dim: int, config: MoEConfig) -> None:
        super().__init__()
        config.check("model.moe")
        self.config = config
        self.router = Router(dim, config)
        self.experts = GroupedExperts(dim, config)
        self.shared = SharedExperts(dim, config.shared * config.hidden) if config.shared else None
        self.shared_gate = nn.Linear(dim, 1, bias=False) if config.shared and config.shared_gate else None
        # Rows per expert group the grouped kernels want: None, 16 on CUDA and 1 elsewhere.
        self.align: int | None = None
        self.register_buffer("load", torch.zeros(config.experts), persistent=False)
        # Tokens per expert summed over a training step's forwards (the correction bias's update reads it).
        self.register_buffer("tokens_seen", torch.zeros(config.experts), persistent=False)
        self.ep: ExpertGroup | None = None

    def shard_experts(self, group: Any, rank: int, size: int) -> None:
        """Keep only this process's experts (expert parallelism over `size` processes)."""
        if self.config.experts % size:
            raise TrainperfError(f"expert parallelism ep={size}: the {self.config.experts} experts of a layer do "
                                 "not split evenly")
        local = self.config.experts // size
        for name, param in list(self.experts.named_parameters()):
            mine = param.detach().narrow(0, rank * local, local).clone()
            setattr(self.experts, name, nn.Parameter(mine, requires_grad=param.requires_grad))
        self.ep = ExpertGroup(group, rank, size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        batch, seq, dim = x.shape
        flat = x.reshape(-1, dim)
        weights, chosen, probs = self.router(flat)
        aux = balance_loss(probs, chosen, c.experts, batch, c.balance)
        assigned = chosen.flatten()
        counts = torch.zeros(c.experts, device=x.device, dtype=torch.int64).scatter_add_(
            0, assigned, torch.ones_like(assigned))
        with torch.no_grad():
            self.load.copy_(counts)
            if self.training and self.router.correction is not None:
                self.tokens_seen.add_(counts)
        order = assigned.argsort(stable=True)  # assignments by expert, tokens in order within each
        rows = flat[order // c.top_k]
        if c.capacity_factor:
            out_rows = self._dropping(rows, counts, assigned[order])
        elif self.ep is None:
            out_rows = self._local(rows, counts, assigned[order])
        else:
            out_rows = self._parallel(rows, counts)
        # Back to assignment order (a gather: deterministic), weighted, summed over each token's k experts.
        unsorted = out_rows[order.argsort()]
        out = (unsorted.float().view(-1, c.top_k, dim) * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
        out = out.view(batch, seq, dim)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out, aux

    def _local(self, rows: torch.Tensor, counts: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        align = self.align or (16 if rows.device.type == "cuda" else 1)
        if align == 1:
            return self.experts(rows, counts.cumsum(0).to(torch.int32), group)
        # Each group padded to `align` rows in a static buffer; padding rows are zeros, their outputs dropped.
        padded_counts = (counts + align - 1) // align * align
        padded_ends = padded_counts.cumsum(0)
        starts = counts.cumsum(0) - counts
        index = padded_ends[group] - padded_counts[group] + (torch.arange(rows.shape[0], device=rows.device)
                                                            - starts[group])
        size = rows.shape[0] + counts.shape[0] * (align - 1)
        buffer = rows.new_zeros(size, rows.shape[1]).index_copy(0, index, rows)
        expert_of = torch.zeros(size, dtype=group.dtype, device=group.device).index_copy(0, index, group)
        out = self.experts(buffer, padded_ends.to(torch.int32), expert_of)
        return out[index]

    def _parallel(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd

        assert self.ep is not None
        size, local = self.ep.size, self.config.experts // self.ep.size
        # What each process sends me for each of my experts: [sender, local expert].
        received = all_to_all_single(counts, None, None, self.ep.group).view(size, local)
        send = counts.view(size, local).sum(1)
        splits = torch.cat([send, received.sum(1)]).tolist()  # the step's host read (split sizes)
        send_splits, recv_splits = splits[:size], splits[size:]
        incoming = all_to_all_single_autograd(rows, recv_splits, send_splits, self.ep.group)
        total = sum(recv_splits)
        expert = torch.arange(local, device=rows.device).repeat(size).repeat_interleave(
            received.flatten(), output_size=total)
        by_expert = expert.argsort(stable=True)
        out = self._local(incoming[by_expert], received.sum(0), expert[by_expert])
        back = out[by_expert.argsort()]
        return all_to_all_single_autograd(back, send_splits, recv_splits, self.ep.group)


    def capacity(self, tokens: int, device: torch.device) -> int:
        """Rows per expert per process for `tokens` tokens: the factor times the even share, at least one,
        rounded up to the grouped kernels' alignment."""
        c = self.config
        align = self.align or (16 if device.type == "cuda" else 1)
        rows = max(1, math.ceil(c.capacity_factor * tokens * c.top_k / c.experts))
        return -(-rows // align) * align

    def _dropping(self, rows: torch.Tensor, counts: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """`rows` sorted by expert (`group`) -> the experts' outputs for them, zeros where an assignment was over
        its expert's capacity; every shape static, nothing read back (see the module's docstring)."""
        c = self.config
        experts, dim, device = c.experts, rows.shape[1], rows.device
        cap = self.capacity(rows.shape[0] // c.top_k, device)
        starts = counts.cumsum(0) - counts
        position = torch.arange(rows.shape[0], device=device) - starts[group]
        # Each kept assignment's slot in [expert, capacity]; the dropped ones all go to one spare row.
        slot = torch.where(position < cap, group * cap + position, experts * cap)
        buffer = rows.new_zeros(experts * cap + 1, dim).index_copy(0, slot, rows)[:-1]
        if self.ep is None:
            local, senders = experts, 1
            grouped = buffer
        else:
            from torch.distributed._functional_collectives import all_to_all_single_autograd

            senders, local = self.ep.size, experts // self.ep.size
            # Equal splits: each process gets [sender, its local expert, capacity] rows.
            received = all_to_all_single_autograd(buffer, None, None, self.ep.group)
            grouped = received.view(senders, local, cap, dim).transpose(0, 1).reshape(-1, dim)
        per_expert = senders * cap
        ends = torch.arange(1, local + 1, device=device, dtype=torch.int32) * per_expert
        expert_of = torch.arange(local, device=device).repeat_interleave(per_expert)
        out = self.experts(grouped, ends, expert_of)
        if self.ep is not None:
            out = out.view(local, senders, cap, dim).transpose(0, 1).reshape(-1, dim)
            out = all_to_all_single_autograd(out, None, None, self.ep.group)
        return torch.cat([out, out.new_zeros(1, dim)])[slot]


def init_moe(module: MoE, std: float, residual_std: float) -> None:
    """Normal(0, std) router and input projections, Normal(0, residual_std) output projections, zero biases
    and correction."""
    nn.init.normal_(module.router.gate.weight, std=std)
    if module.router.gate.bias is not None:
        nn.init.zeros_(module.router.gate.bias)
    if module.router.correction is not None:
        nn.init.zeros_(module.router.correction)
    experts = module.experts
    nn.init.normal_(experts.w1, std=std)
    nn.init.normal_(experts.w3, std=std)
    nn.init.normal_(experts.w2, std=residual_std)
    for bias in (experts.b1, experts.b3, experts.b2):
        if bias is not None:
            nn.init.zeros_(bias)
    if module.shared is not None:
        nn.init.normal_(module.shared.w1.weight, std=std)
        nn.init.normal_(module.shared.w3.weight, std=std)
        nn.init.normal_(module.shared.w2.weight, std=residual_std)
    if module.shared_gate is not None:
        nn.init.normal_(module.shared_gate.weight, std=std)
    module.load.zero_()
    module.tokens_seen.zero_()


@torch.no_grad()
def update_corrections(model: nn.Module, rate: float) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing, after an optimizer step: each sigmoid router's
    correction bias moves by `rate` toward the mean load, rate x sign(mean - tokens of the expert), from the
    tokens all processes routed in the step (one all-reduce, no host read). A recomputed forward counts its
    tokens twice, every expert's alike, which leaves the signs as they are."""
    import torch.distributed as dist

    layers = [m for m in model.modules() if isinstance(m, MoE) and m.router.correction is not None]
    if not layers or rate <= 0:
        return
    seen = torch.stack([m.tokens_seen for m in layers])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(seen)
    shift = rate * torch.sign(seen.mean(dim=1, keepdim=True) - seen)
    for layer, delta in zip(layers, shift, strict=True):
        assert layer.router.correction is not None
        layer.router.correction.add_(delta)
        layer.tokens_seen.zero_()


def load_imbalance(model: nn.Module) -> dict[str, float]:
    """Tokens per expert of the last forward, max over mean, over every MoE layer of `model` (this process's
    tokens): the worst layer's and the mean over layers. One host read: for reports, never in a step."""
    loads = [m.load for m in model.modules() if isinstance(m, MoE)]
    if not loads:
        return {}
    stacked = torch.stack([load.float() for load in loads])
    ratios = (stacked.max(dim=1).values / stacked.mean(dim=1).clamp(min=1e-9)).tolist()
    return {"expert_load_max_over_mean": max(ratios), "expert_load_max_over_mean_avg": sum(ratios) / len(ratios),
            "moe_layers": float(len(ratios))}


def std_for(dim: int) -> float:
    return 1.0 / math.sqrt(dim)
