"""Transformer-big on WMT17 English-German (MLPerf key `transformer`, ruleset 0.7.0), and its mini scale on
a synthetic English -> German-like corpus in the same text layout. BLEU on newstest2014 by sacrebleu,
set to reproduce the reference's scorer, scored off the training path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

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
    Logged,
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
from trainperf.workloads.transformer import data as transformer_data
from trainperf.workloads.transformer import model as transformer_model
from trainperf.workloads.transformer.recipes import FULL, MINI, REFERENCE_TOKENS, TransformerRecipe


def lr_factor(recipe: TransformerRecipe) -> Callable[[int], float]:
    warmup = recipe.warmup_steps

    def factor(step: int) -> float:
        n = step + 1
        return min(n / warmup, (warmup / n) ** 0.5)

    return factor


class TransformerWorkload(Workload[TransformerRecipe]):
    name = "transformer"
    mlperf = MLPerf(ruleset="0.7.0", runs=10, full_epoch_samples=4_590_101, full_eval_forwards=3_003,
                    full_eval_samples=3_003)
    benchmark = "transformer"
    metric = Metric("bleu", higher_is_better=True)
    summary = "Transformer-big on WMT17 en-de, BLEU (mini: a synthetic English -> German-like corpus)"
    speedups = frozenset({"precision", "fp8", "fused_optimizer", "async_eval", "static_shapes", "compile",
                          "cuda_graphs"})
    # Beam-search BLEU over the test set takes 20 s on one thread: the steps alone (decoding is tested apart).
    golden = GoldenSpec(evaluate=False)
    # Two of the 6 encoder and 6 decoder layers (the same operators per layer).
    step_probe = ("global_batch_size=256", "encoder_layers=2", "decoder_layers=2")
    # 1,153 at 2 + 2 layers (3,245 at 6 + 6)
    step_budget = StepBudget(ops=1_270)
    # tokens
    device_probe = DeviceProbe(batch=8192)
    real_layout = ("wmt32k-train-00001-of-00100", "newstest2014.de")
    host_scoring = "process"  # sacrebleu is pure Python
    loss_units_name = "target tokens"
    scorer: ClassVar[str] = "transformer"

    mini = Scale(MINI, transformer_data.WMT17(transformer_data.MINI_VOCAB, generated=True))
    full = Scale(FULL, transformer_data.WMT17(transformer_data.FULL_VOCAB))

    def mlperf_hyperparameters(self, recipe: TransformerRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_name": "adam", "opt_base_learning_rate": recipe.base_lr,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps, "opt_adam_beta_1": recipe.beta1,
            "opt_adam_beta_2": recipe.beta2, "opt_adam_epsilon": recipe.eps,
            "max_sequence_length": Logged(transformer_data.MAX_LENGTH, {"method": "discard"}),
        }

    def notes(self, recipe: TransformerRecipe, scale: str) -> list[str]:
        if scale != "full" or recipe.global_batch_size == REFERENCE_TOKENS:
            return []
        return [f"recipe {recipe.name}: {recipe.global_batch_size:,} tokens a step, but its learning rate and "
                f"warmup ({recipe.warmup_steps:,} steps) are the reference's single-process run's, tuned for "
                f"{REFERENCE_TOKENS:,} tokens a step: not rescaled for this batch"]

    def assets(self, recipe: TransformerRecipe, data_dir: Path | None) -> dict[str, Path]:
        # The model is sized by the prepared vocabulary; a synthetic benchmark without data uses the
        # reference model's vocabulary size.
        return {} if data_dir is None else {"vocabulary": data_dir / transformer_data.PREPARED / "spm.model"}

    def build(self, recipe: TransformerRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        from trainperf.workloads.common.wmt.text import Vocabulary

        vocab = (len(Vocabulary(assets["vocabulary"])) if "vocabulary" in assets
                 else transformer_data.REFERENCE_MODEL_VOCAB)
        positions = transformer_data.MAX_LENGTH + recipe.extra_length + 1  # the longest source's translation, BOS first
        model = transformer_model.Transformer(vocab, recipe.dim, recipe.heads, recipe.ffn, recipe.encoder_layers,
                              recipe.decoder_layers, recipe.dropout, max_positions=positions).to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2),
                                     eps=recipe.eps, **impl)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            src, tgt_in, tgt_out = batch
            logits = model(src, tgt_in)
            return F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD,
                                   label_smoothing=recipe.label_smoothing, reduction="sum")

        def forward(model: nn.Module, src: torch.Tensor) -> list[list[int]]:
            return transformer_model.translate(bare_model(model), src, recipe.beam, recipe.alpha, recipe.extra_length)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward, eval_compiles=False,
                          lr_schedule=lambda steps: lr_factor(recipe),
                          loss_units=lambda batch: (batch[2] != PAD).sum())

    def synthetic_batch(self, recipe: TransformerRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        length = 32  # a typical WMT sentence in subwords
        rows = max(1, ctx.batch_share(recipe.global_batch_size) // length)
        return wmt_parts.synthetic_training_batch(rows, length, bare_model(model).embed.num_embeddings, ctx.device)

    def shape_buckets(self, recipe: TransformerRecipe) -> dict[str, Any] | None:
        if not recipe.bucketed:
            return None
        return recipe.buckets.describe(
            rows=f"global_batch_size // length ({recipe.global_batch_size} tokens), shared by the processes",
            padding="PAD columns; empty rows (source EOS, target PAD); PAD targets are outside the loss")

    def synthetic_batches(self, recipe: TransformerRecipe, ctx: RuntimeContext, model: nn.Module) -> list[Any]:
        if not recipe.bucketed:
            return [self.synthetic_batch(recipe, ctx, model)]
        vocab = bare_model(model).embed.num_embeddings
        buckets = recipe.buckets
        return [wmt_parts.synthetic_training_batch(
                    ctx.batch_share(buckets.rows(length, recipe.global_batch_size, ctx.data_world)), length, vocab,
                    ctx.device)
                for length in buckets.lengths]

    def synthetic_eval_batch(self, recipe: TransformerRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return wmt_parts.random_tokens(min(recipe.eval_batch_size, 8), 8, bare_model(model).embed.num_embeddings,
                               ctx.device, 2)

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])

    def load_data(self, recipe: TransformerRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        data = transformer_data.load(data_dir)
        src_len, tgt_len = transformer_data.lengths_for_budget(data)
        device = ctx.device
        world, rank = ctx.world_size, ctx.rank
        seed = ctx.stream_seed("batches")
        buckets = recipe.buckets if recipe.bucketed else None
        if buckets is not None:
            # Batched by their buckets' lengths: a batch's rows x its bucket then fit the token budget.
            try:
                src_len, tgt_len = buckets.of(src_len), buckets.of(tgt_len)
            except ValueError as exc:
                raise TrainperfError(f"recipe field bucket_lengths: {exc} in {data_dir}") from None

        def epoch_batches(epoch: int) -> list[np.ndarray]:
            rng = np.random.default_rng([seed, epoch])
            found = batching.token_batches(src_len, tgt_len, recipe.global_batch_size, rng, multiple=world)
            return [b for b in found if len(b) >= world]  # a process never gets an empty share

        def shape(rows: np.ndarray) -> tuple[int, int] | None:
            if buckets is None:
                return None
            length = int(max(src_len[rows].max(), tgt_len[rows].max()))
            return buckets.rows(length, recipe.global_batch_size, world) // world, length

        # The cut into batches depends only on the sorted lengths: the same batches' sizes every epoch.
        first = epoch_batches(1)
        steps, per_epoch = len(first), sum(len(b) for b in first)

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            for rows in epoch_batches(view.epoch):
                yield wmt_parts.training_batch(data.train_src, data.train_tgt, batching.shard(rows, rank, world),
                                               device, shape=shape(rows))

        order = wmt_parts.test_share(data.test_src.lengths, rank, world)
        metric = bleu.metric(data.test_references, self.scorer)

        def evaluate(forward: Callable[[Any], list[list[int]]]) -> EvalPartial:
            # Sources are cut to the model's positions (newstest2014 has none this long).
            found = wmt_parts.translate_share(data.test_src, order, recipe.eval_batch_size, forward, data.vocab.decode,
                                      device, max_source=transformer_data.MAX_LENGTH)
            return EvalPartial(metric=metric, objects={"translations": found})

        return DataParts(train_batches=train_batches, steps_per_epoch=steps, train_samples=per_epoch,
                         eval_samples=len(data.test_src), evaluate=evaluate)


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = TransformerWorkload
