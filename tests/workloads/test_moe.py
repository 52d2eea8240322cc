"""The MoE pretraining benchmarks (gpt_oss_20b, deepseekv3_671b): parameter counts against the references,
the MoE layer against a token-by-token definition, routing, balancing, attention windows and sinks, and
expert parallelism on two gloo processes against one process."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import launch, mean_step_losses
from trainperf.contract import FullyShard, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.runtime import distributed
from trainperf.runtime.fsdp import FSDPEngine
from trainperf.runtime.step import TrainStep
from trainperf.workloads.common.llm import moe
from trainperf.workloads.common.llm.moe import MoE, MoEConfig, balance_loss, init_moe, update_corrections
from trainperf.workloads.common.llm.moe_model import (
    GPT_OSS_20B,
    GPT_OSS_20B_CARD,
    MoETransformer,
    _attend_with_sinks,
    _local_attention,
    yarn_frequencies,
)
from trainperf.workloads.deepseekv3_671b import DeepSeekV3Workload
from trainperf.workloads.deepseekv3_671b.recipes import DEEPSEEK_RECIPES, DEEPSEEK_V3, MLPERF_DEEPSEEK_V3
from trainperf.workloads.gpt_oss_20b import GptOssWorkload
from trainperf.workloads.gpt_oss_20b.recipes import FULL_RECIPES, MINI


def _count(config, seq=16) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in MoETransformer(config, seq).parameters())


def test_parameter_counts_are_the_references():
    # MLPerf's GPT-OSS-20B (Megatron, no biases or sinks, QK norm, Llama 3.1's 128,256 tokens).
    assert _count(GPT_OSS_20B) == GPT_OSS_20B.parameters() == 20_488_418_112
    assert GPT_OSS_20B.active_parameters() == 3_397_530_432
    # OpenAI's model card: 20.91 B total, 3.61 B active (the output layer counted, the input embedding not).
    assert _count(GPT_OSS_20B_CARD) == GPT_OSS_20B_CARD.parameters() == 20_914_757_184
    assert round(GPT_OSS_20B_CARD.active_parameters() / 1e9, 2) == 3.61
    # DeepSeek-V3: 671 B without the multi-token prediction module, 37 B active (36.6 B; DeepSeek's weights
    # README: 36.7 B with the embedding's share), the MTP module 11.6 B (Hugging Face's 685 B holds its own
    # copies of the embedding and output layer too).
    assert DEEPSEEK_V3.main_parameters() == 671_026_404_352
    assert round(DEEPSEEK_V3.active_parameters() / 1e9) == 37
    assert DEEPSEEK_V3.mtp_parameters() == 11_610_067_968
    assert _count(DEEPSEEK_V3) == DEEPSEEK_V3.parameters()
    assert round((DEEPSEEK_V3.parameters() + 2 * 129_280 * 7_168) / 1e9) == 684
    # MLPerf's: the same rows (the reference keeps DeepSeek-V3's vocabulary; Llama 3.1's tokenizer uses 128,256).
    assert MLPERF_DEEPSEEK_V3 == DEEPSEEK_V3


def _naive(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every token through each of its k experts, one at a time: the definition."""
    flat = x.reshape(-1, x.shape[-1])
    weights, chosen, _ = layer.router(flat)
    e = layer.experts
    rows = []
    for t in range(flat.shape[0]):
        total = torch.zeros_like(flat[t])
        for j in range(chosen.shape[1]):
            i = chosen[t, j]
            gate, up = flat[t] @ e.w1[i], flat[t] @ e.w3[i]
            if e.b1 is not None:
                gate, up = gate + e.b1[i], up + e.b3[i]
            if e.activation == "gpt_oss_swiglu":
                gate, up = gate.clamp(max=7), up.clamp(-7, 7)
                hidden = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            else:
                hidden = F.silu(gate) * up
            out = hidden @ e.w2[i] + (e.b2[i] if e.b2 is not None else 0)
            total = total + weights[t, j] * out
        rows.append(total)
    out = torch.stack(rows).view_as(x)
    return out + layer.shared(x) if layer.shared is not None else out


CONFIGS = {
    "gpt-oss (reference)": MoEConfig(experts=8, top_k=2, hidden=32),
    "gpt-oss (card)": MoEConfig(experts=8, top_k=4, hidden=32, router_bias=True, expert_bias=True,
                                activation="gpt_oss_swiglu"),
    "mixtral": MoEConfig(experts=8, top_k=2, hidden=32, scoring="softmax", balance="global"),
    "deepseek": MoEConfig(experts=16, top_k=4, hidden=32, shared=1, scoring="sigmoid", groups=4, topk_groups=2,
                          routed_scale=2.5, balance="sequence"),
}


