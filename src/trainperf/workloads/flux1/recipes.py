"""FLUX.1's recipes: the RCP points of MLPerf's `rcps_flux1.json` (rulesets 6.0.0 and 6.1.0, the same file) and
the mini's.

The reference (mlcommons/training `text_to_image/`, torchtitan's `mlperf-training-flux.1` branch) trains
FLUX.1-schnell's transformer from scratch at 256 x 256 (32 x 32 latents, 256 image patches beside 256 T5
tokens) with AdamW (β 0.9/0.95, ε 1e-8, weight decay 0.1), a linear warmup to a constant learning rate,
clipping at 1.0, the prompts replaced by the empty prompt's encodings with probability 0.1, and an evaluation
every 262,144 training samples (the rules), until the validation loss is 0.586 or less."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Fraction, Positive, Share
from trainperf.contract.parallel import CHECKPOINTING
from trainperf.errors import TrainperfError
from trainperf.workloads.flux1.model import FLUX1_SCHNELL, FluxConfig

# closed_flux1.yaml: evaluation_frequency == 262144 (6.0.0), the next multiple of the batch from 6.1.0 on
EVAL_EVERY_SAMPLES = 262_144
TRAIN_SAMPLES = 1_099_776  # CC12M after the reference's filtering (its first 1,099,776 usable images)
EVAL_SAMPLES = 29_696  # COCO-2014 validation captions, 3,712 at each of the 8 timesteps
TARGET = 0.586
# The RCPs' slowest run at each batch (rcps_flux1.json, 6.0.0): a run's budget is 1.5 times it, in whole
# evaluation intervals.
RCP_SLOWEST = {512: 7_602_176, 1024: 8_912_896, 2048: 12_320_768, 4096: 16_252_928}


@dataclass(frozen=True)
class FluxRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"checkpointing": CHECKPOINTING}
    model: FluxConfig = field(default_factory=lambda: FLUX1_SCHNELL)
    # The data's shapes, checked against the files: latents of latent_size x latent_size (256 px / 8), T5
    # encodings of text_tokens tokens.
    latent_size: Count = 32
    text_tokens: Count = 256
    base_lr: Positive = 1e-4
    warmup_steps: int = 0  # linear from base_lr / warmup, then constant (no decay)
    beta1: Fraction = 0.9
    beta2: Share = 0.95
    eps: Positive = 1e-8
    weight_decay: float = 0.1
    # Classifier-free guidance training: the share of samples whose T5 and CLIP encodings are both replaced
    # by the empty prompt's (1.0: a model that never sees the text).
    cfg_prob: Share = 0.1
    eval_samples: Count = EVAL_SAMPLES
    eval_batch_size: Count = 16
    num_workers: int = 4  # DataLoader processes decoding the rows
    # Parallelism (contract/parallel.py FullyShard): FSDP2 only, as the reference; activation checkpointing.
    tp: Count = 1
    checkpointing: str = "none"

    def validate(self) -> None:
        super().validate()
        problem = self.model.check()
        if problem:
            raise TrainperfError(f"recipe field model: {problem}")
        if self.latent_size % self.model.patch:
            raise TrainperfError(f"recipe field latent_size={self.latent_size}: must be a multiple of the patch "
                                 f"size {self.model.patch}")
        if self.tp != 1:
            raise TrainperfError(f"recipe field tp={self.tp}: tensor parallelism is not built for FLUX.1 (the "
                                 "reference shards with FSDP only); use tp=1")

    @property
    def image_tokens(self) -> int:
        return (self.latent_size // self.model.patch) ** 2

    @property
    def seq_len(self) -> int:
        """The joint sequence the blocks attend over: image patches and text tokens."""
        return self.image_tokens + self.text_tokens


def _rcp(gbs: int, lr: float, warmup: int) -> FluxRecipe:
    every = math.ceil(EVAL_EVERY_SAMPLES / gbs) * gbs  # ruleset 6.1.0: whole batches (the RCPs' batches divide it)
    evals = math.ceil(1.5 * RCP_SLOWEST[gbs] / every)
    return FluxRecipe(name=f"gbs{gbs}", global_batch_size=gbs, max_epochs=0,
                      target=TARGET, eval_every=1, eval_first=1, eval_every_samples=every,
                      log_epoch_num="samples", max_samples=evals * every, max_grad_norm=1.0,
                      base_lr=lr, warmup_steps=warmup, precision="bf16", fused_optimizer=True, checkpointing="full")


FULL_RECIPES = {r.name: r for r in (
    _rcp(1024, 2.5e-4, 800), _rcp(512, 2e-4, 1_600), _rcp(2048, 2.5e-4, 0), _rcp(4096, 4e-4, 100),
)}

# The mini: a 2 + 2-block, 128-wide FLUX on 8 x 8 latents (16 image patches) and 8 "T5" tokens of 32 values.
MINI = FluxRecipe(
    name="mini", global_batch_size=32, max_epochs=0, target=0.42, eval_every=1, eval_first=1,
    eval_every_samples=8_192, log_epoch_num="samples", max_samples=16 * 8_192, max_grad_norm=1.0,
    model=FluxConfig(latent_channels=16, vec_in_dim=16, context_in_dim=32, hidden=128, heads=4, depth=2,
                     depth_single=2, axes_dim=(8, 12, 12)),
    latent_size=8, text_tokens=8, base_lr=1e-3, warmup_steps=50, eval_samples=1_024, eval_batch_size=256,
    num_workers=0)
