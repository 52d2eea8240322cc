"""FLUX.1's transformer (Black Forest Labs' architecture, as torchtitan's `flux` model and the MLPerf reference
train it): image-patch and text tokens embedded apart, `double` blocks that keep two streams (each with its
own modulation, projections and feed-forward) joined in one attention, then `single` blocks over the
concatenated sequence (attention and feed-forward in parallel from one fused projection); every block
modulated (adaLN: shift, scale, gate) by one vector of the timestep, the guidance strength and the pooled
text embedding; rotary embeddings over three position axes (text tokens at 0; image patches at (0, row,
column)); RMS-normalised queries and keys.

The repeated blocks are one `blocks` list (the double ones first), so that the FSDP engine shards,
checkpoints and compiles them one by one as it does a language model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract.sharded import ShardedModel
from trainperf.workloads.common.llm.model import apply_rotary

TIME_EMBED_DIM = 256  # the sinusoidal embedding of the timestep (and of the guidance), before its MLP
TIME_FACTOR = 1000.0  # timesteps in [0, 1] are scaled to [0, 1000] before the sinusoids
NORM_EPS = 1e-6


@dataclass(frozen=True)
class FluxConfig:
    """FluxParams, with the latent layout: `latent_channels` of the autoencoder packed into patches of
    `patch` x `patch` (in_channels = latent_channels x patch²)."""

    latent_channels: int = 16
    patch: int = 2
    vec_in_dim: int = 768  # CLIP's pooled text embedding
    context_in_dim: int = 4096  # T5's token embeddings
    hidden: int = 3072
    mlp_ratio: float = 4.0
    heads: int = 24
    depth: int = 19  # double-stream blocks
    depth_single: int = 38
    axes_dim: tuple[int, int, int] = (16, 56, 56)
    theta: float = 10_000.0
    qkv_bias: bool = True
    # Black Forest Labs' FLUX.1-dev takes the guidance strength as an input (its distillation); schnell, and
    # every torchtitan flavour the reference trains from, has none.
    guidance_embed: bool = False

    @property
    def in_channels(self) -> int:
        return self.latent_channels * self.patch**2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden * self.mlp_ratio)

    def check(self) -> str | None:
        """What is wrong with the shape (None: nothing)."""
        if self.hidden % self.heads:
            return f"heads {self.heads} must divide hidden {self.hidden}"
        if sum(self.axes_dim) != self.head_dim:
            return f"axes_dim {list(self.axes_dim)} must sum to the head dimension {self.head_dim}"
        if any(d % 2 for d in self.axes_dim):
            return f"axes_dim {list(self.axes_dim)}: each must be even (rotary pairs)"
        return None

    def parameters(self) -> int:
        """Parameters of the transformer, counted from the shapes (the test builds the model to check)."""
        h, m, c = self.hidden, self.mlp_hidden, self.in_channels
        qkv_bias = 3 * h if self.qkv_bias else 0

        def linear(i: int, o: int) -> int:
            return i * o + o

        def embedder(i: int) -> int:
            return linear(i, h) + linear(h, h)

        stream = (linear(h, 6 * h) + h * 3 * h + qkv_bias + 2 * self.head_dim + linear(h, h)
                  + linear(h, m) + linear(m, h))
        single = linear(h, 3 * h + m) + linear(h + m, h) + 2 * self.head_dim + linear(h, 3 * h)
        outside = (linear(c, h) + embedder(TIME_EMBED_DIM) + embedder(self.vec_in_dim)
                   + (embedder(TIME_EMBED_DIM) if self.guidance_embed else 0) + linear(self.context_in_dim, h)
                   + linear(h, 2 * h) + linear(h, c))
        return outside + self.depth * 2 * stream + self.depth_single * single

    def flops_per_sample(self, image_tokens: int, text_tokens: int) -> float:
        """Training FLOPs of one sample (forward and backward, 3 x the forward's): 6 per parameter a token
        passes through (the double blocks' image weights by the image tokens, their text weights by the text
        tokens, the single blocks' by both), plus attention's 12 x width x sequence per token and block
        (QK^T and AV over the joint sequence, no mask). Embeddings and the modulations' once-per-sample
        products are left out (under 0.1%)."""
        h, m = self.hidden, self.mlp_hidden
        stream = h * 3 * h + h * h + 2 * h * m
        single = h * (3 * h + m) + (h + m) * h
        tokens = image_tokens + text_tokens
        weights = self.depth * stream * tokens + self.depth_single * single * tokens
        weights += image_tokens * 2 * self.in_channels * h + text_tokens * self.context_in_dim * h
        attention = (self.depth + self.depth_single) * 2 * 2 * h * tokens * tokens
        return 3.0 * (2.0 * weights + attention)


FLUX1_SCHNELL = FluxConfig()  # the reference's: 11,891,178,560 parameters
FLUX1_DEV = FluxConfig(guidance_embed=True)  # Black Forest Labs' dev: 11,901,408,320


def timestep_embedding(t: torch.Tensor, dim: int = TIME_EMBED_DIM, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled by TIME_FACTOR): cosines then sines, fp32."""
    t = TIME_FACTOR * t.float()
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def position_ids(text_tokens: int, rows: int, cols: int, device: torch.device | None = None) -> torch.Tensor:
    """The three position coordinates of the joint sequence [text_tokens + rows x cols, 3]: text at (0, 0, 0),
    the image patch at row r, column c at (0, r, c), in row-major order."""
    r = torch.arange(rows, device=device).repeat_interleave(cols)
    c = torch.arange(cols, device=device).repeat(rows)
    image = torch.stack([torch.zeros_like(r), r, c], dim=-1)
    text = torch.zeros(text_tokens, 3, dtype=image.dtype, device=device)
    return torch.cat([text, image]).float()


def rotary_angles(ids: torch.Tensor, axes_dim: tuple[int, ...], theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [L, head_dim / 2] of each position's angles: each axis's coordinate rotates its own
    `axes_dim[i] / 2` consecutive pairs at frequencies theta^(-2j / axes_dim[i])."""
    angles = []
    for axis, dim in enumerate(axes_dim):
        omega = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=ids.device) / dim)
        angles.append(ids[:, axis, None].double() * omega[None])
    a = torch.cat(angles, dim=-1).float()
    return a.cos(), a.sin()


class MLPEmbedder(nn.Module):
    def __init__(self, dim_in: int, hidden: int) -> None:
        super().__init__()
        self.in_layer = nn.Linear(dim_in, hidden)
        self.out_layer = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


class Modulation(nn.Module):
    """adaLN: (shift, scale, gate) for one or two sub-layers from the conditioning vector."""

    def __init__(self, dim: int, double: bool) -> None:
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim)

    def forward(self, vec: torch.Tensor) -> list[torch.Tensor]:
        return list(self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1))


class QKNorm(nn.RMSNorm):
    """The query/key norm as the reference builds it: torch's RMSNorm with a learned scale and no eps given,
    i.e. the machine epsilon of the input's dtype (2^-7 for bf16 queries; Black Forest Labs' own norm adds 1e-6
    in fp32). The scale is cast to the input's dtype, as FSDP's bf16 weights are: under autocast without FSDP
    an fp32 scale would take torch's unfused path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


def qk_norm(dim: int) -> nn.RMSNorm:
    return QKNorm(dim)


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=NORM_EPS)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
              ) -> torch.Tensor:
    """Rotary-embedded, unmasked attention of q, k, v [B, L, H, D] -> [B, L, H x D]."""
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).flatten(2)


