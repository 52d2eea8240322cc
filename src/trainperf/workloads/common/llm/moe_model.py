"""The mixture-of-experts decoders of MLPerf's MoE pretraining benchmarks, one model for both: pre-norm blocks
of attention and an MoE feed-forward (workloads/common/llm/moe.py), RMSNorm, rotary embeddings and untied
embeddings, as the Llama family's (whose rotary tables, dense feed-forward and loss it reuses).

- GPT-OSS-20B as MLPerf's reference trains it (mlcommons/training `small_llm_moe_pretraining/primus`: a
  Megatron GPT-MoE of GPT-OSS's sizes): 24 blocks of width 2,880, grouped-query attention (64 heads of 64,
  8 key/value heads) with RMS-normalised queries and keys, a sliding window of 128 in every other block
  (the first, third, ...), 32 experts of 2,880 with top-4 routing, plain SwiGLU, no biases, the Llama 3.1
  tokenizer's vocabulary. OpenAI's published model (`GPT_OSS_20B_CARD`) differs: attention sinks, biases
  in attention, router and experts, a clamped SwiGLU, YaRN, the o200k vocabulary; the same code builds it.
- DeepSeek-V3 671B (`attention="latent"`): multi-head latent attention (queries and keys/values through
  low-rank compressions, a shared rotary key), its first 3 blocks dense, then 256 routed experts and 1 shared,
  top-8 from the best 4 of 8 groups, sigmoid scores.

Sliding windows attend block by block (each block of queries over its keys and the block before: linear in
the sequence); attention sinks (an extra logit per head that only adds to the softmax's denominator) are
computed from the whole score matrix, as OpenAI's reference code does, so they are for the card's model,
not for MLPerf's (which has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract.sharded import ShardedModel
from trainperf.workloads.common.llm.model import FeedForward, LlamaConfig, apply_rotary, rotary_tables
from trainperf.workloads.common.llm.moe import MoE, MoEConfig, init_moe

ATTENTIONS = ("grouped", "latent")


@dataclass(frozen=True)
class MoEModelConfig:
    layers: int = 24
    dim: int = 2_880
    vocab_size: int = 128_256
    norm_eps: float = 1e-6
    init_std: float = 0.008
    # Attention: "grouped" (grouped-query, GPT-OSS) or "latent" (DeepSeek's multi-head latent attention).
    attention: str = "grouped"
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    qk_norm: bool = True
    attention_bias: bool = False
    sinks: bool = False
    # A sliding window of `window` keys before each query (and itself: Megatron's window (128, 0)) in every
    # `window_every`-th block from the first; 0: every block attends to the whole causal prefix.
    window: int = 0
    window_every: int = 2
    # Latent attention's ranks and head sizes (DeepSeek-V3): queries through a rank q_rank compression (0:
    # none), keys and values through kv_rank, each head's query/key a non-rotary and a rotary part.
    q_rank: int = 0
    kv_rank: int = 512
    nope_dim: int = 128
    rope_dim: int = 64
    v_dim: int = 128
    rope_theta: float = 150_000.0
    # YaRN (0: none): the factor, the context the model was first trained at, the ramp's fast and slow
    # rotations, and the attention temperature as Hugging Face's configs give it: the rotary tables scaled by
    # m(mscale) / m(mscale_all_dim), latent attention's softmax scale by m(mscale_all_dim) squared, where
    # m(x) = 0.1 x ln(factor) + 1 (m(0) = 1).
    yarn_factor: float = 0.0
    yarn_original_context: int = 4_096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    # Whether the ramp's ends are rounded out to whole dimensions (floor, ceil), as DeepSeek-V3's YaRN does;
    # OpenAI's GPT-OSS config says "truncate": false, its ramp running between the exact dimensions.
    yarn_truncate: bool = True
    # Feed-forwards: the first `dense_layers` blocks dense (ffn_dim), the rest MoE.
    dense_layers: int = 0
    ffn_dim: int = 0
    experts: int = 32
    top_k: int = 4
    expert_dim: int = 2_880
    shared_experts: int = 0
    scoring: str = "softmax_topk"
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "swiglu"
    groups: int = 0
    topk_groups: int = 0
    routed_scale: float = 1.0
    balance: str = "none"
    # Rows each expert takes per process, as a multiple of its even share; 0: dropless (the references). See
    # common/llm/moe.py: a factor keeps expert parallelism free of host reads, so that its step can be graphed.
    capacity_factor: float = 0.0
    aux_loss_coeff: float = 0.0
    # The sigmoid router's auxiliary-loss-free balancing (DeepSeek-V3): after each step every expert's
    # correction bias moves by this rate toward the mean load (0: never).
    bias_update_rate: float = 0.0
    # DeepSeek-V3's multi-token prediction: `mtp_layers` extra blocks (0 or 1 built), each predicting one
    # token further from the last hidden state and the next token's embedding, their loss weighted by
    # mtp_loss_scale (evaluation reads the main head only).
    mtp_layers: int = 0
    mtp_loss_scale: float = 0.1

    @property
    def moe(self) -> MoEConfig:
        return MoEConfig(experts=self.experts, top_k=self.top_k, hidden=self.expert_dim, shared=self.shared_experts,
                         scoring=self.scoring, router_bias=self.router_bias, expert_bias=self.expert_bias,
                         activation=self.activation, groups=self.groups, topk_groups=self.topk_groups,
                         routed_scale=self.routed_scale, balance=self.balance,
                         capacity_factor=self.capacity_factor)

    @property
    def rotary_dim(self) -> int:
        return self.rope_dim if self.attention == "latent" else self.head_dim

    def attention_parameters(self) -> int:
        d = self.dim
        if self.attention == "latent":
            qk = self.nope_dim + self.rope_dim
            h = self.heads
            q = d * h * qk if not self.q_rank else d * self.q_rank + self.q_rank + self.q_rank * h * qk
            kv = d * (self.kv_rank + self.rope_dim) + self.kv_rank + self.kv_rank * h * (self.nope_dim + self.v_dim)
            return q + kv + self.heads * self.v_dim * d
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        weights = d * q * 2 + d * kv * 2
        bias = (q + 2 * kv + d) if self.attention_bias else 0
        return weights + bias + (2 * self.head_dim if self.qk_norm else 0) + (self.heads if self.sinks else 0)

    def main_parameters(self) -> int:
        """The model's parameters without the multi-token prediction module: embeddings, output layer,
        every block (the routers' correction biases are buffers, not counted)."""
        dense = self.dense_layers * 3 * self.dim * self.ffn_dim
        moe = (self.layers - self.dense_layers) * self.moe.parameters(self.dim)
        blocks = self.layers * (self.attention_parameters() + 2 * self.dim) + dense + moe
        return blocks + 2 * self.vocab_size * self.dim + self.dim

    def mtp_parameters(self) -> int:
        """One multi-token prediction module: two norms, the projection of both to the width, an MoE block
        and its final norm (embedding and output layer shared with the model)."""
        block = self.attention_parameters() + 2 * self.dim + self.moe.parameters(self.dim)
        return self.mtp_layers * (2 * self.dim + 2 * self.dim * self.dim + block + self.dim)

    def parameters(self) -> int:
        return self.main_parameters() + self.mtp_parameters()

    def active_parameters(self) -> int:
        """Parameters of the main model a token passes through, as GPT-OSS's model card and DeepSeek count
        them: the input embedding (a lookup) left out, the output layer in, k routed and the shared experts
        of each MoE block."""
        routed = (self.layers - self.dense_layers) * (
            self.moe.parameters(self.dim) - self.moe.active_parameters(self.dim))
        return self.main_parameters() - routed - self.vocab_size * self.dim

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token as torchtitan counts an MoE model's: 6 per active parameter (the output
        layer included) plus attention's 12 x layers x heads x head size x the keys each query sees (sliding
        windows counted at their width, as torchtitan and Megatron leave them: at full sequence)."""
        qk = self.nope_dim + self.rope_dim if self.attention == "latent" else self.head_dim
        v = self.v_dim if self.attention == "latent" else self.head_dim
        return 6.0 * self.active_parameters() + 6.0 * self.layers * self.heads * (qk + v) * seq_len


# GPT-OSS-20B as MLPerf trains it (see the module's docstring): 20,488,418,112 parameters, 3,397,530,432 active.
GPT_OSS_20B = MoEModelConfig(window=128)
# OpenAI's published GPT-OSS-20B (model card; Hugging Face config): 20,914,757,184 parameters, 3,608,304,384
# active.
# Its sliding window holds 128 keys with the query's own (Megatron's window counts the keys before it).
GPT_OSS_20B_CARD = MoEModelConfig(vocab_size=201_088, norm_eps=1e-5, qk_norm=False, attention_bias=True, sinks=True,
                                  window=127, router_bias=True, expert_bias=True, activation="gpt_oss_swiglu",
                                  yarn_factor=32.0, yarn_original_context=4_096, yarn_truncate=False, init_std=0.02)


def yarn_m(config: MoEModelConfig, mscale: float) -> float:
    return 0.1 * mscale * math.log(config.yarn_factor) + 1.0 if config.yarn_factor > 1 and mscale > 0 else 1.0


def yarn_frequencies(config: MoEModelConfig) -> tuple[torch.Tensor, float]:
    """Rotary inverse frequencies under YaRN (NTK-by-parts): rotations faster than beta_fast per original
    context kept, slower than beta_slow divided by the factor, a linear ramp between; and what the cos/sin
    tables are multiplied by, m(mscale) / m(mscale_all_dim)."""
    dim, base = config.rotary_dim, config.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if config.yarn_factor <= 1:
        return freqs.float(), 1.0

    def turn(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times in the context
        return dim * math.log(config.yarn_original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = turn(config.yarn_beta_fast), turn(config.yarn_beta_slow)
    if config.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    kept = 1 - ramp
    scaled = freqs / config.yarn_factor * (1 - kept) + freqs * kept
    return scaled.float(), yarn_m(config, config.yarn_mscale) / yarn_m(config, config.yarn_mscale_all_dim)


def rotary(config: MoEModelConfig, seq_len: int, device: torch.device | str | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    if config.yarn_factor > 1:
        freqs, scale = yarn_frequencies(config)
        angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs.to(device))
        return angles.cos() * scale, angles.sin() * scale
    plain = LlamaConfig(dim=config.rotary_dim, heads=1, rope_theta=config.rope_theta, rope_factor=0.0)
    return rotary_tables(plain, seq_len, device)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, sinks: torch.Tensor | None,
            scale: float | None = None) -> torch.Tensor:
    """Causal attention of q [B, H, T, D] over k, v (as many heads), within `window` keys before each query
    (0: all), with an attention sink per head where given."""
    if sinks is not None:
        return _attend_with_sinks(q, k, v, window, sinks, scale)
    if not window or window >= q.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return _local_attention(q, k, v, window, scale)


def _local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float | None
                     ) -> torch.Tensor:
    """Sliding-window attention in blocks of `window` queries, each over its own block and the one before
    (the keys it may see all lie there): T x 2 window scores instead of T x T, so a 128-key window at 8,192
    tokens costs a 64th of full attention, through scaled_dot_product_attention's masked kernels."""
    batch, heads, seq, dim = q.shape
    size = window
    blocks = -(-seq // size)
    pad = blocks * size - seq
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))

    def with_previous(t: torch.Tensor) -> torch.Tensor:
        t = t.view(batch, heads, blocks, size, t.shape[-1])
        before = torch.cat([torch.zeros_like(t[:, :, :1]), t[:, :, :-1]], dim=2)
        return torch.cat([before, t], dim=3)

    query = torch.arange(size, device=q.device)[:, None] + size
    key = torch.arange(2 * size, device=q.device)[None, :]
    allowed = (key <= query) & (query - key <= window)
    first = allowed & (key >= size)  # the first block has no block before it
    mask = torch.stack([first, *([allowed] * (blocks - 1))]) if blocks > 1 else first[None]
    out = F.scaled_dot_product_attention(q.view(batch, heads, blocks, size, dim), with_previous(k), with_previous(v),
                                         attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, blocks * size, -1)[:, :, :seq]