@pytest.mark.parametrize("align", [1, 16])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_moe_layer_is_each_token_through_its_experts(name, align):
    torch.manual_seed(0)
    layer = MoE(16, CONFIGS[name])
    layer.align = align  # CUDA's padding of each expert's group, exercised on the CPU
    init_moe(layer, 0.3, 0.2)
    for bias in (layer.experts.b1, layer.experts.b3, layer.experts.b2):
        if bias is not None:
            torch.nn.init.normal_(bias, std=0.1)
    x = torch.randn(2, 9, 16, requires_grad=True)
    out, _ = layer(x)
    ref = _naive(layer, x)
    assert torch.allclose(out, ref, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, layer.experts.w1, layer.router.gate.weight], g)
    want = torch.autograd.grad(ref, [x, layer.experts.w1, layer.router.gate.weight], g)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert int(layer.load.sum()) == 18 * CONFIGS[name].top_k


def _naive_with_capacity(layer: MoE, x: torch.Tensor, capacity: int) -> torch.Tensor:
    """The definition of capacity dropping: each expert takes its first `capacity` assignments in token order
    (token t's j-th choice is assignment t x k + j); a dropped assignment adds nothing."""
    flat = x.reshape(-1, x.shape[-1])
    weights, chosen, _ = layer.router(flat)
    taken = torch.zeros(layer.config.experts, dtype=torch.int64)
    keep = torch.zeros_like(chosen, dtype=torch.bool)
    for t in range(chosen.shape[0]):
        for j in range(chosen.shape[1]):
            e = int(chosen[t, j])
            keep[t, j] = bool(taken[e] < capacity)
            taken[e] += 1
    real = layer.router.forward

    def router(rows):
        w, c, p = real(rows)
        return w * keep, c, p

    layer.router.forward = router
    try:
        return _naive(layer, x)
    finally:
        del layer.router.forward


@pytest.mark.parametrize("align", [1, 16])
@pytest.mark.parametrize(("factor", "drops"), [(4.0, False), (0.6, True)])
def test_a_capacity_factor_drops_what_is_over_each_experts_capacity(factor, drops, align):
    """Static shapes for a graphable dispatch: every expert's rows in a buffer of its capacity, the assignments
    past it dropped (position policy); a factor of experts / k drops nothing and is the dropless layer."""
    config = dataclasses.replace(CONFIGS["gpt-oss (card)"], capacity_factor=factor)
    torch.manual_seed(0)
    layer = MoE(16, config)
    layer.align = align
    init_moe(layer, 0.3, 0.2)
    for bias in (layer.experts.b1, layer.experts.b3, layer.experts.b2):
        torch.nn.init.normal_(bias, std=0.1)
    x = torch.randn(2, 9, 16, requires_grad=True)
    capacity = layer.capacity(18, x.device)
    assert capacity == -(-max(1, math.ceil(factor * 18 * 4 / 8)) // align) * align
    out, _ = layer(x)
    ref = _naive_with_capacity(layer, x, capacity)
    assert torch.allclose(out, ref, atol=1e-5)
    assert (int(layer.load.max()) > capacity) == (drops and align == 1)  # 16-row alignment: room for all
    if not drops:
        assert torch.allclose(out, _naive(layer, x), atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, layer.experts.w1, layer.router.gate.weight], g)
    want = torch.autograd.grad(ref, [x, layer.experts.w1, layer.router.gate.weight], g)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_padded_fallback_equals_the_grouped_kernel(monkeypatch):
    x, w = torch.randn(11, 8), torch.randn(3, 8, 8)
    ends = torch.tensor([4, 4, 9], dtype=torch.int32)  # an empty group, and rows past the last group
    fast = moe.grouped_mm(x, w, ends)
    monkeypatch.setattr(moe, "_grouped_kernel", lambda *_: False)
    slow = moe.grouped_mm(x, w, ends)
    assert torch.allclose(fast[:9], slow[:9], atol=1e-5) and not slow[9:].any()
    assert torch.allclose(slow[4:9], x[4:9] @ w[2], atol=1e-5)


