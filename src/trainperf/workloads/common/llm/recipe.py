"""The decoder family's recipe fields and checks: LlamaRecipe (the Llama 3.1 pretraining rules' schedule,
evaluation cadence and parallelism fields) and MoERecipe (a mixture-of-experts model and its expert
parallelism). Each workload's own recipes (its RCP points, its mini) live in its package."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Fraction, Positive, Share
from trainperf.contract.parallel import CHECKPOINTING
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm.model import LLAMA31_8B, LlamaConfig
from trainperf.workloads.common.llm.moe_model import ATTENTIONS, GPT_OSS_20B, MoEModelConfig

MAX_STEPS = 1_200_000  # the rules' fixed schedule length (opt_learning_rate_decay_steps = it - warmup)
EVAL_EVERY_SAMPLES = 12_288
EVAL_SAMPLES = 1_024
SEQ_LEN = 8_192
# A run's budget: 40 evaluations, 1.5x the slowest RCP run's samples to converge (319,488 at GBS 128).
BUDGET_SAMPLES = 40 * EVAL_EVERY_SAMPLES
TRAIN_DATASET_RULES = ("schedule", "budget")
EVAL_DATASET_RULES = ("evaluated", "nemo_8b", "nemo_405b", "bridge")


def nemo_validation_samples(max_steps: int, gbs: int, check_interval: float, evaluated: int) -> int:
    """The validation samples NeMo 2's pretraining data module asks Megatron-Core for (nemo/collections/llm/gpt/
    data/pre_training.py): (max_steps // val_check_interval + 1) evaluations of ceil(evaluated / GBS) batches."""
    return int((max_steps // check_interval + 1) * math.ceil(evaluated / gbs) * gbs)


@dataclass(frozen=True)
class LlamaRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"checkpointing": CHECKPOINTING,
                                                     "train_dataset": TRAIN_DATASET_RULES,
                                                     "eval_dataset": EVAL_DATASET_RULES}
    model: LlamaConfig = field(default_factory=lambda: LLAMA31_8B)
    seq_len: Count = SEQ_LEN
    base_lr: Positive = 4e-4
    end_lr_fraction: Fraction = 0.1  # the cosine decays to this share of base_lr (opt_end_learning_rate)
    warmup_steps: int = 16
    max_steps: Count = MAX_STEPS  # the cosine's length: warmup + decay
    beta1: Fraction = 0.9
    beta2: Share = 0.95
    eps: Positive = 1e-5
    weight_decay: float = 0.1
    eval_samples: Count = EVAL_SAMPLES
    # Evaluate whole global batches: ceil(eval_samples / GBS) of them, as the references' `eval_batches =
    # ceil(eval_tokens / GBS)` does (1,056 sequences at 8B's GBS 96, 6,912 at 405B's 2,304), eval_samples logged.
    eval_whole_batches: bool = False
    eval_batch_size: Count = 8
    # The data sets as the reference's Megatron-Core builds them (indexed.Samples): how many samples it is asked
    # for (that decides how many passes its seeded order spans) and whether the validation set is shuffled by the
    # run's seed (False: file order, the 405B reference's patch). Every evaluation scores the validation set's
    # first `evaluated_samples`. The sizes follow the recipe's other fields (a --set batch keeps them the
    # reference's): DATASET_RULES says how each reference derives them.
    train_dataset: str = "schedule"
    eval_dataset: str = "evaluated"
    eval_shuffle: bool = True
    num_workers: int = 2  # DataLoader processes cutting samples from the memory-mapped corpus
    # Parallelism (contract/parallel.py FullyShard): tensor-parallel processes per block, activation
    # checkpointing of the blocks.
    tp: Count = 1
    checkpointing: str = "none"
    # Build the model on the meta device and initialise each process's shard after sharding (the 405B's
    # 1.6 TB of fp32 weights fit no device whole). Off: built whole on the device, then sharded.
    meta_init: bool = False
    # A Hugging Face checkpoint folder the model starts from instead of random weights ("": none), read into each
    # process's shards (workloads/common/llm/hf.py); its config must be the recipe's model.
    initial_checkpoint: str = ""

    def validate(self) -> None:
        super().validate()
        if self.model.dim % self.model.heads or self.model.heads % self.model.kv_heads:
            raise TrainperfError(f"recipe field model: dim {self.model.dim}, heads {self.model.heads} and kv_heads "
                                 f"{self.model.kv_heads}: heads must divide dim and kv_heads divide heads")
        if self.model.head_dim % 2:
            raise TrainperfError(f"recipe field model: head dimension {self.model.head_dim} must be even "
                                 "(rotary pairs)")
        split = {"model.heads": self.model.heads, "model.kv_heads": self.model.kv_heads,
                 "model.ffn_dim": self.model.ffn_dim, "seq_len": self.seq_len}
        uneven = [f"{name}={value}" for name, value in split.items() if value % self.tp]
        if uneven:
            raise TrainperfError(f"recipe field tp={self.tp}: tensor parallelism splits the heads, key/value heads, "
                                 f"feed-forward and sequence evenly; not " + ", ".join(uneven))
        if self.warmup_steps >= self.max_steps:
            raise TrainperfError(f"recipe fields warmup_steps={self.warmup_steps} and max_steps={self.max_steps}: "
                                 "the warmup must end before the schedule does")

    @property
    def evaluated_samples(self) -> int:
        """The validation sequences each evaluation scores."""
        if not self.eval_whole_batches:
            return self.eval_samples
        return -(-self.eval_samples // self.global_batch_size) * self.global_batch_size

    @property
    def train_dataset_size(self) -> int:
        """The training samples the reference asks Megatron-Core for: "schedule", the schedule's steps times the
        batch (NeMo's max_steps x GBS); "budget", the run's budget (Megatron-Bridge's train_iters x GBS, DeepSeek-V3's
        100 steps)."""
        if self.train_dataset == "budget" and self.max_samples:
            return self.max_samples
        return self.max_steps * self.global_batch_size

    @property
    def eval_dataset_size(self) -> int:
        """The validation samples the reference asks Megatron-Core for:
        - "evaluated": those an evaluation scores (Primus's patch for GPT-OSS: eval_iters x GBS);
        - "nemo_8b": NeMo's (max_steps // val_check_interval + 1) x ceil(eval_samples / GBS) x GBS, where the 8B's
          pretrain_llama31.py sets val_check_interval to its interval in steps divided by GBS once more;
        - "nemo_405b": the same with the 405B's val_check_interval, its first evaluation's step (pretrain_llama31.py);
        - "bridge": Megatron-Bridge's (train_iters // eval_interval + 1) x eval_iters x GBS, evaluating every step
          of a budget of train_iters = max_samples / GBS steps, one batch each (DeepSeek-V3's loaders.py)."""
        gbs = self.global_batch_size
        if self.eval_dataset == "nemo_8b":
            return nemo_validation_samples(self.max_steps, gbs, math.ceil(self.eval_every_samples / gbs) / gbs,
                                           self.eval_samples)
        if self.eval_dataset == "nemo_405b":
            return nemo_validation_samples(self.max_steps, gbs, self.eval_first_samples / gbs, self.eval_samples)
        if self.eval_dataset == "bridge":
            return (self.max_samples // gbs + 1) * gbs
        return self.evaluated_samples

    @property
    def end_lr(self) -> float:
        return self.base_lr * self.end_lr_fraction


@dataclass(frozen=True)
class MoERecipe(LlamaRecipe):
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = LlamaRecipe.CHOICES
    model: MoEModelConfig = field(default_factory=lambda: GPT_OSS_20B)  # type: ignore[assignment]
    # Expert parallelism: the processes each layer's experts are split over (adjacent ranks, a divisor of
    # the data-parallel processes; the rest of the model fully sharded over all of them).
    ep: Count = 1

    def validate(self) -> None:
        Recipe.validate(self)
        m = self.model
        m.moe.check("model")
        if m.attention not in ATTENTIONS:
            raise TrainperfError(f"recipe field model.attention={m.attention!r}: expected one of "
                                 + ", ".join(ATTENTIONS))
        if m.attention == "grouped" and m.heads % m.kv_heads:
            raise TrainperfError(f"recipe field model.kv_heads={m.kv_heads}: must divide heads={m.heads}")
        if m.rotary_dim % 2:
            raise TrainperfError(f"recipe field model: rotary dimension {m.rotary_dim} must be even (rotary pairs)")
        if m.dense_layers and not m.ffn_dim:
            raise TrainperfError(f"recipe field model.dense_layers={m.dense_layers}: needs model.ffn_dim")
        if self.tp != 1:
            raise TrainperfError(f"recipe field tp={self.tp}: tensor parallelism of the MoE models is not built "
                                 "(the reference trains GPT-OSS with TP 1 and EP 8); use ep")
        if m.experts % self.ep:
            raise TrainperfError(f"recipe field ep={self.ep}: must divide model.experts={m.experts}")
        if self.warmup_steps >= self.max_steps:
            raise TrainperfError(f"recipe fields warmup_steps={self.warmup_steps} and max_steps={self.max_steps}: "
                                 "the warmup must end before the schedule does")
