"""GRPO's arithmetic as the v6.1 reference computes it (NeMo-RL at the commit mlcommons/training's
`llm_post_training/RL` pins, 3fca04c9): group-relative advantages, the sequence masks, the clipped
policy-gradient loss with its importance-sampling correction, and the validation's pass@k.

Sources (file and function in NVIDIA-NeMo/RL at that commit):
- advantages: `nemo_rl/algorithms/advantage_estimator.py::GRPOAdvantageEstimator` over
  `nemo_rl/algorithms/utils.py::calculate_baseline_and_std_per_prompt` (leave-one-out baseline, the
  unbiased standard deviation of the others, no division where it is 0);
- masks: `nemo_rl/algorithms/grpo.py` (overlong filtering: a truncated completion has loss multiplier 0;
  the per-sequence multiplicative probability error masked above `seq_logprob_error_threshold`);
- loss: `nemo_rl/algorithms/loss/loss_functions.py::ClippedPGLossFn` (token-level mean over the global
  batch's valid tokens; `force_on_policy_ratio` fixes the ratio at 1 with the gradient kept;
  `seq-mask-tis` drops a sequence whose geometric-mean trainer/generator ratio leaves [min, max]);
- pass@k: `nemo_rl/algorithms/grpo.py::_calculate_observed_pass_metrics` — the observed fraction of
  tasks with at least one success among their k samples (not Chen et al.'s unbiased estimator, which
  `unbiased_pass_at_k` gives for comparison when n > k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PGLossConfig:
    """The clipped policy-gradient loss's settings; the defaults are the v6.1 reference's
    (`grpo_qwen35_397b_swe_openhands_async.yaml`, `loss_fn`)."""

    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.28
    force_on_policy_ratio: bool = True
    use_importance_sampling_correction: bool = True
    tis_ratio_min: float | None = 0.999  # seq-mask-tis bounds; None: no truncated importance sampling
    tis_ratio_max: float | None = 1.002
    reference_policy_kl_penalty: float = 0.0


def group_advantages(rewards: torch.Tensor, group: int, leave_one_out: bool = True, normalize: bool = True,
                     epsilon: float = 1e-6) -> torch.Tensor:
    """Each sample's advantage within its prompt's group of `group` consecutive samples: its reward minus
    the mean of the others' (leave-one-out) or of all, divided by their unbiased standard deviation plus
    `epsilon` where that deviation is not 0 ("don't sharpen the ones with no variation")."""
    if rewards.ndim != 1 or rewards.numel() % group:
        raise ValueError(f"rewards must be a flat tensor of whole groups of {group}, got shape {tuple(rewards.shape)}")
    r = rewards.view(-1, group)
    n = group - int(leave_one_out)
    if n <= 0:
        return torch.zeros_like(rewards)
    total, squares = r.sum(1, keepdim=True), r.square().sum(1, keepdim=True)
    if leave_one_out:
        baseline, mean_square = (total - r) / n, (squares - r.square()) / n
    else:
        baseline, mean_square = (total / n).expand_as(r), (squares / n).expand_as(r)
    if n > 1:
        std = ((mean_square - baseline.square()) * (n / (n - 1))).clamp_min(0).sqrt()
    else:
        std = torch.zeros_like(r)
    advantages = r - baseline
    if normalize:
        advantages = torch.where(std > 0, advantages / (std + epsilon), advantages)
    return advantages.reshape(-1)


def sequence_error(generation_logprobs: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per sequence, the mean over its valid tokens of exp(|generator's log-prob - trainer's|): 1 where the
    two engines agree; the reference masks a sequence above `seq_logprob_error_threshold` (2)."""
    tokens = mask.sum(-1)
    error = (torch.exp((generation_logprobs - logprobs).abs() * mask) * mask).sum(-1)
    return torch.where(tokens > 0, error / tokens.clamp_min(1), torch.zeros_like(error))


