"""Llama 3.1 (Meta's architecture, in the module layout torchtitan uses): pre-norm decoder blocks of
grouped-query attention with rotary embeddings (Llama 3.1's frequency scaling) and a SwiGLU feed-forward,
RMSNorm, untied input and output embeddings, no biases, no dropout.

Attention is `scaled_dot_product_attention` with a causal mask over the whole sequence: the reference
(NeMo's GPT dataset with its defaults) does not reset attention or positions at document boundaries.
The heads a module holds are read from its projections' sizes, so the same code runs whole or with its
projections split over tensor-parallel processes (`tensor_parallel_plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract.sharded import ShardedModel


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 32
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn_dim: int = 14_336
    vocab_size: int = 128_256
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    # Llama 3.1's rotary scaling (factor, low- and high-frequency factors, the context it was trained at);
    # factor 0: none.
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def parameters(self) -> int:
        """Parameters of the model (embeddings and output layer included)."""
        kv = self.kv_heads * self.head_dim
        attention = self.dim * self.dim * 2 + self.dim * kv * 2
        block = attention + 3 * self.dim * self.ffn_dim + 2 * self.dim
        return self.layers * block + 2 * self.vocab_size * self.dim + self.dim

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token as torchtitan and Megatron count them for MFU: 6 per parameter
        outside the input embedding (a lookup), plus attention's 12 x layers x dim x sequence
        (the QK^T and AV products, forward and backward, over the full causal square)."""
        return 6.0 * (self.parameters() - self.vocab_size * self.dim) + 12.0 * self.layers * self.dim * seq_len


LLAMA31_8B = LlamaConfig()


def rope_frequencies(config: LlamaConfig) -> torch.Tensor:
    """The rotary inverse frequencies, rescaled as Llama 3.1 does: wavelengths shorter than the original
    context / high_freq_factor kept, longer than context / low_freq_factor divided by `factor`, and those
    between blended smoothly."""
    dim = config.head_dim
    freqs = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if config.rope_factor <= 0:
        return freqs.float()
    low_wavelen = config.rope_original_context / config.rope_low_freq_factor
    high_wavelen = config.rope_original_context / config.rope_high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (config.rope_original_context / wavelen - config.rope_low_freq_factor) / (
        config.rope_high_freq_factor - config.rope_low_freq_factor)
    blended = (1 - smooth) * freqs / config.rope_factor + smooth * freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / config.rope_factor, blended)
    scaled = torch.where(wavelen < high_wavelen, freqs, scaled)
    return scaled.float()