class Stream(nn.Module):
    """One stream of a double block: its modulation, attention projections, query/key norms and MLP."""

    def __init__(self, config: FluxConfig) -> None:
        super().__init__()
        h = config.hidden
        self.heads = config.heads
        self.mod = Modulation(h, double=True)
        self.qkv = nn.Linear(h, 3 * h, bias=config.qkv_bias)
        self.query_norm = qk_norm(config.head_dim)
        self.key_norm = qk_norm(config.head_dim)
        self.proj = nn.Linear(h, h)
        self.mlp_in = nn.Linear(h, config.mlp_hidden)
        self.mlp_out = nn.Linear(config.mlp_hidden, h)

    def qkv_of(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv((1 + scale) * _norm(x) + shift).unflatten(-1, (3, self.heads, -1)).unbind(2)
        return self.query_norm(q).to(v.dtype), self.key_norm(k).to(v.dtype), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor, mod: list[torch.Tensor]) -> torch.Tensor:
        _, _, gate1, shift2, scale2, gate2 = mod
        x = x + gate1 * self.proj(attn)
        mlp = self.mlp_out(F.gelu(self.mlp_in((1 + scale2) * _norm(x) + shift2), approximate="tanh"))
        return x + gate2 * mlp


class DoubleStreamBlock(nn.Module):
    def __init__(self, config: FluxConfig) -> None:
        super().__init__()
        self.img = Stream(config)
        self.txt = Stream(config)

    def forward(self, img: torch.Tensor, txt: torch.Tensor, vec: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        img_mod, txt_mod = self.img.mod(vec), self.txt.mod(vec)
        iq, ik, iv = self.img.qkv_of(img, img_mod[0], img_mod[1])
        tq, tk, tv = self.txt.qkv_of(txt, txt_mod[0], txt_mod[1])
        # Text first, as the position tables are laid out.
        joint = attention(torch.cat([tq, iq], 1), torch.cat([tk, ik], 1), torch.cat([tv, iv], 1), cos, sin)
        n = txt.shape[1]
        return self.img.finish(img, joint[:, n:], img_mod), self.txt.finish(txt, joint[:, :n], txt_mod)


class SingleStreamBlock(nn.Module):
    """Attention and MLP side by side over the joint sequence: one projection in (q, k, v and the MLP's
    input), one out (of the attention's output and the MLP's activation, concatenated)."""

    def __init__(self, config: FluxConfig) -> None:
        super().__init__()
        h = config.hidden
        self.heads, self.hidden = config.heads, h
        self.linear1 = nn.Linear(h, 3 * h + config.mlp_hidden)
        self.linear2 = nn.Linear(h + config.mlp_hidden, h)
        self.query_norm = qk_norm(config.head_dim)
        self.key_norm = qk_norm(config.head_dim)
        self.modulation = Modulation(h, double=False)

    def forward(self, x: torch.Tensor, vec: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.modulation(vec)
        qkv, mlp = self.linear1((1 + scale) * _norm(x) + shift).split([3 * self.hidden, self.linear1.out_features
                                                                        - 3 * self.hidden], dim=-1)
        q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).unbind(2)
        attn = attention(self.query_norm(q).to(v.dtype), self.key_norm(k).to(v.dtype), v, cos, sin)
        return x + gate * self.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], dim=-1))