def test_deepseeks_routing_keeps_to_the_best_groups_and_scales_its_weights():
    config = CONFIGS["deepseek"]
    layer = MoE(16, config)
    init_moe(layer, 0.5, 0.1)
    layer.router.correction.copy_(torch.linspace(-1, 1, 16))  # the bias moves the choice, not the weights
    x = torch.randn(40, 16)
    weights, chosen, _ = layer.router(x)
    scores = layer.router.gate(x).sigmoid()
    biased = (scores + layer.router.correction).view(40, 4, 4)
    best_groups = biased.topk(2, dim=-1).values.sum(-1).topk(2, dim=-1).indices
    assert all(set((chosen[t] // 4).tolist()) <= set(best_groups[t].tolist()) for t in range(40))
    assert torch.allclose(weights.sum(-1), torch.full((40,), 2.5))
    assert torch.allclose(weights, scores.gather(1, chosen) / scores.gather(1, chosen).sum(-1, keepdim=True) * 2.5)


def test_the_balancing_loss_is_one_when_balanced_and_sequence_wise_splits_by_sequence():
    probs = torch.full((8, 4), 0.25)
    chosen = torch.tensor([[0, 1], [2, 3]] * 4)
    assert balance_loss(probs, chosen, 4, 2, "global").item() == pytest.approx(1.0)
    probs = torch.rand(12, 4).softmax(-1)
    chosen = torch.randint(0, 4, (12, 2))
    whole = balance_loss(probs, chosen, 4, 3, "sequence")
    parts = [balance_loss(probs[4 * i:4 * i + 4], chosen[4 * i:4 * i + 4], 4, 1, "sequence") for i in range(3)]
    assert whole.item() == pytest.approx(sum(p.item() for p in parts) / 3)
    assert balance_loss(probs, chosen, 4, 3, "none").item() == 0


def test_the_correction_bias_moves_toward_the_underloaded_experts():
    layer = MoE(16, CONFIGS["deepseek"])
    init_moe(layer, 0.5, 0.1)
    layer.train()
    layer(torch.randn(2, 32, 16))
    seen = layer.tokens_seen.clone()
    update_corrections(layer, 1e-3)
    expected = 1e-3 * torch.sign(seen.mean() - seen)
    assert torch.equal(layer.router.correction, expected) and not layer.tokens_seen.any()
    layer.eval()
    layer(torch.randn(2, 32, 16))  # evaluation routes without counting
    assert not layer.tokens_seen.any()


@pytest.mark.parametrize(("seq", "window"), [(256, 32), (250, 32), (100, 7), (40, 128)])
def test_a_sliding_window_sees_its_window_and_nothing_else(seq, window):
    q, k, v = (torch.randn(2, 3, seq, 8) for _ in range(3))
    i = torch.arange(seq)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= window)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert torch.allclose(_local_attention(q, k, v, window, None), want, atol=1e-5)


def test_attention_sinks_take_weight_and_give_nothing():
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0])
    got = _attend_with_sinks(q, k, v, 0, sinks, None)
    scores = (q @ k.transpose(-1, -2)) / 2
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    weights = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sinks.exp().view(1, 2, 1, 1))
    assert torch.allclose(got, weights @ v, atol=1e-6)