def rotary_tables(config: LlamaConfig, seq_len: int, device: torch.device | str | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, [seq_len, head_dim / 2]."""
    freqs = rope_frequencies(config).to(device)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of x [B, T, H, D] by the positions' angles (Meta's complex-pair layout)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class LayerCache:
    """One layer's keys and values for incremental decoding, preallocated for `length` positions; the
    valid keys (False on left padding) are shared by all layers through `KVCache`."""

    def __init__(self, owner: KVCache, batch: int, kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.owner = owner
        self.k = torch.zeros(batch, length, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys and values; return every key and value so far and the attention
        mask [B, 1, new, all] (causal, padding out; a padding query sees itself so no row is empty)."""
        start, seq = self.owner.filled, k.shape[1]
        end = start + seq
        self.k[:, start:end], self.v[:, start:end] = k, v
        return self.k[:, :end], self.v[:, :end], self.owner.mask(start, seq)


class KVCache:
    """Keys and values of every layer for a batch of sequences being generated (trainperf's own rollout
    engine, workloads/common/rl/engine.py); `valid` [B, length] marks real tokens (prompts left-padded)."""

    def __init__(self, config: LlamaConfig | None, batch: int, length: int, dtype: torch.dtype,
                 device: torch.device | str, kv_heads: int | None = None) -> None:
        self.valid = torch.zeros(batch, length, dtype=torch.bool, device=device)
        self.filled = 0
        self._mask: tuple[int, int, torch.Tensor] | None = None
        # Any per-layer state (a linear-attention layer's, say: common/llm/qwen35.py); config None: the
        # model appends its own.
        self.layers: list[Any] = []
        if config is not None:
            heads = kv_heads if kv_heads is not None else config.kv_heads
            self.layers = [LayerCache(self, batch, heads, length, config.head_dim, dtype, device)
                           for _ in range(config.layers)]

    def mask(self, start: int, seq: int) -> torch.Tensor:
        if self._mask is None or self._mask[:2] != (start, seq):
            end = start + seq
            keys = torch.arange(end, device=self.valid.device)
            queries = torch.arange(start, end, device=self.valid.device)
            causal = keys[None, :] <= queries[:, None]
            own = keys[None, :] == queries[:, None]
            allowed = causal[None] & self.valid[:, None, :end] | own[None]
            self._mask = (start, seq, allowed[:, None])
        return self._mask[2]

    def advance(self, seq: int) -> None:
        self.filled += seq
        self._mask = None


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.dim, config.heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.heads * config.head_dim, config.dim, bias=False)
        # Low-rank adapters (LoRA fine-tuning, workloads/llama2_70b_lora): one over the three input
        # projections as one fused q|k|v projection, one over the output projection. None: a plain block.
        self.qkv_adapter: nn.Module | None = None
        self.o_adapter: nn.Module | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
                ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qkv_adapter is not None:
            dq, dk, dv = self.qkv_adapter(x).split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
            q, k, v = q + dq, k + dk, v + dv
        # -1 heads: the local ones under tensor parallelism (the projections hold a share of them).
        q = q.view(batch, seq, -1, self.head_dim)
        k = k.view(batch, seq, -1, self.head_dim)
        v = v.view(batch, seq, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mask = None
        if cache is not None:
            k, v, mask = cache.extend(k, v)
        # Each key/value head serves heads // kv_heads query heads. Repeated here rather than through SDPA's
        # enable_gqa, which sends torch 2.11's CUDA dispatch to the math kernel (a 16 GiB score matrix at
        # 8,192 tokens on the H100 round) instead of flash or cuDNN.
        repeat = q.shape[2] // k.shape[2]
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(batch, seq, -1)
        if self.o_adapter is not None:
            return self.wo(out) + self.o_adapter(out)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
                ) -> torch.Tensor:
        # the cache as a keyword: tensor parallelism's PrepareModuleInput lays out the positional inputs only
        x = x + self.attention(self.attention_norm(x), cos, sin, cache=cache)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(ShardedModel):
    def __init__(self, config: LlamaConfig, max_seq_len: int) -> None:
        super().__init__()
        self.config, self.max_seq_len = config, max_seq_len
        # Where init_weights takes the weights from (a checkpoint with `load_into(model)`); None: drawn.
        self.weights_source: Any = None
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rotary_tables(config, max_seq_len)
        # Not persistent: recomputed from the config, never part of a checkpoint.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights, the output projections of each block scaled down by
        sqrt(2 x layers) (the residual branches' sum keeps unit scale, as Megatron's scaled init does),
        unit norms."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.layers)
        for name, param in self.named_parameters():
            if param.dim() == 1:
                nn.init.ones_(param)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(param, std=residual_std)
            else:
                nn.init.normal_(param, std=std)

    @torch.no_grad()
    def init_weights(self) -> None:
        """After a build on the meta device and `to_empty` (each process holding its shard): the rotary
        tables computed again where they now live, and the weights initialised as `reset_parameters` does."""
        cos, sin = rotary_tables(self.config, self.max_seq_len, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        if self.weights_source is not None:
            self.weights_source.load_into(self)
        else:
            self.reset_parameters()
        for module in self.modules():
            if getattr(module, "adapter", False):
                module.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.output(self.norm(x))

    def new_cache(self, batch: int, length: int) -> KVCache:
        """An empty cache for `batch` sequences of up to `length` tokens (the rollout engine's)."""
        weight = self.tok_embeddings.weight
        # the local key/value heads under tensor parallelism (the projection holds a share of them)
        heads = self.blocks[0].attention.wk.weight.shape[0] // self.config.head_dim
        return KVCache(self.config, batch, length, weight.dtype, weight.device, kv_heads=heads)

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits of `tokens` [B, S] that continue the sequences `cache` holds (the prompt's prefill, then
        one token a step), the cache extended with them. Positions are the cache's slots: a row left-padded
        by n is shifted by n, which rotary embeddings, depending only on distances, do not see."""
        start, seq = cache.filled, tokens.shape[1]
        cos, sin = self.rope_cos[start:start + seq], self.rope_sin[start:start + seq]
        x = self.tok_embeddings(tokens)
        for block, layer in zip(self.blocks, cache.layers, strict=True):
            x = block(x, cos, sin, layer)
        cache.advance(seq)
        return self.output(self.norm(x))

    def activation_bytes(self, seq_len: int, tp: int, checkpointing: str) -> int:
        """Bytes autograd keeps for the backward of one sequence under bf16 autocast, as this module computes
        it (what its saved-tensor hooks see: flash attention keeps nothing quadratic in the sequence; the
        weights' bf16 casts left out, FSDP's bf16 parameters need none), with tensor and sequence parallelism
        over `tp` (every saved tensor split `tp` ways). Per token of a block, 34 dim + 8 ffn + 8 + 4 heads bytes:
        each norm keeps its fp32 input, normalised value and scale (2 x (8 dim + 4)), attention its fp32
        log-sum-exp per head, each of the five input projections its bf16
        input (5 x 2 dim), attention its q and repeated k, v (6 dim) and the output projection its input (2
        dim), the feed-forward its gate, SiLU, up and product (4 x 2 ffn). The head: the final norm (10 dim)
        and, at the loss's backward, the bf16 logits, the fp32 log-softmax and its gradients (12 bytes a
        vocabulary entry). A checkpointed block keeps only its fp32 input; one block at a time is recomputed."""
        c = self.config
        block = seq_len * (34 * c.dim + 8 * c.ffn_dim + 8 + 4 * c.heads)
        kept_input = seq_len * 4 * c.dim
        checkpointed = {"none": 0, "selective": (c.layers + 1) // 2, "full": c.layers}[checkpointing]
        blocks = (c.layers - checkpointed) * block + checkpointed * kept_input + (block if checkpointed else 0)
        head = seq_len * (10 * c.dim + 12 * c.vocab_size)
        return (blocks + head) // tp

    def tensor_parallel_plan(self) -> dict[str, Any]:
        """Tensor and sequence parallelism (torch.distributed.tensor.parallel's parallelize_module plan,
        as Megatron lays it out): the projections into heads and into the feed-forward split by columns, the
        projections back split by rows, the norms and residual stream split along the sequence between
        them; the embedding split by vocabulary rows, the output layer by vocabulary columns."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
        )

        plan: dict[str, Any] = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True),
        }
        for i in range(len(self.blocks)):
            prefix = f"blocks.{i}."
            plan.update({
                prefix + "attention_norm": SequenceParallel(),
                prefix + "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                         desired_input_layouts=(Replicate(), None, None)),
                prefix + "attention.wq": ColwiseParallel(),
                prefix + "attention.wk": ColwiseParallel(),
                prefix + "attention.wv": ColwiseParallel(),
                prefix + "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                prefix + "ffn_norm": SequenceParallel(),
                prefix + "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                            desired_input_layouts=(Replicate(),)),
                prefix + "feed_forward.w1": ColwiseParallel(),
                prefix + "feed_forward.w3": ColwiseParallel(),
                prefix + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            })
            for name in ("qkv_adapter", "o_adapter"):  # LoRA's adapters lay themselves out beside the projections
                adapter = getattr(self.blocks[i].attention, name)
                if adapter is not None:
                    plan.update(adapter.tensor_parallel_plan(prefix + "attention." + name))
        return plan


def next_token_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each next token: batch [B, T + 1] of token ids (MLPerf's sequences carry one
    extra token, the last position's label)."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def token_losses(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Every next token's cross-entropy [B, T] (the evaluation sums them)."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none").view(
        batch.shape[0], -1)
