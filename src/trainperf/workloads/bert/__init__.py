"""BERT-Large phase-2 pretraining (MLPerf key `bert`, ruleset 1.0.0): from the phase-1 checkpoint to
masked-LM accuracy 0.720 on the 10,000 held-out sequences, evaluated every N training samples by the
v1.0 formula. Mini: a small BERT from a phase-1 checkpoint shipped in the package, on the standard
library's English in the same HDF5 format, to a calibrated accuracy."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainperf.contract import (
    Assets,
    DataParts,
    DeviceProbe,
    EpochView,
    EvalPartial,
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
from trainperf.optim import LAMB, multi_tensor
from trainperf.workloads.bert import batches as bert_batches
from trainperf.workloads.bert import data as bert_data
from trainperf.workloads.bert import model as bert_model
from trainperf.workloads.bert.recipes import FULL_RECIPES, MINI, BertRecipe


def checkpoint_manifest() -> dict[str, Any]:
    path = bert_data.PACKAGE / "phase1.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainperfError(f"{path}: cannot read the mini phase-1 manifest ({exc})") from None


class BertWorkload(Workload[BertRecipe]):
    name = "bert"
    mlperf = MLPerf(ruleset="1.0.0", runs=10, rcp_in_samples=True, full_eval_forwards=10_000, full_eval_samples=10_000)
    benchmark = "bert"
    # The RCP checker reads convergence in training samples (its bert mode): NVIDIA's published logs put
    # the pass count, not samples, in eval_accuracy's epoch_num.
    metric = Metric("mlm_accuracy", higher_is_better=True)
    summary = ("BERT-Large phase 2 from the phase-1 checkpoint, masked-LM accuracy (mini: a small BERT from a "
               "shipped checkpoint on the standard library's docstrings)")
    speedups = frozenset({"precision", "fp8", "compile", "cuda_graphs", "fused_optimizer", "packing",
                          "async_eval", "regional_compile"})
    # Two of the 24 encoder layers (the same operators per layer; the whole model's init and LAMB over 340 M
    # parameters took 98 s of a 2-core CPU for the same verdict).
    step_probe = ("global_batch_size=2", "max_seq_length=128", "max_predictions=20", "checkpoint=none",
                  "model.layers=2")
    # 579 at 2 layers (4,781 at 24; 10,527 with the per-tensor LAMB)
    step_budget = StepBudget(ops=640)
    device_probe = DeviceProbe(batch=32, switches=("--packing",))
    real_layout = ("hdf5/eval_10k/eval.tfrecord", "phase1/model.ckpt-28252.index")

    mini = Scale(MINI, bert_data.MiniCorpus())
    full = Scale(FULL_RECIPES, bert_data.WikipediaShards())

    def mlperf_hyperparameters(self, recipe: BertRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "opt_base_learning_rate": recipe.base_lr, "opt_epsilon": recipe.eps,
            "opt_learning_rate_training_steps": recipe.train_steps,
            "opt_learning_rate_warmup_steps": recipe.warmup_steps, "num_warmup_steps": recipe.warmup_steps,
            "start_warmup_step": recipe.start_warmup_step, "opt_lamb_beta_1": recipe.beta1,
            "opt_lamb_beta_2": recipe.beta2, "opt_lamb_weight_decay_rate": recipe.weight_decay,
            # Not required by the rules, logged by the reference and NVIDIA's code (lr_factor's power).
            "opt_lamb_learning_rate_decay_poly_power": 1.0, "max_predictions_per_seq": recipe.max_predictions,
        }

    def assets(self, recipe: BertRecipe, data_dir: Path | None) -> dict[str, Path]:
        found = {}
        if recipe.checkpoint == "shipped":
            found["phase-1 checkpoint"] = bert_data.PACKAGE / "phase1.pt"
            found["mini vocabulary"] = bert_data.PACKAGE / "vocab.txt"
        elif recipe.checkpoint not in ("", "none"):
            found["phase-1 checkpoint"] = Path(recipe.checkpoint).expanduser()
        elif recipe.checkpoint == "" and data_dir is not None:
            found["phase-1 checkpoint"] = data_dir / bert_data.FULL_CHECKPOINT
        if recipe.checkpoint != "shipped" and data_dir is not None and (data_dir / "vocab.txt").is_file():
            found["vocabulary"] = data_dir / "vocab.txt"
        return found

    def notes(self, recipe: BertRecipe, scale: str) -> list[str]:
        if recipe.packing:
            return ["packing=true: several sequences share a row (block-diagonal attention); the sample count, "
                    "cadence and budget stay in sequences"]
        return []

    def check_assets(self, recipe: BertRecipe, assets: Assets) -> None:
        if "phase-1 checkpoint" in assets and "mini vocabulary" in assets:
            verify_mini_checkpoint(assets["phase-1 checkpoint"], assets["mini vocabulary"])

    def build(self, recipe: BertRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        cfg = dataclasses.replace(recipe.model, max_positions=max(recipe.model.max_positions, recipe.max_seq_length))
        state = None
        if "phase-1 checkpoint" in assets:
            where = assets["phase-1 checkpoint"]
            if "mini vocabulary" in assets:
                verify_mini_checkpoint(where, assets["mini vocabulary"])
            state = bert_model.normalize_state_dict(assets.state_dict("phase-1 checkpoint"))
            found = bert_model.config_from_state_dict(state, cfg.heads, cfg.dropout, str(where))
            cfg = dataclasses.replace(cfg, vocab_size=found.vocab_size, max_positions=found.max_positions)
            for key in ("hidden", "layers", "intermediate"):
                if getattr(found, key) != getattr(cfg, key):
                    raise TrainperfError(f"{where}: the checkpoint's {key} is {getattr(found, key)}, the recipe's "
                                         f"{getattr(cfg, key)} (--set {key}=… or another checkpoint)")
        for name in ("vocabulary", "mini vocabulary"):
            if name in assets:
                words = len(bert_data.corpus.read_vocabulary(assets[name]))
                if words != cfg.vocab_size:
                    raise TrainperfError(f"{assets[name]}: {words} words, the checkpoint's embeddings have "
                                         f"{cfg.vocab_size} rows (a vocabulary of another model)")
        torch.manual_seed(ctx.stream_seed("init"))
        model = bert_model.BertForPreTraining(cfg)
        if state is not None:
            bert_model.load_checkpoint(model, state, str(assets["phase-1 checkpoint"]))
        model = model.to(ctx.device)
        optimizer = LAMB(bert_model.parameter_groups(model, recipe.weight_decay), lr=recipe.base_lr,
                         betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
                         foreach=multi_tensor(recipe.fused_optimizer))
        schedule = bert_model.lr_factor(recipe.base_lr, recipe.warmup_steps, recipe.start_warmup_step,
                                        recipe.train_steps)

        def loss_fn(model: nn.Module, batch: bert_batches.PretrainingBatch) -> torch.Tensor:
            return bert_model.pretraining_loss(model(batch.tensors), batch.tensors)

        def forward(model: nn.Module, batch: bert_batches.PretrainingBatch) -> torch.Tensor:
            mlm, _nsp = model(batch.tensors)
            return bert_model.mlm_correct(mlm, batch.tensors["masked_lm_ids"])

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=forward,
                          lr_schedule=lambda steps: schedule,
                          regions=tuple(m for m in model.modules() if isinstance(m, bert_model.Layer)))

    def _rows_per_process(self, recipe: BertRecipe, ctx: RuntimeContext) -> int:
        return ctx.batch_share(recipe.global_batch_size)

    def _collate(self, recipe: BertRecipe, rows: dict[str, np.ndarray],
                 device: torch.device) -> bert_batches.PretrainingBatch:
        if recipe.packing:
            return bert_batches.packed(rows, device, recipe.max_per_row)
        return bert_batches.plain(rows, device)

    def synthetic_batch(self, recipe: BertRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        vocab = bare_model(model).config.vocab_size
        rows = bert_batches.random_rows(self._rows_per_process(recipe, ctx), recipe.max_seq_length,
                                        recipe.max_predictions,
                             vocab, np.random.default_rng(ctx.stream_seed("synthetic")))
        return self._collate(recipe, rows, ctx.device)

    def synthetic_eval_batch(self, recipe: BertRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        vocab = bare_model(model).config.vocab_size
        rows = bert_batches.random_rows(min(recipe.eval_batch_size, 8), recipe.max_seq_length,
                                        recipe.max_predictions, vocab,
                             np.random.default_rng(ctx.stream_seed("synthetic eval")))
        return bert_batches.plain(rows, ctx.device)

    def batch_samples(self, batch: Any) -> int:
        return batch.samples

    def split_batch(self, batch: Any, parts: int) -> list[Any]:
        return batch.split(parts)

    def load_data(self, recipe: BertRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        listed = bert_data.training_shards(data_dir)
        stream = bert_data.ShardStream(listed, ctx.rank, ctx.world_size, self._rows_per_process(recipe, ctx),
                               ctx.stream_seed("shards"))
        device = ctx.device
        evaluation = bert_data.read_eval(data_dir)
        n_eval = len(evaluation["input_ids"])
        share = ctx.shard(n_eval)
        eval_batches = [bert_batches.plain({k: v[s: min(s + recipe.eval_batch_size, share.stop)] for k,
                                            v in evaluation.items()},
                        device) for s in range(share.start, share.stop, recipe.eval_batch_size)]

        def train_batches(view: EpochView) -> Iterator[bert_batches.PretrainingBatch]:
            for rows in stream.batches(view.epoch, cache=recipe.cache_shards):
                yield self._collate(recipe, rows, device)

        def evaluate(forward: Callable[[Any], torch.Tensor]) -> EvalPartial:
            total = torch.zeros(2, dtype=torch.float64, device=device)
            for batch in eval_batches:
                total += forward(batch)
            return EvalPartial(metric=_accuracy, sums={"counts": total})

        # train_samples is left to the harness (the samples trained, logged at run_stop, as NVIDIA's
        # BERT and the RCP checker's bert mode read it).
        return DataParts(train_batches=train_batches, steps_per_epoch=stream.steps, train_samples=None,
                         eval_samples=n_eval, evaluate=evaluate)


    def make(self, command: str, out: Path, say: Callable[[str], None], options: dict[str, Any]) -> None:
        """`trainperf make-phase1`: the mini's shipped phase-1 checkpoint (see phase1.py)."""
        from trainperf.workloads.bert.phase1 import make_phase1

        make_phase1(out, options["steps"], say, seed=options["seed"])


