"""Transformer's recipes: the MLPerf reference (v0.7, BLEU 25.0) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainperf.contract import LengthBuckets, Recipe
from trainperf.contract.fields import Count, Fraction, Positive
from trainperf.errors import TrainperfError
from trainperf.workloads.transformer import data as transformer_data


@dataclass(frozen=True)
class TransformerRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    # global_batch_size is in TOKENS: a global batch holds sentences x longest side <= this many.
    BATCH_UNIT: ClassVar[str] = "tokens"
    dim: Count = 1024
    heads: Count = 16
    ffn: Count = 4096
    encoder_layers: Count = 6
    decoder_layers: Count = 6
    dropout: Fraction = 0.1
    label_smoothing: Fraction = 0.1
    # Adam with a linear warmup to base_lr over warmup_steps, then base_lr * sqrt(warmup_steps / step).
    # The reference's 2.0 * d^-0.5 * min(step / 16000, 1) / sqrt(max(step, 16000)) is base_lr 4.94e-4.
    base_lr: Positive = 2.0 * 1024 ** -0.5 * 16000 ** -0.5
    warmup_steps: int = 16000
    beta1: Fraction = 0.9
    beta2: Fraction = 0.997
    eps: Positive = 1e-9
    beam: Count = 4
    alpha: Positive = 0.6  # length penalty ((5 + length) / 6) ** alpha
    extra_length: int = 50  # a translation may be this many tokens longer than its source
    eval_batch_size: Count = 128  # test sentences decoded together (each with `beam` hypotheses)
    # --static-shapes (and --cuda-graphs): a batch is padded to the bucket of its longest side and to that
    # bucket's rows (global_batch_size // length). Empty: 8 to 256 tokens, 16 buckets (multiples of 8 to 64, then
    # four a doubling: at most 19 % padding above 64 tokens).
    bucket_lengths: tuple[int, ...] = ()

    @property
    def buckets(self) -> LengthBuckets:
        if self.bucket_lengths:
            return LengthBuckets.from_recipe("bucket_lengths", self.bucket_lengths)
        return LengthBuckets.geometric(8, transformer_data.MAX_LENGTH)

    def validate(self) -> None:
        super().validate()
        if self.dim % self.heads or self.dim % 2:
            raise TrainperfError(f"recipe: dim {self.dim} must be even and divisible by heads {self.heads}")
        if min(self.encoder_layers, self.decoder_layers, self.ffn, self.beam, self.eval_batch_size) < 1:
            raise TrainperfError("recipe: need layers, ffn, beam and eval_batch_size >= 1")
        if not 0 <= self.dropout < 1 or not 0 <= self.label_smoothing < 1:
            raise TrainperfError("recipe: need 0 <= dropout < 1 and 0 <= label_smoothing < 1")
        if self.base_lr <= 0 or self.warmup_steps < 1:
            raise TrainperfError("recipe: need base_lr > 0 and warmup_steps >= 1")
        buckets = self.buckets
        if self.global_batch_size < buckets.longest:
            raise TrainperfError(f"recipe field global_batch_size is in tokens: {self.global_batch_size} cannot hold "
                                 f"one sentence of the longest bucket ({buckets.longest} tokens)")
        if self.global_batch_size < transformer_data.MAX_LENGTH:
            raise TrainperfError(f"recipe field global_batch_size is in tokens: {self.global_batch_size} cannot hold "
                                 f"one sentence of the longest kept ({transformer_data.MAX_LENGTH} tokens)")


# The reference's batch: one process of 4,096 tokens (transformer_main's), whose learning rate and 16,000-step
# warmup this recipe keeps while running 8 of them (32,768 tokens a step): a note says so before a run
# (TransformerWorkload.notes). 10 epochs budget (the reference runs until BLEU 25; it converges in a few).
REFERENCE_TOKENS = 4096
FULL = TransformerRecipe(name="reference", global_batch_size=8 * 4096, max_epochs=10, target=0.25,
                         eval_every=1, eval_first=1)
MINI = TransformerRecipe(name="mini", global_batch_size=2048, max_epochs=8, target=0.60, eval_every=1,
                         eval_first=1, dim=64, heads=4, ffn=256, encoder_layers=2, decoder_layers=2,
                         base_lr=3e-3, warmup_steps=300, beam=4, eval_batch_size=250)