def test_yarn_keeps_fast_rotations_and_slows_the_slow_ones():
    freqs, table_scale = yarn_frequencies(DEEPSEEK_V3)
    plain = 1.0 / (10_000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    assert torch.allclose(freqs[:5].double(), plain[:5], rtol=1e-6)  # wavelengths far below 4,096
    assert torch.allclose(freqs[-3:].double(), plain[-3:] / 40, rtol=1e-6)  # far above it
    assert table_scale == 1.0  # mscale / mscale_all_dim; the softmax scale takes m(1)^2 = 1.8739
    model_scale = DEEPSEEK_V3
    with torch.device("meta"):
        attention = MoETransformer(dataclasses.replace(model_scale, layers=1, dense_layers=1, mtp_layers=0), 8)
    assert attention.blocks[0].attention.scale == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    _, card_scale = yarn_frequencies(GPT_OSS_20B_CARD)
    assert card_scale == pytest.approx(0.1 * math.log(32) + 1)  # Hugging Face's attention_factor


def test_the_recipes_follow_the_references():
    assert {r.global_batch_size: (r.base_lr, r.warmup_steps, r.grad_accum_steps) for r in FULL_RECIPES.values()} == {
        16: (4e-4, 128, 1), 32: (8e-4, 128, 2), 64: (1e-3, 192, 4)}
    assert all(r.end_lr == pytest.approx(r.base_lr / 10) and r.ep == 8 for r in FULL_RECIPES.values())
    assert [r.base_lr for r in DEEPSEEK_RECIPES.values()] == [2.3238e-05, 2.4e-05, 2.5456e-05]
    assert all(r.end_lr == pytest.approx(1e-8) and r.eval_every_samples == r.global_batch_size
               for r in DEEPSEEK_RECIPES.values())
    assert MINI.seq_len == 8_192  # gpt_oss_20b's open rules check it
    with pytest.raises(TrainperfError, match="ep=3: must divide model.experts=8"):
        MINI.with_overrides(["ep=3"])
    with pytest.raises(TrainperfError, match="tensor parallelism of the MoE models is not built"):
        MINI.with_overrides(["tp=2"])


def test_the_deepseek_logs_its_balancing_coefficient_and_gpt_oss_its_expert_parallelism():
    ctx = RuntimeContext(device=torch.device("meta"), world_size=8)
    deepseek = DeepSeekV3Workload().mlperf_hyperparameters(DEEPSEEK_RECIPES["gbs16384"], ctx)
    assert deepseek["moe_aux_loss_coeff"] == 0.01 and deepseek["opt_adamw_epsilon"] == 1e-8
    gpt = GptOssWorkload().mlperf_hyperparameters(FULL_RECIPES["gbs16"], ctx)
    assert "moe_aux_loss_coeff" not in gpt and gpt["expert_parallelism"] == 8


def test_expert_parallelism_needs_launched_processes_that_it_divides():
    engine = FSDPEngine()
    with pytest.raises(TrainperfError, match="needs launched processes"):
        engine.check(FullyShard(ep=2), MINI, RuntimeContext(device=torch.device("cpu")))
    with pytest.raises(TrainperfError, match="the 3 processes are not a multiple of it"):
        engine.check(FullyShard(ep=2), MINI, RuntimeContext(device=torch.device("cpu"), world_size=3))
    with pytest.raises(TrainperfError, match="not built"):
        FullyShard(ep=2, tp=2)
    # The all-to-all's split sizes come from the host each step: CUDA graphs only without expert parallelism.
    graphed = MINI.with_overrides(["cuda_graphs=true"])
    with pytest.raises(TrainperfError, match="cuda_graphs with expert parallelism ep=2: .* use ep=1"):
        engine.check(FullyShard(ep=2), graphed, RuntimeContext(device=torch.device("cpu"), world_size=2))
    engine.check(FullyShard(ep=1), graphed, RuntimeContext(device=torch.device("cpu"), world_size=2))


# -- expert parallelism on two processes ------------------------------------------------------------------
TINY = ["model.layers=2", "model.dim=32", "model.heads=4", "model.kv_heads=2", "model.head_dim=8", "model.window=4",
        "model.experts=4", "model.top_k=2", "model.expert_dim=16", "model.vocab_size=48", "seq_len=16",
        "global_batch_size=4", "eval_batch_size=4", "max_grad_norm=1.0", "base_lr=3e-3", "warmup_steps=2"]
# DeepSeek's routing and losses at that size: sigmoid scores in groups, a shared expert, the sequence-wise
# balancing loss, correction-bias updates from all processes' tokens, multi-token prediction.
DEEPSEEK_LIKE = ["model.scoring=sigmoid", "model.groups=2", "model.topk_groups=1", "model.shared_experts=1",
                 "model.routed_scale=2.5", "model.balance=sequence", "model.aux_loss_coeff=0.01",
                 "model.bias_update_rate=0.001", "model.mtp_layers=1", "model.dense_layers=1", "model.ffn_dim=64"]


def _losses(ep: int, extra: list[str], steps: int = 20) -> list[float]:
    """20 AdamW steps of a tiny MoE on one global batch of 4 sequences: with ep=2 each process trains on its 2
    rows with half the experts; the global mean loss of each step."""
    ctx = distributed.init_from_env("cpu") if ep > 1 else RuntimeContext(device=torch.device("cpu"))
    try:
        workload = GptOssWorkload()
        recipe = MINI.with_overrides([*TINY, *extra, f"ep={ep}"])
        torch.manual_seed(0)
        parts = workload.build(recipe, ctx, {})
        parts = FSDPEngine().apply(FullyShard(ep=ep), parts, recipe, ctx)
        step = TrainStep(parts, 100, recipe, ctx.device, ctx=ctx)
        batch = torch.randint(0, 48, (4, 17), generator=torch.Generator().manual_seed(7))
        if ep > 1:
            per = 4 // ctx.world_size
            batch = batch[per * ctx.rank:per * (ctx.rank + 1)]
        return mean_step_losses(step, batch, steps, ctx)
    finally:
        if ep > 1:
            distributed.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [pytest.param([], marks=pytest.mark.multiprocess, id="gpt_oss"),
                                   pytest.param(DEEPSEEK_LIKE, marks=pytest.mark.second_tier, id="deepseek_like")])
