"""GRPO post-training recipes: the reference's three RCP batches (`rcps_qwen35_397b_grpo.json`, whose
learning rate and clip norm move with the batch as the closed rules compute them) and the mini."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trainperf.contract import Count, Recipe
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm.moe import MoEConfig
from trainperf.workloads.common.llm.qwen35 import QWEN35_397B, Qwen35Config

GENERATIONS = 16  # completions per prompt: the closed rules require 16
VALIDATION_TASKS = 251  # rows of benchmark_r2e_gym_easy_val.jsonl, what 6.1.0's checker requires (see the page)
MAX_SEQUENCE = 65_536  # prompt and completion tokens of one trajectory (the closed rules' max_sequence_length)
FULL_STEPS = 30  # the RCP runs' budget (llm_post_training/rcp_logs/GBS256/seed_1.out: max_steps 30)


@dataclass(frozen=True)
class GRPORecipe(Recipe):
    """One GRPO run: `num_prompts_per_step` tasks a step, `num_generations_per_prompt` completions each (the
    global batch is their product), AdamW at a constant rate, the clipped policy-gradient loss, pass@k on
    the validation tasks at the validation sampling."""

    num_prompts_per_step: Count = 16
    num_generations_per_prompt: Count = GENERATIONS
    lr: float = 1e-6
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    train_temperature: float = 1.0
    train_top_p: float = 1.0
    val_temperature: float = 0.1
    val_top_p: float = 0.95
    max_sequence_length: Count = MAX_SEQUENCE
    max_new_tokens: Count = 32_768
    pass_k: Count = 4
    eval_tasks: Count = VALIDATION_TASKS
    # The loss (grpo.PGLossConfig's, the reference's values)
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.28
    overlong_filtering: bool = True
    model: Qwen35Config = field(default_factory=lambda: QWEN35_397B)
    # The policy's Hugging Face folder (config.json, safetensors, tokenizer.json); blank: the mini's shipped
    # policy at the mini's shapes, DATA/checkpoint at the full's.
    policy: str = ""
    # The sandbox: programs run at once, and each one's wall and CPU seconds and memory.
    sandbox_workers: Count = 2
    sandbox_wall_s: float = 10.0
    sandbox_cpu_s: Count = 10
    sandbox_memory_mb: Count = 512
    # Where the tests run: "sandbox" (trainperf's, for tasks whose tests need only Python's standard library)
    # or "container" (the task's image under Apptainer, as the reference runs R2E-Gym's repositories).
    executor: str = "container"
    max_steps: Count = FULL_STEPS

    CHOICES = {"executor": ("sandbox", "container")}
    # The closed rules move the rate with the square root of the batch (1e-6 x sqrt(GBS / 256)).
    LR_FIELDS = ("lr",)

    def for_batch(self, batch: int, rule: str = "linear", warmup: str = "samples") -> tuple[Recipe, list[str]]:
        """This recipe at another global batch, as Recipe's (the rate by `rule`; the closed rules' is `sqrt`),
        the prompts a step moving with it (the batch is prompts x generations) and the clip norm as the closed
        rules derive it from the batch (x sqrt(B0 / B))."""
        if batch < 1 or batch % self.num_generations_per_prompt:
            raise TrainperfError(f"batch size {batch}: expected a multiple of num_generations_per_prompt="
                                 f"{self.num_generations_per_prompt} (the batch is prompts x generations)")
        prompts = batch // self.num_generations_per_prompt
        clip = self.max_grad_norm * math.sqrt(self.global_batch_size / batch) if self.max_grad_norm else 0.0
        shadow = dataclasses.replace(self, num_prompts_per_step=prompts, max_grad_norm=clip)
        scaled, said = Recipe.for_batch(shadow, batch, rule, warmup)
        said += [f"num_prompts_per_step {self.num_prompts_per_step} -> {prompts}",
                 f"max_grad_norm {self.max_grad_norm:.4g} -> {clip:.4g}"]
        return scaled, said

    def validate(self) -> None:
        super().validate()
        if self.global_batch_size != self.num_prompts_per_step * self.num_generations_per_prompt:
            raise TrainperfError(f"recipe field global_batch_size={self.global_batch_size}: must be "
                                 f"num_prompts_per_step x num_generations_per_prompt = {self.num_prompts_per_step} x "
                                 f"{self.num_generations_per_prompt}")
        if self.max_new_tokens >= self.max_sequence_length:
            raise TrainperfError(f"recipe field max_new_tokens={self.max_new_tokens}: must be below "
                                 f"max_sequence_length={self.max_sequence_length} (the prompt needs room)")
        if self.pass_k > self.num_generations_per_prompt * 64:
            raise TrainperfError(f"recipe field pass_k={self.pass_k}: too many samples a task")
        for name in ("train_temperature", "val_temperature"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                raise TrainperfError(f"recipe field {name}={getattr(self, name)}: expected 0 to 10")
        for name in ("train_top_p", "val_top_p"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise TrainperfError(f"recipe field {name}={getattr(self, name)}: expected above 0, at most 1")


def validation_start(gbs: int) -> int:
    """The first evaluation's sample count under the closed rules: GBS x ceil(2.5 + 3,840 / GBS)."""
    return gbs * math.ceil(2.5 + 3_840 / gbs)