def _attend_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, sinks: torch.Tensor,
                       scale: float | None) -> torch.Tensor:
    """Attention whose softmax also counts one learned logit per head (a "sink" that takes weight but gives no
    value), from the whole score matrix, as OpenAI's reference code computes it: for the card's model."""
    seq = q.shape[2]
    i = torch.arange(seq, device=q.device)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed = allowed & (i[:, None] - i[None, :] <= window)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, seq, 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return (probs @ v.float()).to(v.dtype)


class GroupedAttention(nn.Module):
    def __init__(self, config: MoEModelConfig, window: int) -> None:
        super().__init__()
        self.head_dim, self.window = config.head_dim, window
        bias = config.attention_bias
        self.wq = nn.Linear(config.dim, config.heads * config.head_dim, bias=bias)
        self.wk = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=bias)
        self.wv = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=bias)
        self.wo = nn.Linear(config.heads * config.head_dim, config.dim, bias=bias)
        self.q_norm = nn.RMSNorm(config.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(config.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.sinks = nn.Parameter(torch.empty(config.heads)) if config.sinks else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            # In fp32, as the norms' weights (Megatron's normalise in fp32 too).
            q, k = self.q_norm(q.float()).type_as(q), self.k_norm(k.float()).type_as(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeat = q.shape[2] // k.shape[2]
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = _attend(q, k, v, self.window, self.sinks)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class LatentAttention(nn.Module):
    """DeepSeek's multi-head latent attention: queries from a q_rank compression of x (RMS-normalised),
    keys and values from a shared kv_rank compression plus one rotary key shared by all heads; each head's
    query and key a non-rotary part (nope_dim) and a rotary part (rope_dim), its value v_dim. Under YaRN
    the softmax scale is multiplied by m(mscale_all_dim) squared, as Hugging Face's and Megatron's
    DeepSeek-V3 do."""

    def __init__(self, config: MoEModelConfig) -> None:
        super().__init__()
        c = config
        self.heads, self.nope, self.rope, self.v_dim, self.kv_rank = c.heads, c.nope_dim, c.rope_dim, c.v_dim, c.kv_rank
        qk = c.nope_dim + c.rope_dim
        if c.q_rank:
            self.wq_a = nn.Linear(c.dim, c.q_rank, bias=False)
            self.q_norm = nn.RMSNorm(c.q_rank, eps=c.norm_eps)
            self.wq_b = nn.Linear(c.q_rank, c.heads * qk, bias=False)
            self.wq = None
        else:
            self.wq = nn.Linear(c.dim, c.heads * qk, bias=False)
            self.wq_a = self.q_norm = self.wq_b = None
        self.wkv_a = nn.Linear(c.dim, c.kv_rank + c.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(c.kv_rank, eps=c.norm_eps)
        self.wkv_b = nn.Linear(c.kv_rank, c.heads * (c.nope_dim + c.v_dim), bias=False)
        self.wo = nn.Linear(c.heads * c.v_dim, c.dim, bias=False)
        self.scale = qk ** -0.5 * yarn_m(config, config.yarn_mscale_all_dim) ** 2

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        if self.wq is not None:
            q = self.wq(x)
        else:
            assert self.wq_a is not None and self.q_norm is not None and self.wq_b is not None
            q = self.wq_b(self.q_norm(self.wq_a(x).float()))
        q = q.view(batch, seq, self.heads, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        kv, k_rope = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv.float())).view(batch, seq, self.heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        q_rope = apply_rotary(q_rope, cos, sin)
        k_rope = apply_rotary(k_rope.unsqueeze(2), cos, sin).expand(-1, -1, self.heads, -1)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rope], dim=-1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class MoEBlock(nn.Module):
    def __init__(self, config: MoEModelConfig, layer: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        if config.attention == "latent":
            self.attention: nn.Module = LatentAttention(config)
        else:
            sliding = config.window and layer % config.window_every == 0
            self.attention = GroupedAttention(config, config.window if sliding else 0)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        if layer < config.dense_layers:
            self.feed_forward: nn.Module = FeedForward(LlamaConfig(dim=config.dim, ffn_dim=config.ffn_dim))
        else:
            self.feed_forward = MoE(config.dim, config.moe)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out = self.feed_forward(self.ffn_norm(x))
        if isinstance(out, tuple):
            return x + out[0], out[1]
        return x + out, x.new_zeros((), dtype=torch.float32)


class MultiTokenPrediction(nn.Module):
    """DeepSeek-V3's prediction of the token after next: position i's last hidden state and the embedding of
    token i + 1, each RMS-normalised, concatenated and projected to the width, through one MoE block and a
    final norm; the model's output layer then predicts token i + 2."""

    def __init__(self, config: MoEModelConfig) -> None:
        super().__init__()
        self.hidden_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.embed_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.proj = nn.Linear(2 * config.dim, config.dim, bias=False)
        self.block = MoEBlock(config, config.layers)
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)

    def forward(self, hidden: torch.Tensor, next_embedded: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream in fp32, as the model's own (the embeddings'), whatever autocast makes of proj.
        x = self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(next_embedded)], dim=-1)).float()
        x, aux = self.block(x, cos, sin)
        return self.norm(x), aux


