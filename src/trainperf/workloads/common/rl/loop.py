"""One GRPO step and a pass@k evaluation, in the order the v6.1 reference runs them (NeMo-RL's
`grpo_train`, synchronous form: generate, reward, advantages, the trainer's log-probs, the loss, one
optimizer step per rollout batch, the weight sync), each phase timed on its own: in RL the time goes to
generation, and a user tuning a cluster needs rollout and training throughput apart.

The reference's asynchronous variant (`async_grpo.enabled`, trajectories at most one step old) overlaps
the next batch's generation with this step's training; its importance-sampling correction is what
`grpo.clipped_pg_loss` applies. This loop is the synchronous order (age 0): the same arithmetic, no overlap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from trainperf.workloads.common.rl import grpo
from trainperf.workloads.common.rl.engine import RolloutEngine, Rollouts, Sampling

# rewards of a batch: (the prompt index of each completion, the rollouts) -> [N] float rewards
Rewarder = Callable[[Sequence[int], Rollouts], torch.Tensor]


@dataclass
class Phases:
    """Seconds and tokens per phase of the steps so far."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("rollout", "reward", "train", "sync"),
                                                                             0.0))
    rollout_tokens: int = 0
    train_tokens: int = 0

    def add(self, phase: str, start: float) -> float:
        now = time.perf_counter()
        self.seconds[phase] += now - start
        return now

    def rates(self) -> dict[str, float]:
        """Generated tokens a second of rollout, trained tokens a second of training, each phase's share."""
        total = sum(self.seconds.values()) or 1.0
        out = {f"{k}_share": v / total for k, v in self.seconds.items()}
        out["rollout_tokens_per_s"] = self.rollout_tokens / max(self.seconds["rollout"], 1e-9)
        out["train_tokens_per_s"] = self.train_tokens / max(self.seconds["train"], 1e-9)
        return out


@dataclass(frozen=True)
class StepResult:
    loss: float
    reward: float
    kept: float
    grad_norm: float