def _full(gbs: int) -> GRPORecipe:
    """An RCP point (mlperf-logging 6.1.0 `rcps_qwen35_397b_grpo.json`, NVIDIA's reference runs on 64 GB300
    nodes): GBS / 16 prompts a step, 16 completions each, LR 1e-6 x sqrt(GBS / 256), clip 0.125 x sqrt(256 /
    GBS), accumulation GBS / 8; the closed rules' evaluation points (the first at GBS x ceil(2.5 + 3,840 /
    GBS), then every step); the RCP run's budget of 30 steps (its log's max_steps; the RCP runs converge at
    their first evaluation, 7 to 18 steps)."""
    return GRPORecipe(
        name=f"gbs{gbs}", global_batch_size=gbs, num_prompts_per_step=gbs // GENERATIONS, grad_accum_steps=gbs // 8,
        max_epochs=0, max_samples=FULL_STEPS * gbs, target=0.69, eval_every=1, eval_first=1, eval_every_samples=gbs,
        eval_first_samples=validation_start(gbs), log_epoch_num="samples", lr=round(1e-6 * math.sqrt(gbs / 256), 15),
        max_grad_norm=round(0.125 * math.sqrt(256 / gbs), 12), precision="bf16", max_steps=FULL_STEPS)


FULL_RECIPES = {r.name: r for r in (_full(256), _full(512), _full(1024))}

# The mini's policy: Qwen3.5's layers at a CPU's size (three DeltaNet layers and one gated-attention layer, four
# experts of which two a token and a gated shared expert) over the tasks' 52 characters.
MINI_MODEL = Qwen35Config(
    layers=4, dim=64, vocab_size=53, heads=4, kv_heads=2, head_dim=16, rope_theta=10_000.0, linear_k_heads=2,
    linear_v_heads=4, linear_k_dim=16, linear_v_dim=16, chunk=16,
    moe=MoEConfig(experts=4, top_k=2, hidden=128, shared=1, shared_gate=True, scoring="softmax_topk", balance="none"))
MINI_GBS = 8 * GENERATIONS
MINI = GRPORecipe(
    name="mini", global_batch_size=MINI_GBS, num_prompts_per_step=8, max_epochs=0, max_samples=80 * MINI_GBS,
    target=0.9, eval_every=1, eval_first=1, eval_every_samples=2 * MINI_GBS, eval_first_samples=2 * MINI_GBS,
    log_epoch_num="samples", lr=1e-4, max_grad_norm=round(0.125 * math.sqrt(256 / MINI_GBS), 12),
    max_sequence_length=48, max_new_tokens=24, eval_tasks=64, model=MINI_MODEL, executor="sandbox",
    sandbox_wall_s=5.0, sandbox_cpu_s=5, max_steps=80)
