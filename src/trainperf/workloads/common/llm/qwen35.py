"""Qwen3.5's mixture-of-experts decoder (the text model of Qwen3.5-397B-A17B, the policy of MLPerf
Training v6.1's `qwen35_397b_grpo`): the Qwen3-Next hybrid.

Every fourth layer is gated full attention, the other three Gated DeltaNet (linear attention with the
gated delta rule); every layer's feed-forward is a mixture of experts with one gated shared expert.

- **Gated DeltaNet**: q, k, v from one projection through a depthwise causal convolution (kernel 4) and
  SiLU; q and k L2-normalised, q scaled by 1/sqrt(d_k); per value head a decay g = -exp(A_log) x
  softplus(a + dt_bias) and a write strength beta = sigmoid(b); the state S [d_k, d_v] of each head
  decays by exp(g), is corrected toward v along k (the delta rule: S += k (beta (v - S^T k))^T) and read
  by q; the output RMS-normalised per head and gated by SiLU(z), then projected. Key heads are shared by
  `linear_v_heads // linear_k_heads` value heads. Computed by chunks (`chunked_delta_rule`: the
  recurrence solved exactly inside each chunk with a triangular solve, the WY form GPU kernels use);
  `recurrent_delta_rule` is the token-by-token definition it is tested against.
- **Gated attention**: grouped-query attention whose query projection also yields a per-channel output
  gate (sigmoid); q and k RMS-normalised per head; rotary embeddings on the first quarter of each head's
  channels (rotate-half layout), base 10^7.
- **Norms** are zero-centred RMSNorm (the weight stored as w, applied as 1 + w).
- **MoE**: 512 experts of hidden 1024, top 10 (softmax over the chosen logits: the same as the reference's
  softmax over all experts renormalised over the chosen), one shared expert of hidden 1024 gated by
  sigmoid(x . w); the reference freezes the router and uses no balancing loss in GRPO.

The shapes are Qwen3.5-397B-A17B's as the reference trains it (mlcommons/training `llm_post_training`
README "Model details"; THUDM/slime `scripts/models/qwen3.5-397B-A17B.sh` for the MoE and rotary
settings); `transformers`' `Qwen3_5MoeForCausalLM` is the implementation the tests hold this one to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.workloads.common.llm.model import KVCache, LayerCache
from trainperf.workloads.common.llm.moe import MoE, MoEConfig, init_moe


@dataclass(frozen=True)
class Qwen35Config:
    layers: int = 60
    dim: int = 4096
    vocab_size: int = 248_320
    heads: int = 32
    kv_heads: int = 2
    head_dim: int = 256
    rotary_fraction: float = 0.25
    rope_theta: float = 10_000_000.0
    linear_k_heads: int = 16
    linear_v_heads: int = 64
    linear_k_dim: int = 128
    linear_v_dim: int = 128
    conv_kernel: int = 4
    full_attention_every: int = 4
    moe: MoEConfig = field(default_factory=lambda: MoEConfig(
        experts=512, top_k=10, hidden=1024, shared=1, shared_gate=True, scoring="softmax_topk", balance="none"))
    norm_eps: float = 1e-6
    init_std: float = 0.02
    chunk: int = 64

    def full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_every == 0

    def parameters(self) -> int:
        """Parameters of the text model (embeddings and output layer included)."""
        d = self.dim
        attention = d * self.heads * self.head_dim * 2 + 2 * d * self.kv_heads * self.head_dim + (
            self.heads * self.head_dim * d) + 2 * self.head_dim
        key, value = self.linear_k_heads * self.linear_k_dim, self.linear_v_heads * self.linear_v_dim
        conv = 2 * key + value
        linear = d * conv + d * value + 2 * d * self.linear_v_heads + conv * self.conv_kernel + (
            2 * self.linear_v_heads) + self.linear_v_dim + value * d
        full = sum(self.full_attention(i) for i in range(self.layers))
        mixers = full * attention + (self.layers - full) * linear
        return mixers + self.layers * (self.moe.parameters(d) + 2 * d) + 2 * self.vocab_size * d + d


@dataclass
class DeltaCache:
    """A DeltaNet layer's decoding state: the convolution's last kernel - 1 inputs [B, C, kernel - 1] and
    the recurrent state [B, H, dk, dv] (fp32); `owner` holds the valid tokens and the filled length."""

    owner: KVCache
    conv: torch.Tensor
    state: torch.Tensor


class ZeroCentredRMSNorm(nn.Module):
    """RMSNorm whose scale is stored as its offset from 1 (initialised to 0), computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """The DeltaNet output's per-head RMSNorm followed by a SiLU gate."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (y * F.silu(gate.float())).to(x.dtype)


def recurrent_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
                         ) -> torch.Tensor:
    """The gated delta rule token by token. q, k [B, H, T, dk] (normalised, q scaled), v [B, H, T, dv],
    g (log decay) and beta [B, H, T]; fp32 -> output [B, H, T, dv]."""
    return recurrent_delta_rule_state(q, k, v, g, beta)[0]


def recurrent_delta_rule_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """`recurrent_delta_rule` from an entering state [B, H, dk, dv] (zeros if None), with the leaving one:
    a decoding step continues the prompt's state one token at a time."""
    batch, heads, seq, dk = k.shape
    if state is None:
        state = q.new_zeros(batch, heads, dk, v.shape[-1])
    out = torch.empty_like(v)
    for t in range(seq):
        state = state * g[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, :, t])
    return out, state


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       chunk: int = 64) -> torch.Tensor:
    """`recurrent_delta_rule` by chunks of `chunk` tokens. Inside a chunk, with G_i the cumulative log
    decay and S the entering state, the writes d = (I + A)^-1 (beta v - beta e^G k S), A_ij =
    beta_i (k_i . k_j) e^(G_i - G_j) for j < i; the outputs e^G q S + tril(q k^T e^(G_i - G_j)) d; the
    leaving state e^(G_C) S + (k e^(G_C - G))^T d."""
    return chunked_delta_rule_state(q, k, v, g, beta, chunk)[0]


