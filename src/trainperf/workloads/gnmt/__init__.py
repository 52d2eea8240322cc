"""GNMT v2 on WMT16 English-German (MLPerf key `gnmt`, ruleset 0.7.0), and its mini scale on the
synthetic English -> German-like corpus prepared as the reference prepares WMT16. BLEU on newstest2014
by sacrebleu with the reference's settings, scored off the training path."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.spec import (
    Assets,
    DataParts,
    EpochView,
    EvalPartial,
    Metric,
    ModelParts,
    Recipe,
    RuntimeContext,
    Workload,
    bare_model,
)
from trainperf.spec.fields import Count, Fraction, Positive, Share
from trainperf.workloads.common.wmt import batching, bleu
from trainperf.workloads.common.wmt import parts as wmt_parts
from trainperf.workloads.common.wmt.text import PAD
from trainperf.workloads.gnmt import data as gnmt_data
from trainperf.workloads.gnmt import model as gnmt_model


@dataclass(frozen=True)
class GNMTRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    # global_batch_size is in sentences (the reference: 128 per process).
    bpe_merges: int = gnmt_data.FULL_MERGES  # names the data files read (train.tok.clean.bpe.<merges>.en, ...)
    hidden: Count = 1024
    dropout: Fraction = 0.2
    label_smoothing: Fraction = 0.1
    init_scale: Positive = 0.1  # every parameter uniform in [-init_scale, init_scale]
    # The attention's normalisation scalar starts at attention_scale (0: the reference's 1/sqrt(hidden)).
    attention_scale: float = 0.0
    forget_bias: float = 0.0  # the LSTMs' forget-gate bias at start (the reference: uniform like the rest)
    # Adam; exponential warmup from 1 % over warmup_steps, held until remain_fraction of all the run's
    # iterations, then decay_steps multiplications by decay_factor at equal intervals (the reference).
    base_lr: Positive = 2e-3
    warmup_steps: int = 200
    remain_fraction: Share = 0.666
    decay_steps: int = 4
    decay_factor: Share = 0.5
    buckets: Count = 5  # length buckets of the batching sampler
    beam: Count = 5
    alpha: Positive = 0.6  # length normalisation ((lp_constant + length) / (lp_constant + 1)) ** alpha
    lp_constant: float = 5.0
    coverage: float = 0.1  # coverage penalty weight
    max_decode_length: Count = 150
    eval_batch_size: Count = 128

    def validate(self) -> None:
        super().validate()
        if min(self.hidden, self.beam, self.eval_batch_size, self.buckets, self.max_decode_length) < 1:
            raise TrainperfError("recipe: need hidden, beam, eval_batch_size, buckets, max_decode_length >= 1")
        if not 0 <= self.dropout < 1 or not 0 <= self.label_smoothing < 1 or not 0 < self.remain_fraction <= 1:
            raise TrainperfError("recipe: need 0 <= dropout < 1, 0 <= label_smoothing < 1, 0 < remain_fraction <= 1")
        if self.base_lr <= 0 or self.warmup_steps < 0 or self.decay_steps < 0 or not 0 < self.decay_factor <= 1:
            raise TrainperfError("recipe: need base_lr > 0, warmup_steps >= 0, decay_steps >= 0, 0 < decay_factor <= 1")


# The reference's run: 128 sentences per GPU on 8 GPUs, LR 2e-3, 8 epochs at most, gradient clipping 5.
FULL = GNMTRecipe(name="reference", global_batch_size=8 * 128, max_epochs=8, target=0.24, eval_every=1,
                  eval_first=1, max_grad_norm=5.0)
# The mini: hidden 128; at this size the reference's 1/sqrt(hidden) attention scale and zero forget-gate
# bias left training stalled for epochs (a probe on this machine), so both are recipe deviations here;
# 10 length buckets instead of 5 halve the padding of the short mini sentences (20.8 % -> 10.9 %).
# Dropout 0.1 and Adam 5e-3 with a 4-epoch budget (the decay starts at 66.6 % of it) reached BLEU 0.47
# at epoch 3 in probes; dropout 0.2 / 3e-3 over 8 epochs 0.35, no dropout 0.33, 8e-3 0.24.
MINI = GNMTRecipe(name="mini", bpe_merges=gnmt_data.MINI_MERGES, global_batch_size=128, max_epochs=4, target=0.35,
                  eval_every=1, eval_first=1, max_grad_norm=5.0, hidden=128, dropout=0.1, attention_scale=1.0,
                  forget_bias=1.0, base_lr=5e-3, warmup_steps=100, eval_batch_size=250, max_decode_length=80,
                  buckets=10)


def schedule_steps(recipe: GNMTRecipe, steps_per_epoch: int) -> tuple[int, int]:
    """(remain steps, decay interval) in iterations, as the reference derives them from the run's total."""
    total = recipe.max_epochs * steps_per_epoch
    remain = int(recipe.remain_fraction * total)
    interval = max(1, (total - remain) // max(1, recipe.decay_steps))
    return remain, interval


def lr_factor(recipe: GNMTRecipe, steps_per_epoch: int) -> Callable[[int], float]:
    remain, interval = schedule_steps(recipe, steps_per_epoch)
    warm = recipe.warmup_steps
    base = math.exp(math.log(0.01) / warm) if warm else 1.0

    def factor(step: int) -> float:
        if step <= warm:
            return base ** (warm - step)
        if step >= remain:
            return recipe.decay_factor ** min((step - remain) // interval + 1, recipe.decay_steps)
        return 1.0

    return factor


class GNMTWorkload(Workload[GNMTRecipe]):
    name = "gnmt"
    full_eval_forwards = 3_003
    full_eval_samples = 3_003
    benchmark = "gnmt"
    ruleset = "0.7.0"
    metric = Metric("bleu", higher_is_better=True)
    summary = "GNMT v2 on WMT16 en-de, BLEU (mini: a synthetic English -> German-like corpus, BPE'd as WMT16)"
    mlperf_runs = 10
    speedups = frozenset({"precision", "fused_optimizer", "async_eval"})
    step_probe = ("global_batch_size=4",)
    host_scoring = "process"  # sacrebleu and Moses detokenization are pure Python
    loss_units_name = "target tokens"

    def recipes(self, scale: str) -> dict[str, GNMTRecipe]:
        return {"mini": MINI} if scale == "mini" else {"reference": FULL}

    def eval_set(self, scale: str, data_dir: Path) -> tuple[Path, int] | None:
        from trainperf.workloads.common.wmt.text import read_lines

        return data_dir / "newstest2014.de", len(read_lines(data_dir / "newstest2014.de"))

    def sources(self, scale: str, data_dir: Path) -> dict[str, Path]:
        return gnmt_data.sources(scale, data_dir)

    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        return gnmt_data.problems(scale, data_dir)

    def prepare(self, scale: str, data_dir: Path, say: Callable[[str], None]) -> None:
        gnmt_data.prepare(scale, data_dir, say)

    def mlperf_hyperparameters(self, recipe: GNMTRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_base_learning_rate": recipe.base_lr, "opt_learning_rate_warmup_steps": recipe.warmup_steps,
            "opt_learning_rate_alt_warmup_func": False, "opt_learning_rate_alt_decay_func": False,
            "opt_learning_rate_decay_factor": recipe.decay_factor, "opt_learning_rate_decay_steps": recipe.decay_steps,
            "max_sequence_length": gnmt_data.MAX_LENGTH,
        }

    def assets(self, recipe: GNMTRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The model is sized by the vocabulary file; a synthetic benchmark without data uses 32,320
        # (the reference's 32,000-merge vocabulary with its specials, padded to a multiple of 8).
        if data_dir is None:
            return {}
        return {"vocabulary": gnmt_data.sources("", data_dir, recipe.bpe_merges)["vocab"]}

    def build(self, recipe: GNMTRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        vocab = len(gnmt_data.read_vocabulary(assets["vocabulary"])) if "vocabulary" in assets else 32_320
        vocab = -(-vocab // 8) * 8  # padded to a multiple of 8, as the reference does for tensor cores
        model = gnmt_model.GNMT(vocab, recipe.hidden, recipe.dropout, recipe.init_scale, recipe.attention_scale or None,
                       recipe.forget_bias).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.base_lr, **impl)

        def loss_fn(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
            src, tgt_in, tgt_out, src_lengths = batch
            logits = model(src, tgt_in, src_lengths)
            total = F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD,
                                    label_smoothing=recipe.label_smoothing, reduction="sum")
            return total / src.shape[0]  # the reference normalises by sentences

        def forward(model: nn.Module, src: torch.Tensor) -> list[list[int]]:
            return gnmt_model.translate(bare_model(model), src, recipe.beam, recipe.alpha, recipe.lp_constant,
                               recipe.coverage, recipe.max_decode_length)

        def epoch_hyperparameters(steps_per_epoch: int | None) -> dict[str, Any]:
            remain, interval = schedule_steps(recipe, steps_per_epoch or 0)
            return {"opt_learning_rate_remain_steps": remain, "opt_learning_rate_decay_interval": interval}

        def schedule(steps_per_epoch: int | None) -> Callable[[int], float]:
            if not steps_per_epoch:
                raise TrainperfError("gnmt: the LR schedule is in fractions of the run and needs the steps per epoch")
            return lr_factor(recipe, steps_per_epoch)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward,
                          lr_schedule=schedule, epoch_hyperparameters=epoch_hyperparameters)

    def synthetic_batch(self, recipe: GNMTRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        # 30 tokens: a typical WMT16 sentence in BPE tokens.
        return wmt_parts.synthetic_training_batch(recipe.global_batch_size // ctx.world_size, 30,
                                          bare_model(model).embed.num_embeddings, ctx.device, source_lengths=True)

    def synthetic_eval_batch(self, recipe: GNMTRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return wmt_parts.random_tokens(min(recipe.eval_batch_size, 8), 8, bare_model(model).embed.num_embeddings,
                               ctx.device, 2)

    def load_data(self, recipe: GNMTRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        data = gnmt_data.load(recipe.bpe_merges, data_dir)
        src_len, tgt_len = data.train_src.lengths + 1, data.train_tgt.lengths + 1
        device, world, rank = ctx.device, ctx.world_size, ctx.rank
        seed = ctx.stream_seed("batches")

        def epoch_batches(epoch: int) -> list[np.ndarray]:
            found = batching.bucketed_batches(src_len, tgt_len, recipe.global_batch_size, recipe.buckets,
                                              np.random.default_rng([seed, epoch]))
            return [b for b in found if len(b) >= world]

        first = epoch_batches(1)

        def train_batches(view: EpochView) -> Iterator[tuple[Any, ...]]:
            for rows in epoch_batches(view.epoch):
                yield wmt_parts.training_batch(data.train_src, data.train_tgt, batching.shard(rows, rank, world),
                                               device,
                                       source_lengths=True)

        order = wmt_parts.test_share(data.test_src.lengths, rank, world)
        metric = bleu.metric(data.test_references, "gnmt")
        detokenize = gnmt_data.Detokenizer(data.vocab)

        def evaluate(forward: Callable[[Any], list[list[int]]]) -> EvalPartial:
            found = wmt_parts.translate_share(data.test_src, order, recipe.eval_batch_size, forward,
                                      lambda ids: [detokenize(x) for x in ids], device)
            return EvalPartial(metric=metric, objects={"translations": found})

        return DataParts(train_batches=train_batches, steps_per_epoch=len(first),
                         train_samples=sum(len(b) for b in first), eval_samples=len(data.test_src), evaluate=evaluate)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = GNMTWorkload