def _accuracy(combined: dict[str, Any]) -> float:
    correct, count = combined["counts"].tolist()
    if count <= 0:
        raise TrainperfError("bert evaluation: no masked positions in the evaluation set")
    return correct / count


def verify_mini_checkpoint(checkpoint: Path, vocab: Path) -> None:
    """The shipped phase-1 checkpoint and vocabulary are the ones its manifest names (SHA-256)."""
    manifest = checkpoint_manifest()
    for path, key in ((checkpoint, "checkpoint_sha256"), (vocab, "vocab_sha256")):
        if path.parent == bert_data.PACKAGE and bert_data.sha256(path) != manifest.get(key):
            raise TrainperfError(f"{path}: SHA-256 differs from {bert_data.PACKAGE / 'phase1.json'} (a damaged or "
                                 "replaced file: the mini's target was calibrated with the shipped one; reinstall "
                                 "trainperf)")


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = BertWorkload
# The assets `trainperf make-*` builds for it (registry.py reads this literal; nothing is imported).
MAKES = {"make-phase1": {"help": "train the mini BERT's phase-1 checkpoint (shipped in the package)",
                         "out": "bert-phase1", "files": "vocab.txt, phase1.pt, phase1.json", "steps": 6000, "seed": 1,
                         "what": "phase-1 training"}}
