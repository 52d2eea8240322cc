"""The rollout engine boundary: what the RL loop asks of whatever generates completions.

On GPUs the reference generates with vLLM (NeMo-RL's `VllmGeneration`, a separate set of GPUs whose
weights the trainer refits after every step); SGLang is the other engine users plug in. trainperf's loop
talks to any of them through `RolloutEngine`: `generate` a batch of prompts under a `Sampling`, and
`load_weights` after each optimizer step (the weight sync, timed as its own phase). `TorchEngine` is the
default that runs everywhere: batched, KV-cached sampling with the trainer's own model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from trainperf.workloads.common.llm.model import KVCache


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn; the v6.1 reference trains at temperature 1.0, top-p 1.0 and validates
    at 0.1, 0.95 (`grpo.validation_generation`). `stop` ends a completion (the token is kept)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: int | None = None


@dataclass
class Rollouts:
    """A batch's completions: `tokens` [N, T] right-padded with `pad`, `lengths` [N] (the stop token
    included), `logprobs` [N, T] of each sampled token under the engine's policy at the sampling
    temperature (before top-p: what the trainer recomputes and compares), `truncated` [N] for completions
    cut at `max_new_tokens` without a stop (the reference's overlong filtering drops them from the loss)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor
    prompt_tokens: int = 0

    @property
    def generated_tokens(self) -> int:
        return int(self.lengths.sum())


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, generator: torch.Generator
                 ) -> Rollouts: ...

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> int:
        """Take the trainer's weights; return the bytes moved."""
        ...


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logits` with every token outside the smallest set whose probability reaches `top_p` set to -inf
    (the most likely token always kept)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    outside = probs.cumsum(-1) - probs > top_p
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` [B, V] and its log-probability at the sampling temperature. A
    temperature of 0 is greedy."""
    logits = logits.float()
    if sampling.temperature <= 0:
        token = logits.argmax(-1)
        return token, F.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    scaled = logits / sampling.temperature
    probs = top_p_filter(scaled, sampling.top_p).softmax(-1)
    token = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return token, F.log_softmax(scaled, -1).gather(-1, token[:, None])[:, 0]


class Decoder(Protocol):
    """What `TorchEngine` asks of a model: the family's Llama (its adapters included) and Qwen3.5 have it."""

    tok_embeddings: torch.nn.Embedding
    max_seq_len: int
    training: bool

    def new_cache(self, batch: int, length: int) -> KVCache: ...

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor: ...

    def train(self, mode: bool = True) -> Decoder: ...

    def eval(self) -> Decoder: ...

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> Any: ...


class TorchEngine:
    """Generation with a trainperf decoder (the Llama family's, adapters included, or Qwen3.5's), batched
    over prompts with one cache.
    `shared=True` generates with the trainer's own module (nothing to sync: one process, one copy of the
    weights, as a colocated engine without resharding); otherwise the engine keeps a copy that
    `load_weights` refreshes."""

    def __init__(self, model: Decoder, pad: int = 0, shared: bool = True) -> None:
        self.model, self.pad, self.shared = model, pad, shared

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> int:
        if self.shared:
            return 0
        self.model.load_state_dict(dict(state))
        return sum(t.numel() * t.element_size() for t in state.values())

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, generator: torch.Generator
                 ) -> Rollouts:
        model = self.model
        device = model.tok_embeddings.weight.device
        was_training = model.training
        model.eval()
        try:
            return self._generate(prompts, sampling, generator, device)
        finally:
            model.train(was_training)

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, generator: torch.Generator,
                  device: torch.device) -> Rollouts:
        model, batch = self.model, len(prompts)
        width = max(len(p) for p in prompts)
        length = width + sampling.max_new_tokens
        if length > model.max_seq_len:
            raise ValueError(f"prompt ({width}) + max_new_tokens ({sampling.max_new_tokens}) exceed the model's "
                             f"{model.max_seq_len} positions")
        cache = model.new_cache(batch, length)
        tokens = torch.full((batch, width), self.pad, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            if len(prompt):
                tokens[row, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
                cache.valid[row, width - len(prompt):width] = True
        out = torch.full((batch, sampling.max_new_tokens), self.pad, dtype=torch.long, device=device)
        logprobs = torch.zeros(batch, sampling.max_new_tokens, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        logits = model.decode(tokens, cache)[:, -1]
        for step in range(sampling.max_new_tokens):
            token, logprob = sample(logits, sampling, generator)
            token = torch.where(done, self.pad, token)
            out[:, step] = token
            logprobs[:, step] = torch.where(done, 0.0, logprob)
            lengths += (~done).long()
            if sampling.stop is not None:
                done = done | (token == sampling.stop)
            # one host read a step ends the batch early once every row has stopped (generation only)
            if step + 1 == sampling.max_new_tokens or bool(done.all()):
                break
            cache.valid[:, cache.filled] = ~done
            logits = model.decode(token[:, None], cache)[:, -1]
        stopped = done if sampling.stop is not None else torch.zeros_like(done)
        used = int(lengths.max()) if batch else 0
        return Rollouts(out[:, :used], lengths, logprobs[:, :used], ~stopped,
                        prompt_tokens=sum(len(p) for p in prompts))