def layout(prompts: Sequence[Sequence[int]], rollouts: Rollouts, pad: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompts and completions as the trainer reads them: `sequences` [N, P + T] right-padded, `positions`
    [N, T] where each completion token sits in them, and the completion tokens' mask [N, T]."""
    tokens, lengths = rollouts.tokens, rollouts.lengths
    n, width = tokens.shape
    device = tokens.device
    prompt_lens = torch.tensor([len(p) for p in prompts], device=device)
    total = int(prompt_lens.max()) + width
    seqs = torch.full((n, total), pad, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        seqs[row, :len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long, device=device)
    positions = prompt_lens[:, None] + torch.arange(width, device=device)[None]
    mask = torch.arange(width, device=device)[None] < lengths[:, None]
    seqs.scatter_(1, positions, torch.where(mask, tokens, pad))
    return seqs, positions, mask


def logprobs_at(model: nn.Module, sequences: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor
                ) -> torch.Tensor:
    """The model's log-probability of `tokens` [N, T] at `positions` of `sequences` (one forward, the
    next-token log-softmax gathered where the completion is)."""
    logits = model(sequences[:, :-1]).float()
    picked = logits.gather(1, (positions - 1)[..., None].expand(-1, -1, logits.shape[-1]))
    return torch.log_softmax(picked, -1).gather(-1, tokens[..., None])[..., 0]


def completion_logprobs(model: nn.Module, prompts: Sequence[Sequence[int]], rollouts: Rollouts,
                        pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's log-probabilities of each completion's tokens [N, T] (with gradient) and their mask:
    prompt and completion laid out right-padded, one forward, the next-token log-softmax gathered."""
    seqs, positions, mask = layout(prompts, rollouts, pad)
    return logprobs_at(model, seqs, positions, rollouts.tokens), mask.to(torch.float32)


def rollout_batch(model: nn.Module, engine: RolloutEngine, prompts: Sequence[Sequence[int]], owners: Sequence[int],
                  group: int, sampling: Sampling, rewarder: Rewarder, generator: torch.Generator, phases: Phases,
                  pad: int = 0, overlong_filtering: bool = True) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What one step trains on, in the reference's order: `group` completions of each prompt (`owners[i]` is
    prompt i's task for the rewarder), their rewards, the group-relative advantages, the trainer's no-gradient
    log-probs and the sequence masks (with `overlong_filtering`, the reference's, a completion cut at
    `max_new_tokens` without its stop token does not train). The batch (tensors of one row a completion) and
    the rewards; rollout and reward time counted in `phases`."""
    start = time.perf_counter()
    repeated = [p for p in prompts for _ in range(group)]
    owner = [o for o in owners for _ in range(group)]
    rollouts = engine.generate(repeated, sampling, generator)
    phases.rollout_tokens += rollouts.generated_tokens
    start = phases.add("rollout", start)
    rewards = rewarder(owner, rollouts).float().to(rollouts.tokens.device)
    phases.add("reward", start)
    sequences, positions, mask = layout(repeated, rollouts, pad)
    with torch.no_grad():
        trainer = logprobs_at(model, sequences, positions, rollouts.tokens)
    keep = grpo.sample_mask(rollouts.truncated, rollouts.logprobs, trainer, mask.float(),
                            overlong_filtering=overlong_filtering)
    batch = {"sequences": sequences, "positions": positions, "tokens": rollouts.tokens, "mask": mask.float(),
             "gen_logprobs": rollouts.logprobs, "advantages": grpo.group_advantages(rewards, group), "keep": keep}
    return batch, rewards


def batch_loss(model: nn.Module, batch: dict[str, torch.Tensor], valid_tokens: torch.Tensor | float,
               config: grpo.PGLossConfig = grpo.PGLossConfig()) -> torch.Tensor:
    """The clipped policy-gradient loss of a `rollout_batch` (or a slice of its rows) over `valid_tokens`."""
    logprobs = logprobs_at(model, batch["sequences"], batch["positions"], batch["tokens"])
    return grpo.clipped_pg_loss(logprobs, batch["gen_logprobs"], batch["advantages"], batch["mask"], batch["keep"],
                                valid_tokens, config)


def grpo_step(model: nn.Module, optimizer: torch.optim.Optimizer, engine: RolloutEngine,
              prompts: Sequence[Sequence[int]], group: int, sampling: Sampling, rewarder: Rewarder,
              generator: torch.Generator, phases: Phases, max_grad_norm: float = 1.0,
              loss_config: grpo.PGLossConfig = grpo.PGLossConfig(), micro_batch: int = 0,
              overlong_filtering: bool = True) -> StepResult:
    """Generate `group` completions of each prompt, reward them, and take one optimizer step on the
    clipped policy-gradient loss (token-level over the whole batch, micro-batches of `micro_batch`
    completions accumulated; 0: one)."""
    batch, rewards = rollout_batch(model, engine, prompts, range(len(prompts)), group, sampling, rewarder,
                                   generator, phases, overlong_filtering=overlong_filtering)
    start = time.perf_counter()
    keep = batch["keep"]
    valid = float((batch["mask"] * keep[:, None]).sum())
    n = len(keep)
    size = micro_batch or n
    total = 0.0
    for first in range(0, n, size):
        loss = batch_loss(model, {k: v[first:first + size] for k, v in batch.items()}, valid, loss_config)
        loss.backward()
        total += float(loss.detach())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    phases.train_tokens += int(batch["mask"].sum()) + group * sum(len(p) for p in prompts)
    start = phases.add("train", start)
    engine.load_weights(model.state_dict())
    phases.add("sync", start)
    return StepResult(total, float(rewards.mean()), float(keep.mean()), float(norm))


def evaluate_pass_at_k(engine: RolloutEngine, prompts: Sequence[Sequence[int]], k: int, sampling: Sampling,
                       rewarder: Rewarder, generator: torch.Generator) -> dict[str, float]:
    """The reference's validation: k samples of each prompt at the validation sampling, pass@k observed."""
    repeated = [p for p in prompts for _ in range(k)]
    owner = [i for i in range(len(prompts)) for _ in range(k)]
    rollouts = engine.generate(repeated, sampling, generator)
    return grpo.observed_pass_at_k(rewarder(owner, rollouts), k)