def test_expert_parallel_processes_train_as_one(extra):
    alone = _losses(1, extra)
    both = launch(_losses, 2, extra)
    assert alone[-1] < alone[0] - 0.3  # it learns
    for rank in (0, 1):
        # float32 sums in another order (the experts' rows regrouped, reduce-scatters): 20 steps within 1e-4.
        assert both[rank] == pytest.approx(alone, rel=1e-4, abs=1e-4), (rank, both[rank], alone)


@pytest.mark.second_tier
def test_experts_sharded_over_their_own_group_train_as_one():
    # Four processes, ep=2: each expert held by two processes (its FSDP group, "dp_mod_ep", of 2), each process
    # one row. On gloo the experts' gradients are summed then scaled (it has no pre-multiplied sum).
    alone = _losses(1, [], steps=10)
    for rank, losses in launch(_losses, 2, [], 10, nproc=4).items():
        assert losses == pytest.approx(alone, rel=1e-4, abs=1e-4), (rank, losses, alone)


# -- the memory plan's activation count -------------------------------------------------------------------
SEQ = 128


def _saved_per_block(config) -> int:
    """Bytes autograd keeps for one block's backward under bf16 autocast, the tensors that grow with the
    sequence (not the weights' bf16 casts, which FSDP's bf16 parameters do not need; not a score matrix of
    sequence x sequence, which CPU kernels keep where the GPU's fused attention keeps none)."""
    torch.manual_seed(0)
    model = MoETransformer(config, SEQ)
    model.reset_parameters()
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, tuple[int, tuple[int, ...]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.blocks[-1](torch.randn(1, SEQ, config.dim), model.rope_cos[:SEQ], model.rope_sin[:SEQ])
    tokens = {SEQ, SEQ * config.top_k}
    return sum(size for ptr, (size, shape) in seen.items()
               if ptr not in own and tokens & set(shape) and list(shape).count(SEQ) < 2)


@pytest.mark.parametrize("kind", ["grouped", "latent"])
def test_a_blocks_activation_count_is_near_what_autograd_keeps(kind):
    config = dataclasses.replace(MINI.model, dim=192, heads=6, kv_heads=2, head_dim=32, window=0, expert_dim=160,
                                 vocab_size=1000)
    if kind == "latent":
        config = dataclasses.replace(config, attention="latent", heads=4, q_rank=96, kv_rank=64, nope_dim=32,
                                     rope_dim=16, v_dim=32, qk_norm=False, shared_experts=1, scoring="sigmoid",
                                     groups=4, topk_groups=2, balance="sequence")
    counted = []
    for layers in (1, 2):
        with torch.device("meta"):
            counted.append(MoETransformer(dataclasses.replace(config, layers=layers), SEQ).activation_bytes(
                SEQ, 1, "none"))
    assert counted[1] - counted[0] == pytest.approx(_saved_per_block(config), rel=0.15)


def _evaluations(out) -> list[tuple[int, float]]:
    from tests.conftest import read_log

    return [(r["metadata"]["samples_count"], r["value"]) for r in read_log(out / "mlperf_log.txt")
            if r["key"] == "eval_accuracy"]


@pytest.mark.second_tier
def test_an_expert_parallel_mini_run_equals_one_process_with_a_log_that_passes(tmp_path):
    # The mini's first 32 samples (16 steps, two evaluations) in one process and in two with ep=2: each process
    # one of the batch's two sequences and half of each block's experts. The whole run to the target, in one
    # and two processes, rests on the calibration (docs/workloads/gpt_oss_20b.md): minutes a run on 2 cores.
    import json

    from trainperf.cli import main
    from trainperf.results.compliance import check

    budget = ["--set", "max_samples=32", "--seed", "0", "--quiet"]
    assert main(["run", "gpt_oss_20b", "--out", str(tmp_path / "one"), *budget]) == 1  # the budget ends it
    assert main(["run", "gpt_oss_20b", "--nproc", "2", "--set", "ep=2", "--out", str(tmp_path / "ep"), *budget]) == 1
    result = json.loads((tmp_path / "ep" / "result.json").read_text())
    assert result["environment"]["world_size"] == 2
    assert result["layout"]["mesh"] == {"dp": 2, "ep": 2, "dp_mod_ep": 1}
    alone, both = _evaluations(tmp_path / "one"), _evaluations(tmp_path / "ep")
    assert [s for s, _ in both] == [s for s, _ in alone] == [16, 32]
    assert [q for _, q in both] == pytest.approx([q for _, q in alone], rel=2e-3)
    # Below the open rules' 3.34 at its second evaluation: the log of a run stopped by its budget passes them.
    verdict = check(tmp_path / "ep" / "mlperf_log.txt", None)  # the workload's ruleset (6.1.0)
    assert verdict.valid and verdict.division == "open", verdict.output