class LastLayer(nn.Module):
    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Linear(hidden, 2 * hidden)
        self.linear = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(F.silu(vec)).chunk(2, dim=-1)
        return self.linear((1 + scale[:, None]) * _norm(x) + shift[:, None])


class Flux(ShardedModel):
    """The transformer: packed noisy latents [B, rows x cols, in_channels], text embeddings [B, T,
    context_in_dim], pooled text [B, vec_in_dim], timesteps [B] in [0, 1] and guidance [B] -> the predicted
    velocity, packed as the input."""

    def __init__(self, config: FluxConfig) -> None:
        super().__init__()
        problem = config.check()
        if problem:
            raise ValueError(problem)
        self.config = config
        h = config.hidden
        self.img_in = nn.Linear(config.in_channels, h)
        self.time_in = MLPEmbedder(TIME_EMBED_DIM, h)
        self.vector_in = MLPEmbedder(config.vec_in_dim, h)
        self.guidance_in = MLPEmbedder(TIME_EMBED_DIM, h) if config.guidance_embed else None
        self.txt_in = nn.Linear(config.context_in_dim, h)
        self.blocks = nn.ModuleList([*(DoubleStreamBlock(config) for _ in range(config.depth)),
                                     *(SingleStreamBlock(config) for _ in range(config.depth_single))])
        self.final_layer = LastLayer(h, config.in_channels)

    def shard_units(self) -> list[nn.Module]:
        """The modules outside the blocks that FSDP shards as units of their own, as torchtitan's
        parallelize_flux does: each embedder and the final layer (the root then holds no weights to gather)."""
        units = [self.img_in, self.time_in, self.vector_in, self.txt_in, self.final_layer]
        return units + ([self.guidance_in] if self.guidance_in is not None else [])

    def reset_parameters(self) -> None:
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Training from scratch as the reference does (torchtitan's init_weights): every projection
        Xavier-uniform with zero biases, the timestep, guidance and pooled-text embedders normal(0, 0.02), every
        modulation and the final layer zero, so that each block starts as the identity and the first
        prediction is zero (DiT's adaLN-Zero)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        embedders = [self.time_in, self.vector_in] + ([self.guidance_in] if self.guidance_in is not None else [])
        for embedder in embedders:
            nn.init.normal_(embedder.in_layer.weight, std=0.02)
            nn.init.normal_(embedder.out_layer.weight, std=0.02)
        for module in self.modules():
            if isinstance(module, Modulation):
                nn.init.zeros_(module.lin.weight)
                nn.init.zeros_(module.lin.bias)
        for layer in (self.final_layer.adaLN_modulation, self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def activation_bytes(self, seq_len: int, tp: int, checkpointing: str) -> int:
        """Bytes autograd keeps for the backward of one sample of `seq_len` tokens (image patches and text)
        under bf16 autocast, as this module computes it (what its saved-tensor hooks see, tested): per token of a
        double block 48 x width + 4 x MLP width bytes — each layer norm its fp32 input and output, the query and
        key norms theirs in fp32, attention its bf16 q, k, v and output, each projection its bf16 input, the GELU
        its input — and of a single block 42 x width + 4 x MLP width (its fused projection's whole bf16 output
        and the concatenation the second one reads). A checkpointed block keeps its fp32 input; one block at a
        time is recomputed. Outside the blocks: the final layer's norm and projection and the T5 encodings' bf16
        cast (text about half the sequence). Tensor parallelism is not built for FLUX: `tp` divides as if."""
        c = self.config
        h, m = c.hidden, c.mlp_hidden
        full = [seq_len * (48 * h + 4 * m + 8 * c.heads)] * c.depth + \
            [seq_len * (42 * h + 4 * m + 8 * c.heads)] * c.depth_single
        every = {"none": 0, "selective": 2, "full": 1}[checkpointing]
        checkpointed = [every > 0 and i % every == 0 for i in range(len(full))]
        kept = sum(seq_len * 4 * h if ck else size for ck, size in zip(checkpointed, full, strict=True))
        recomputed = max((size for ck, size in zip(checkpointed, full, strict=True) if ck), default=0)
        head = seq_len * (10 * h + c.context_in_dim)
        return (kept + recomputed + head) // tp

    def forward(self, img: torch.Tensor, txt: torch.Tensor, pooled: torch.Tensor, timesteps: torch.Tensor,
                guidance: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        config = self.config
        x = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps).to(x.dtype))
        if self.guidance_in is not None:
            vec = vec + self.guidance_in(timestep_embedding(guidance).to(x.dtype))
        vec = vec + self.vector_in(pooled)
        t = self.txt_in(txt)
        cos, sin = rotary_angles(position_ids(txt.shape[1], rows, cols, img.device), config.axes_dim, config.theta)
        for block in self.blocks[:config.depth]:
            x, t = block(x, t, vec, cos, sin)
        joint = torch.cat([t, x], dim=1)
        for block in self.blocks[config.depth:]:
            joint = block(joint, vec, cos, sin)
        return self.final_layer(joint[:, txt.shape[1]:], vec)