def chunked_delta_rule_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, chunk: int = 64, state: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunked_delta_rule` from an entering state (zeros if None), with the leaving one. Padding the last
    chunk is exact: a padded token has beta 0 (no write) and g 0 (no decay)."""
    batch, heads, seq, dk = k.shape
    dv = v.shape[-1]
    pad = (-seq) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (seq + pad) // chunk
    q, k, v = (t.reshape(batch, heads, n, chunk, -1) for t in (q, k, v))
    g, beta = g.reshape(batch, heads, n, chunk), beta.reshape(batch, heads, n, chunk)
    cum = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = lower.clone().fill_diagonal_(False)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    a = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    solve = torch.linalg.solve_triangular(eye + a, torch.cat(
        (beta[..., None] * v, beta[..., None] * cum.exp()[..., None] * k), dim=-1), upper=False, unitriangular=True)
    u, w = solve[..., :dv], solve[..., dv:]
    scores = (q @ k.transpose(-1, -2)) * decay
    if state is None:
        state = q.new_zeros(batch, heads, dk, dv)
    outs = []
    for c in range(n):
        writes = u[:, :, c] - w[:, :, c] @ state
        outs.append((q[:, :, c] * cum[:, :, c, :, None].exp()) @ state + scores[:, :, c] @ writes)
        last = cum[:, :, c, -1]
        state = state * last.exp()[..., None, None] + (
            k[:, :, c] * (last[..., None] - cum[:, :, c]).exp()[..., None]).transpose(-1, -2) @ writes
    out = torch.stack(outs, dim=2).reshape(batch, heads, n * chunk, dv)
    return out[:, :, :seq], state


class GatedDeltaNet(nn.Module):
    def __init__(self, config: Qwen35Config) -> None:
        super().__init__()
        self.config = config
        key, value = config.linear_k_heads * config.linear_k_dim, config.linear_v_heads * config.linear_v_dim
        self.key_dim, self.value_dim = key, value
        self.in_proj_qkv = nn.Linear(config.dim, 2 * key + value, bias=False)
        self.in_proj_z = nn.Linear(config.dim, value, bias=False)
        self.in_proj_b = nn.Linear(config.dim, config.linear_v_heads, bias=False)
        self.in_proj_a = nn.Linear(config.dim, config.linear_v_heads, bias=False)
        self.conv1d = nn.Conv1d(2 * key + value, 2 * key + value, config.conv_kernel, groups=2 * key + value,
                                padding=config.conv_kernel - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(config.linear_v_heads))
        self.A_log = nn.Parameter(torch.zeros(config.linear_v_heads))
        self.norm = GatedRMSNorm(config.linear_v_dim, config.norm_eps)
        self.out_proj = nn.Linear(value, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cache: DeltaCache | None = None) -> torch.Tensor:
        c = self.config
        batch, seq, _ = x.shape
        projected = self.in_proj_qkv(x).transpose(1, 2)
        beta = torch.sigmoid(self.in_proj_b(x)).float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        if cache is None:
            mixed = F.silu(self.conv1d(projected)[..., :seq]).transpose(1, 2)
        else:
            # A left-padding token is no token: nothing into the convolution's window, no write, no decay,
            # so a padded row's state is its unpadded prompt's exactly.
            real = cache.owner.valid[:, cache.owner.filled:cache.owner.filled + seq]
            projected = torch.where(real[:, None, :], projected, 0.0)
            beta, g = torch.where(real[..., None], beta, 0.0), torch.where(real[..., None], g, 0.0)
            window = torch.cat((cache.conv, projected), dim=-1)
            cache.conv = window[..., window.shape[-1] - (c.conv_kernel - 1):]
            mixed = F.silu(F.conv1d(window, self.conv1d.weight, groups=window.shape[1])).transpose(1, 2)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(batch, seq, c.linear_k_heads, c.linear_k_dim)
        k = k.reshape(batch, seq, c.linear_k_heads, c.linear_k_dim)
        v = v.reshape(batch, seq, c.linear_v_heads, c.linear_v_dim)
        repeat = c.linear_v_heads // c.linear_k_heads
        if repeat > 1:
            q, k = q.repeat_interleave(repeat, dim=2), k.repeat_interleave(repeat, dim=2)
        q, k = (t.float() * torch.rsqrt(t.float().pow(2).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
        q = q / math.sqrt(c.linear_k_dim)
        args = (q.transpose(1, 2), k.transpose(1, 2), v.float().transpose(1, 2), g.transpose(1, 2),
                beta.transpose(1, 2))
        if cache is None:
            out = chunked_delta_rule(*args, c.chunk)
        elif seq == 1:
            out, cache.state = recurrent_delta_rule_state(*args, state=cache.state)
        else:
            out, cache.state = chunked_delta_rule_state(*args, c.chunk, state=cache.state)
        out = out.transpose(1, 2).to(x.dtype)
        z = self.in_proj_z(x).reshape(batch, seq, c.linear_v_heads, c.linear_v_dim)
        return self.out_proj(self.norm(out, z).reshape(batch, seq, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, config: Qwen35Config) -> None:
        super().__init__()
        self.config = config
        d, hd = config.dim, config.head_dim
        self.q_proj = nn.Linear(d, config.heads * hd * 2, bias=False)
        self.k_proj = nn.Linear(d, config.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.heads * hd, d, bias=False)
        self.q_norm = ZeroCentredRMSNorm(hd, config.norm_eps)
        self.k_norm = ZeroCentredRMSNorm(hd, config.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
                ) -> torch.Tensor:
        c = self.config
        batch, seq, _ = x.shape
        q, gate = self.q_proj(x).view(batch, seq, -1, 2 * c.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, seq, -1, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, -1, c.head_dim).transpose(1, 2)
        rot = cos.shape[-1]
        q = torch.cat((q[..., :rot] * cos + _rotate_half(q[..., :rot]) * sin, q[..., rot:]), dim=-1)
        k = torch.cat((k[..., :rot] * cos + _rotate_half(k[..., :rot]) * sin, k[..., rot:]), dim=-1)
        mask = None
        if cache is not None:
            k, v, mask = cache.extend(k.transpose(1, 2), v.transpose(1, 2))
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        repeat = q.shape[1] // k.shape[1]
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(batch, seq, -1)))


class Qwen35Block(nn.Module):
    def __init__(self, config: Qwen35Config, layer: int) -> None:
        super().__init__()
        self.full = config.full_attention(layer)
        self.input_norm = ZeroCentredRMSNorm(config.dim, config.norm_eps)
        self.mixer: nn.Module = GatedAttention(config) if self.full else GatedDeltaNet(config)
        self.post_norm = ZeroCentredRMSNorm(config.dim, config.norm_eps)
        self.moe = MoE(config.dim, config.moe)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | DeltaCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.input_norm(x)
        x = x + (self.mixer(h, cos, sin, cache=cache) if self.full else self.mixer(h, cache=cache))
        out, aux = self.moe(self.post_norm(x))
        return x + out, aux


class Qwen35(nn.Module):
    """The text model: token ids [B, T] -> logits [B, T, vocab] (untied embeddings)."""

    def __init__(self, config: Qwen35Config, max_seq_len: int) -> None:
        super().__init__()
        self.config, self.max_seq_len = config, max_seq_len
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(Qwen35Block(config, i) for i in range(config.layers))
        self.norm = ZeroCentredRMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = self.rotary_tables(max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rotary_tables(self, seq_len: int, device: torch.device | str | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        rot = int(self.config.head_dim * self.config.rotary_fraction)
        freqs = 1.0 / (self.config.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float, device=device) / rot))
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float, device=device), freqs)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) matrices, output projections scaled by sqrt(2 x layers), norms at their
        identity, DeltaNet decays as the reference initialises them (A uniform in [1, 16], dt_bias 1)."""
        std = self.config.init_std
        residual = std / math.sqrt(2 * self.config.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=residual if name.endswith(("o_proj", "out_proj")) else std)
            elif isinstance(module, nn.Conv1d):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, ZeroCentredRMSNorm):
                nn.init.zeros_(module.weight)
            elif isinstance(module, GatedRMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, GatedDeltaNet):
                module.A_log.copy_(torch.empty_like(module.A_log).uniform_(1, 16).log())
                nn.init.ones_(module.dt_bias)
            elif isinstance(module, MoE):
                init_moe(module, std, residual)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_with_aux(tokens)[0]

    def new_cache(self, batch: int, length: int) -> KVCache:
        """An empty cache for `batch` sequences of up to `length` tokens: keys and values for the attention
        layers, the convolution window and the recurrent state for the DeltaNet ones."""
        c, weight = self.config, self.tok_embeddings.weight
        cache = KVCache(None, batch, length, weight.dtype, weight.device)
        for block in self.blocks:
            mixer = block.mixer
            if block.full:
                kv_heads = mixer.k_proj.weight.shape[0] // c.head_dim
                cache.layers.append(LayerCache(cache, batch, kv_heads, length, c.head_dim, weight.dtype, weight.device))
            else:
                channels = mixer.conv1d.weight.shape[0]
                cache.layers.append(DeltaCache(
                    cache, weight.new_zeros(batch, channels, c.conv_kernel - 1),
                    torch.zeros(batch, c.linear_v_heads, c.linear_k_dim, c.linear_v_dim, device=weight.device)))
        return cache

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits of `tokens` [B, S] continuing the sequences `cache` holds (a prompt's prefill, then one
        token a step), the cache extended with them. Rotary positions are the cache's slots (a row
        left-padded by n is shifted by n, which rotary embeddings, depending only on distances, do not see);
        the DeltaNet layers skip padding (see GatedDeltaNet)."""
        start, seq = cache.filled, tokens.shape[1]
        cos, sin = self.rope_cos[start:start + seq], self.rope_sin[start:start + seq]
        x = self.tok_embeddings(tokens)
        for block, layer in zip(self.blocks, cache.layers, strict=True):
            x, _ = block(x, cos, sin, cache=layer)
        cache.advance(seq)
        return self.output(self.norm(x))

    def forward_with_aux(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        aux = x.new_zeros((), dtype=torch.float32)
        for block in self.blocks:
            x, a = block(x, cos, sin)
            aux = aux + a
        return self.output(self.norm(x)), aux


QWEN35_397B = Qwen35Config()
