"""The MLPerf Transformer (tensorflow/official "big"): pre-LayerNorm encoder-decoder blocks with a final
LayerNorm on each stack, sinusoidal positions, one embedding matrix shared by source, target and the
output projection (inputs scaled by sqrt(d)), dropout on residuals, attention and the ReLU.
Attention is `scaled_dot_product_attention`; decoding keeps each layer's self-attention keys and
values (an incremental cache) and the cross-attention keys and values of the source, computed once.

torch.nn.Transformer has the block layout but no incremental decoding, so the blocks are written
here; everything inside them is torch's (Linear, LayerNorm, SDPA)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.workloads.common.wmt.text import BOS, EOS, PAD


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """tensor2tensor's position signal: sines in the first half of the channels, cosines in the second,
    timescales from 1 to 10^4."""
    half = dim // 2
    scales = torch.exp(-math.log(1.0e4) * torch.arange(half, dtype=torch.float32) / max(half - 1, 1))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * scales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, cross: bool) -> None:
        super().__init__()
        self.heads, self.dropout, self.cross = heads, dropout, cross
        self.q = nn.Linear(dim, dim, bias=False)  # the reference's attention layers have no biases
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv(x).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        q = self.split(self.q(x))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        b, h, t, dh = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, h * dh))


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, dropout, cross=False)
        self.norm2, self.ffn = nn.LayerNorm(dim), FeedForward(dim, ffn, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, *self.attn.keys_values(h), mask=mask))
        return x + self.drop(self.ffn(self.norm2(x)))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.self_attn = nn.LayerNorm(dim), Attention(dim, heads, dropout, cross=False)
        self.norm2, self.cross_attn = nn.LayerNorm(dim), Attention(dim, heads, dropout, cross=True)
        self.norm3, self.ffn = nn.LayerNorm(dim), FeedForward(dim, ffn, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor], memory_mask: torch.Tensor,
                cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Training and uncached decoding: x holds every target position (causal self-attention).
        Cached decoding: x is the newest position only; `cache` [k, v] grows by one position."""
        h = self.norm1(x)
        k, v = self.self_attn.keys_values(h)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        x = x + self.drop(self.self_attn(h, k, v, causal=cache is None and x.shape[1] > 1))
        x = x + self.drop(self.cross_attn(self.norm2(x), *memory_kv, mask=memory_mask))
        return x + self.drop(self.ffn(self.norm3(x)))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int = 1024, heads: int = 16, ffn: int = 4096, encoder_layers: int = 6,
                 decoder_layers: int = 6, dropout: float = 0.1, max_positions: int = 1024) -> None:
        super().__init__()
        self.dim, self.max_positions = dim, max_positions
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)  # tensor2tensor's shared-embedding init
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.register_buffer("positions", sinusoids(max_positions, dim), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(dim, heads, ffn, dropout) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(dim, heads, ffn, dropout) for _ in range(decoder_layers))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        for name, p in self.named_parameters():
            if p.dim() == 2 and not name.startswith("embed"):
                nn.init.xavier_uniform_(p)  # tensorflow's glorot-uniform dense layers

    def embedding(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.embed(tokens) * self.dim ** 0.5
        return self.drop(x + self.positions[offset:offset + tokens.shape[1]].to(x.dtype))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Source [B, S] -> (memory [B, S, d], attention mask [B, 1, 1, S]: True where a key is real)."""
        mask = (src != PAD)[:, None, None, :]
        x = self.embedding(src)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.encoder_norm(x), mask

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.keys_values(memory) for layer in self.decoder]

    def decode(self, tgt_in: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor,
               caches: list[list[torch.Tensor]] | None = None, offset: int = 0) -> torch.Tensor:
        x = self.embedding(tgt_in, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory_kv[i], mask, None if caches is None else caches[i])
        return F.linear(self.decoder_norm(x), self.embed.weight)  # the shared embedding projects to words

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, V]."""
        memory, mask = self.encode(src)
        return self.decode(tgt_in, self.memory_kv(memory), mask)


class TransformerStepper:
    """Beam-search steps over a batch of sources (see wmt.beam.Stepper); `cached=False` recomputes
    the decoder over all target positions at every step (the reference check for the cache)."""

    def __init__(self, model: Transformer, src: torch.Tensor, beam: int, cached: bool = True) -> None:
        self.model, self.cached = model, cached
        memory, mask = model.encode(src)
        self.mask = mask.repeat_interleave(beam, 0)
        self.memory_kv = [(k.repeat_interleave(beam, 0), v.repeat_interleave(beam, 0))
                          for k, v in model.memory_kv(memory)]
        self.caches: list[list[torch.Tensor]] = [[] for _ in model.decoder]

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, None]:
        if self.cached:
            logits = self.model.decode(tokens[:, -1:], self.memory_kv, self.mask, self.caches,
                                       offset=tokens.shape[1] - 1)
        else:
            logits = self.model.decode(tokens, self.memory_kv, self.mask)
        return F.log_softmax(logits[:, -1].float(), dim=-1), None

    def keep(self, index: torch.Tensor) -> None:
        self.mask = self.mask[index]
        self.memory_kv = [(k[index], v[index]) for k, v in self.memory_kv]
        self.caches = [[t[index] for t in cache] for cache in self.caches]


def translate(model: Transformer, src: torch.Tensor, beam: int, alpha: float, extra_length: int,
              cached: bool = True) -> list[list[int]]:
    """Token ids of each source sentence's translation: beam search (greedy when beam is 1), at most
    source length + extra_length tokens (the reference's max_decode_length)."""
    from trainperf.workloads.common.wmt import beam as beam_search

    lengths = (src != PAD).sum(1)
    limit = (lengths + extra_length).clamp(max=model.max_positions - 1)
    stepper = TransformerStepper(model, src, beam, cached)
    if beam == 1:
        return beam_search.greedy_search(stepper, src.shape[0], limit, BOS, EOS)
    return beam_search.beam_search(stepper, src.shape[0], beam, limit, BOS, EOS, alpha=alpha)
