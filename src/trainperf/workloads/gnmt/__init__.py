"""GNMT v2 on WMT16 English-German (MLPerf key `gnmt`, ruleset 0.7.0), and its mini scale on the
synthetic English -> German-like corpus prepared as the reference prepares WMT16. BLEU on newstest2014
by sacrebleu with the reference's settings, scored off the training path."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    EpochView,
    EvalPartial,
    GoldenSpec,
    LengthBuckets,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
    bare_model,
)
from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.workloads.common.wmt import batching, bleu
from trainperf.workloads.common.wmt import parts as wmt_parts
from trainperf.workloads.common.wmt.text import PAD
from trainperf.workloads.gnmt import data as gnmt_data
from trainperf.workloads.gnmt import model as gnmt_model
from trainperf.workloads.gnmt.recipes import FULL_RECIPES, MINI, GNMTRecipe


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
    mlperf = MLPerf(ruleset="0.7.0", runs=10, full_eval_forwards=3_003, full_eval_samples=3_003)
    benchmark = "gnmt"
    metric = Metric("bleu", higher_is_better=True)
    summary = "GNMT v2 on WMT16 en-de, BLEU (mini: a synthetic English -> German-like corpus, BPE'd as WMT16)"
    speedups = frozenset({"precision", "fused_optimizer", "async_eval", "static_shapes", "compile", "cuda_graphs"})
    # Beam-search BLEU over the test set takes 20 s on one thread: the steps alone (decoding is tested apart).
    golden = GoldenSpec(evaluate=False)
    step_probe = ("global_batch_size=4",)
    # torch's packing synced 8 times; the permutation, made on the host, was a blocking copy until issue 62
    step_budget = StepBudget(ops=1_230)
    device_probe = DeviceProbe(batch=128)
    real_layout = ("train.tok.clean.bpe.32000.en", "newstest2014.tok.bpe.32000.de")
    host_scoring = "process"  # sacrebleu and Moses detokenization are pure Python
    loss_units_name = "target tokens"

    mini = Scale(MINI, gnmt_data.WMT16(gnmt_data.MINI_MERGES, generated=True))
    full = Scale(FULL_RECIPES, gnmt_data.WMT16(gnmt_data.FULL_MERGES))

    def mlperf_hyperparameters(self, recipe: GNMTRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_base_learning_rate": recipe.base_lr, "opt_learning_rate_warmup_steps": recipe.warmup_steps,
            # The exponential warmup and the step decay after remain_steps are the "alternative" functions
            # of the v0.6+ rules (NVIDIA's v0.7 logs, same schedule: true); the v0.5 reference had neither.
            "opt_learning_rate_alt_warmup_func": True, "opt_learning_rate_alt_decay_func": True,
            "opt_learning_rate_decay_factor": recipe.decay_factor, "opt_learning_rate_decay_steps": recipe.decay_steps,
            "max_sequence_length": gnmt_data.MAX_LENGTH,
        }

    def assets(self, recipe: GNMTRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The model is sized by the vocabulary file; a synthetic benchmark without data uses 32,320
        # (the reference's 32,000-merge vocabulary with its specials, padded to a multiple of 8).
        if data_dir is None:
            return {}
        return {"vocabulary": gnmt_data.sources(data_dir, recipe.bpe_merges)["vocab"]}

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
            if isinstance(src_lengths, torch.Tensor):  # a bucketed batch: its empty rows are no sentences
                return total / (tgt_out != PAD).any(1).sum().clamp(min=1)
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

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward, eval_compiles=False,
                          lr_schedule=schedule, epoch_hyperparameters=epoch_hyperparameters)

    def synthetic_batch(self, recipe: GNMTRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        # 30 tokens: a typical WMT16 sentence in BPE tokens.
        return wmt_parts.synthetic_training_batch(ctx.batch_share(recipe.global_batch_size), 30,
                                          bare_model(model).embed.num_embeddings, ctx.device, source_lengths=True)

    def shape_buckets(self, recipe: GNMTRecipe) -> dict[str, Any] | None:
        if not recipe.bucketed:
            return None
        return LengthBuckets.from_recipe("bucket_lengths", recipe.bucket_lengths).describe(
            rows=f"global_batch_size ({recipe.global_batch_size} sentences), shared by the processes",
            padding="PAD columns; empty rows (source EOS, target PAD) outside the loss and its sentence count; "
                    "the encoder unpacked")

    def synthetic_batches(self, recipe: GNMTRecipe, ctx: RuntimeContext, model: nn.Module) -> list[Any]:
        if not recipe.bucketed:
            return [self.synthetic_batch(recipe, ctx, model)]
        return [wmt_parts.synthetic_training_batch(ctx.batch_share(recipe.global_batch_size), length,
                                                   bare_model(model).embed.num_embeddings, ctx.device,
                                                   source_lengths="tensor")
                for length in recipe.bucket_lengths]

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
        buckets = LengthBuckets.from_recipe("bucket_lengths", recipe.bucket_lengths) if recipe.bucketed else None
        longest = int(max(src_len.max(initial=0), tgt_len.max(initial=0)))
        if buckets is not None and longest > buckets.longest:
            raise TrainperfError(f"recipe field bucket_lengths: the longest bucket ({buckets.longest}) is shorter than "
                                 f"a training sentence of {longest} tokens in {data_dir}")

        def shape(rows: np.ndarray) -> tuple[int, int] | None:
            if buckets is None:
                return None
            return recipe.global_batch_size // world, buckets.length(int(max(src_len[rows].max(), tgt_len[rows].max())))

        def train_batches(view: EpochView) -> Iterator[tuple[Any, ...]]:
            for rows in epoch_batches(view.epoch):
                yield wmt_parts.training_batch(data.train_src, data.train_tgt, batching.shard(rows, rank, world),
                                               device, source_lengths=True, shape=shape(rows))

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