def sample_mask(truncated: torch.Tensor, generation_logprobs: torch.Tensor, logprobs: torch.Tensor,
                token_mask: torch.Tensor, error_threshold: float | None = 2.0,
                overlong_filtering: bool = True) -> torch.Tensor:
    """Which sequences train (1.0) or not (0.0): truncated completions out (overlong filtering), then
    those whose `sequence_error` exceeds the threshold."""
    keep = torch.ones(truncated.shape, dtype=logprobs.dtype, device=logprobs.device)
    if overlong_filtering:
        keep = keep * (~truncated.bool()).to(keep.dtype)
    if error_threshold is not None:
        error = sequence_error(generation_logprobs, logprobs.detach(), token_mask * keep.unsqueeze(-1))
        keep = keep * (error <= error_threshold).to(keep.dtype)
    return keep


def clipped_pg_loss(logprobs: torch.Tensor, generation_logprobs: torch.Tensor, advantages: torch.Tensor,
                    token_mask: torch.Tensor, keep: torch.Tensor, valid_tokens: torch.Tensor | float,
                    config: PGLossConfig = PGLossConfig(), prev_logprobs: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The policy-gradient loss of a micro-batch, token-level: sum over its valid tokens divided by the
    global batch's `valid_tokens`, so micro-batches and ranks add up to the batch's mean.

    `logprobs` are the trainer's (with gradient) for the completion tokens, `generation_logprobs` the
    rollout engine's for the same tokens, `advantages` per token or per sequence (broadcast),
    `token_mask` 1 on completion tokens, `keep` the sequences' mask (`sample_mask`). `prev_logprobs`
    (the policy before this update) is needed only when the ratio is not forced to 1."""
    if config.reference_policy_kl_penalty:
        raise NotImplementedError("a KL penalty needs the reference policy's log-probs; the v6.1 recipe has none")
    if advantages.ndim == 1:
        advantages = advantages.unsqueeze(-1)
    mask = token_mask * keep.unsqueeze(-1)
    if config.force_on_policy_ratio:
        prev = logprobs.detach()
        ratios = torch.exp(logprobs - prev)
        clipped = ratios
    else:
        if prev_logprobs is None:
            raise ValueError("prev_logprobs is needed when force_on_policy_ratio is off")
        prev = prev_logprobs
        ratios = torch.exp(logprobs - prev)
        clipped = ratios.clamp(1.0 - config.ratio_clip_min, 1.0 + config.ratio_clip_max)
    loss = torch.maximum(-advantages * ratios, -advantages * clipped)
    if config.use_importance_sampling_correction:
        weights = torch.nan_to_num(torch.exp(prev - generation_logprobs), nan=0.0, posinf=0.0, neginf=0.0)
        if config.tis_ratio_min is not None and config.tis_ratio_max is not None:
            log_ratio = torch.nan_to_num(prev - generation_logprobs, nan=0.0, posinf=0.0, neginf=0.0)
            tokens = token_mask.sum(-1)
            geomean = torch.exp((log_ratio * token_mask).sum(-1) / (tokens + 1e-8))
            kept = ((geomean >= config.tis_ratio_min) & (geomean <= config.tis_ratio_max)).to(weights.dtype)
            weights = weights * kept.unsqueeze(-1)
        loss = weights.detach() * loss
    return (loss * mask).sum() / (valid_tokens + 1e-8)


def observed_pass_at_k(rewards: torch.Tensor, k: int) -> dict[str, float]:
    """The reference's validation metrics over tasks of `k` consecutive samples each: pass@k (a task
    counts when any sample's reward is > 0), pass^k (all of them) and the mean pass@1."""
    if k < 1 or rewards.numel() % k:
        raise ValueError(f"{rewards.numel()} rewards are not whole groups of {k}")
    if rewards.numel() == 0:
        return {f"pass@{k}": 0.0, f"pass^{k}": 0.0, f"pass@1[avg-of-{k}]": 0.0}
    passed = rewards.float().view(-1, k) > 0
    return {f"pass@{k}": passed.any(1).float().mean().item(), f"pass^{k}": passed.all(1).float().mean().item(),
            f"pass@1[avg-of-{k}]": passed.float().mean().item()}


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased pass@k from n samples of which c pass: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