class MoETransformer(ShardedModel):
    """tokens [B, T] -> (logits [B, T, vocab], the blocks' balancing losses summed, and with multi-token
    prediction the logits of token i + 2 at positions 0 .. T - 2, else None)."""

    def __init__(self, config: MoEModelConfig, max_seq_len: int) -> None:
        super().__init__()
        self.config, self.max_seq_len = config, max_seq_len
        # Where init_weights takes the weights from (a checkpoint with `load_into(model)`); None: drawn.
        self.weights_source: Any = None
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(MoEBlock(config, i) for i in range(config.layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.mtp = MultiTokenPrediction(config) if config.mtp_layers else None
        cos, sin = rotary(config, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights, each block's output projections Normal(0, init_std / sqrt(2 x
        layers)) (Megatron's scaled init, the reference's), unit norms, zero biases and sinks."""
        std = self.config.init_std
        residual = std / math.sqrt(2 * self.config.layers)
        for module in self.modules():
            if isinstance(module, MoE):
                init_moe(module, std, residual)
        for name, param in self.named_parameters():
            if ".experts." in name or ".router." in name or ".shared." in name:
                continue
            if isinstance(param, nn.Parameter) and name.endswith(".sinks"):
                nn.init.zeros_(param)
            elif param.dim() == 1:
                nn.init.ones_(param) if "norm" in name else nn.init.zeros_(param)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(param, std=residual)
            else:
                nn.init.normal_(param, std=std)

    @torch.no_grad()
    def init_weights(self) -> None:
        """After a build on the meta device and `to_empty`: the rotary tables computed again where they live,
        the weights drawn as reset_parameters draws them, then read from the initial checkpoint if there is one
        (each process its shards' parts; the routing statistics' buffers zeroed by the draw)."""
        cos, sin = rotary(self.config, self.max_seq_len, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        self.reset_parameters()
        if self.weights_source is not None:
            self.weights_source.load_into(self)

    def shard_units(self) -> list[nn.Module]:
        """Sharded on its own by FSDP (runtime/fsdp.py): the multi-token prediction block, 11.6 B parameters
        in DeepSeek-V3, which the root's embeddings must not gather with them."""
        return [self.mtp] if self.mtp is not None else []

    def activation_bytes(self, seq_len: int, tp: int, checkpointing: str) -> int:
        """Bytes autograd keeps for the backward of one sequence under bf16 autocast, counted from what this
        module's operators save (tested against saved-tensor hooks within 15 %): per token of a block, each
        norm its fp32 input, output and scale; the projections their bf16 inputs; attention its bf16 q, k, v
        (keys and values repeated to every head) and fp32 log-sum-exp; an MoE block, per routed row (k per
        token), the row, the experts' gate, up, SiLU and product, and the weighted fp32 output, the router
        its logits and probabilities; a dense or shared feed-forward as the Llama's. The head's bf16 logits,
        fp32 log-softmax and gradient (12 bytes a vocabulary entry; twice with multi-token prediction). A
        checkpointed block keeps its fp32 input only; one is recomputed at a time. `tp` must be 1."""
        c = self.config
        norm = 8 * c.dim + 4
        if c.attention == "latent":
            qk = c.nope_dim + c.rope_dim
            q_in = 2 * c.dim + (norm - 8 * c.dim + 8 * c.q_rank + 2 * c.q_rank if c.q_rank else 0)
            attention = (q_in + 2 * c.dim + 8 * c.kv_rank + 4 + 2 * c.kv_rank + 4 * c.rope_dim
                         + 2 * c.heads * (2 * qk + 2 * c.v_dim) + 4 * c.heads)
        else:
            q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
            normed = (8 * (q + kv) + 8 * c.heads + 8 * c.kv_heads) if c.qk_norm else 0
            attention = 3 * 2 * c.dim + normed + 2 * 3 * q + 2 * q + 4 * c.heads
        moe_block = (c.top_k * (6 * c.dim + 8 * c.expert_dim + 24) + 2 * c.dim + 8 * c.experts + 12 * c.top_k
                     + (c.shared_experts * 10 * c.expert_dim + 4 * c.dim if c.shared_experts else 0))
        dense_block = 10 * c.ffn_dim + 4 * c.dim
        per_token = [2 * norm + attention + (dense_block if i < c.dense_layers else moe_block)
                     for i in range(c.layers)]
        blocks = [seq_len * b for b in per_token]
        kept = seq_len * 4 * c.dim
        checkpointed = {"none": 0, "selective": (c.layers + 1) // 2, "full": c.layers}[checkpointing]
        total = sum(blocks[checkpointed:]) + checkpointed * kept + (max(blocks) if checkpointed else 0)
        heads = 2 if c.mtp_layers else 1
        head = seq_len * heads * (10 * c.dim + 12 * c.vocab_size)
        if c.mtp_layers:
            head += seq_len * (2 * norm + 4 * c.dim + attention + moe_block)
        return (total + head) // tp

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        embedded = self.tok_embeddings(tokens)
        x = embedded
        aux = x.new_zeros((), dtype=torch.float32)
        for block in self.blocks:
            x, balance = block(x, cos, sin)
            aux = aux + balance
        logits = self.output(self.norm(x))
        if self.mtp is None or not self.training or seq < 2:
            return logits, aux, None
        hidden, balance = self.mtp(x[:, :-1], embedded[:, 1:], cos[:-1], sin[:-1])
        return logits, aux + balance, self.output(hidden)


def moe_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy, plus the multi-token prediction's (token i + 2) times its scale and
    the balancing losses times their coefficient."""
    logits, aux, further = model(batch[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    config = _inner(model).config
    if further is not None:
        loss = loss + config.mtp_loss_scale * F.cross_entropy(further.float().flatten(0, 1), batch[:, 2:].flatten())
    return loss + config.aux_loss_coeff * aux if config.aux_loss_coeff else loss


def moe_token_losses(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])[0]
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none").view(
        batch.shape[0], -1)


def _inner(model: nn.Module) -> Any:
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "_orig_mod", model)
