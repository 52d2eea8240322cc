"""RNN-T's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs, LibriSpeech 960 h)
and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainperf.contract import LengthBuckets, Recipe
from trainperf.contract.fields import Count, Fraction, Positive, Share
from trainperf.errors import TrainperfError
from trainperf.workloads.rnnt import data as rnnt_data
from trainperf.workloads.rnnt import model as rnnt_model
from trainperf.workloads.rnnt.features import FeatureConfig, max_frames
from trainperf.workloads.rnnt.loss import torchaudio_rnnt_loss


@dataclass(frozen=True)
class RNNTRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_epochs",)
    # global_batch_size in utterances; LAMB with the reference's policy (model.lr_factor).
    base_lr: Positive = 4e-3
    beta1: Fraction = 0.9
    beta2: Fraction = 0.999
    eps: Positive = 1e-9
    weight_decay: float = 1e-3
    warmup_epochs: int = 6
    hold_epochs: int = 40
    decay: Share = 0.935  # per epoch after warmup + hold (logged as opt_lamb_learning_rate_decay_poly_power)
    min_lr: float = 1e-5
    ema: Fraction = 0.999  # the evaluation model's weights: an exponential moving average
    # The network (`--set model.enc_hidden=…` or `--set enc_hidden=…`); model.pieces is also which
    # sentencepiece model the data uses (librispeech<pieces>.model), and model.init_scale the RCPs'
    # model_weights_initialization_scale.
    model: rnnt_model.RNNTConfig = rnnt_model.RNNTConfig(init_scale=0.5)
    # data
    train_subsets: str = ",".join(rnnt_data.FULL_TRAIN)
    max_duration: Positive = 16.7  # seconds; longer training utterances are dropped
    buckets: Count = 6
    in_memory: bool = False  # keep decoded training audio in memory after its first read
    loader_threads: Count = 8  # FLAC decoding threads (libsndfile releases the GIL)
    eval_batch_size: Count = 64
    max_symbols: Count = 300  # greedy decoding's cap per utterance
    # The shape of `bench --synthetic` batches: a mean LibriSpeech training utterance (12.3 s, ~70 of
    # the 1,023 pieces); the mini's are 1.2 s and 3 pieces.
    synthetic_seconds: Positive = 12.3
    synthetic_pieces: Count = 70
    # The transducer loss: "wavefront" (trainperf's, in PyTorch: T + U steps of small kernels), or
    # "torchaudio" (torchaudio.functional.rnnt_loss: one CUDA kernel per pass, where torchaudio is
    # installed; it has no build for every torch).
    loss_impl: str = "wavefront"
    # The joint network and the loss over this many slices of the batch, recomputed in the backward
    # pass: the B x T x U x V logits (GBs at full size) exist one slice at a time, for a larger batch.
    joint_chunks: Count = 1
    # --static-shapes (and --cuda-graphs): each batch's feature frames (before the encoder's time stacking) and
    # labels padded up to these, one graph per pair; the longest frame bucket holds max_duration slowed by
    # the slowest speed perturbation (16.7 s / 0.85: 655 frames).
    bucket_frames: tuple[int, ...] = (64, 128, 256, 512, 656)
    bucket_labels: tuple[int, ...] = (16, 32, 64, 128, 256)

    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {"loss_impl": ("wavefront", "torchaudio")}

    def validate(self) -> None:
        super().validate()
        features = FeatureConfig()
        if self.model.features != features.mels * features.stack:
            raise TrainperfError(f"recipe field model.features={self.model.features}: the featurizer gives "
                                 f"{features.mels * features.stack} ({features.mels} log-mel bands, "
                                 f"{features.stack} frames stacked)")
        if self.loss_impl == "torchaudio":
            torchaudio_rnnt_loss()  # says at --set, not at the first step, when it cannot be had
        frames = LengthBuckets.from_recipe("bucket_frames", self.bucket_frames)
        LengthBuckets.from_recipe("bucket_labels", self.bucket_labels)
        if any(n % self.model.stack_time for n in frames.lengths):
            raise TrainperfError(f"recipe field bucket_frames: each a multiple of model.stack_time "
                                 f"({self.model.stack_time}), got {list(frames.lengths)}")
        longest = max_frames(self.max_duration / features.speed_min, features)
        if self.bucketed and frames.longest < longest:
            raise TrainperfError(f"recipe field bucket_frames: the longest ({frames.longest}) is shorter than a "
                                 f"{self.max_duration} s utterance slowed to {features.speed_min}x ({longest} "
                                 "frames); add a longer bucket or lower max_duration")
        if not self.train_subsets.strip(","):
            raise TrainperfError("recipe field train_subsets: name at least one LibriSpeech subset")

    @property
    def subsets(self) -> list[str]:
        return [s for s in self.train_subsets.split(",") if s]


def _rcp(name: str, init_scale: float = 0.5, **fields: Any) -> RNNTRecipe:
    """A full recipe: the reference's schedule, target and network, with `fields` (recipe field names)
    set and the LSTMs' weights initialised at `init_scale`."""
    return RNNTRecipe(name=name, max_epochs=100, target=0.058, eval_every=1, eval_first=1, max_grad_norm=1.0,
                      fused_optimizer=True, model=rnnt_model.RNNTConfig(init_scale=init_scale), **fields)


# The reference's train.sh (GBS 1024 on 8 GPUs x 16 x accumulation 8), then the RCP points of
# mlperf_logging's rcps_rnnt.json (2.0.0), with their gradient accumulation. The RCPs ran with one
# duration bucket; ruleset 1.0.0 fixes six, which these recipes use.
FULL_RECIPES: dict[str, RNNTRecipe] = {
    "reference": _rcp("reference", global_batch_size=1024, grad_accum_steps=8),
    "bs512": _rcp("bs512", global_batch_size=512, base_lr=0.0062, hold_epochs=11, decay=0.915,
                 warmup_epochs=1, beta1=0.9, beta2=0.9985, ema=0.994, init_scale=0.45, grad_accum_steps=2),
    "bs1024": _rcp("bs1024", global_batch_size=1024, base_lr=0.007447, hold_epochs=17, decay=0.9037,
                 warmup_epochs=3, beta1=0.9, beta2=0.999, ema=0.992, init_scale=0.5, grad_accum_steps=4),
    "bs1536": _rcp("bs1536", global_batch_size=1536, base_lr=0.0072, hold_epochs=26, decay=0.92,
                 warmup_epochs=5, beta1=0.9, beta2=0.999, ema=0.995, init_scale=0.5, grad_accum_steps=4),
    "bs2048": _rcp("bs2048", global_batch_size=2048, base_lr=0.007, hold_epochs=33, decay=0.939,
                 warmup_epochs=6, beta1=0.9, beta2=0.999, ema=0.995, init_scale=0.5, grad_accum_steps=16),
    "bs3072": _rcp("bs3072", global_batch_size=3072, base_lr=0.009, hold_epochs=40, decay=0.94,
                 warmup_epochs=9, beta1=0.9, beta2=0.995, ema=0.985, init_scale=0.35, grad_accum_steps=24),
    "bs6144": _rcp("bs6144", global_batch_size=6144, base_lr=0.014, hold_epochs=40, decay=0.97,
                 warmup_epochs=16, beta1=0.82, beta2=0.98, ema=0.96, init_scale=0.5, grad_accum_steps=4),
}

# The mini: synthetic speech (synthetic.py), 64 sentencepiece pieces asked for (the unigram trainer
# keeps 49 on its 24-word vocabulary), a one-layer encoder of 128 on each side of the time stacking.
# Probes on this machine: the loss sits on the language-model plateau (~11 nats per utterance, the
# encoder ignored) for the first ~600-900 steps, so the smallest batch that keeps a step efficient (8)
# reaches the target soonest; batch 32 had not left the plateau after 500 steps (Adam 3e-3 or 1e-2,
# LAMB 1e-2). LAMB 6e-3 with one warmup epoch left it in epoch 3 (4e-3: epoch 4; no warmup: epoch 5).
# The default full recipe: the dataset `prepare --scale full` readies is the one it reads.
FULL = next(iter(FULL_RECIPES.values()))

MINI = RNNTRecipe(name="mini", global_batch_size=8, max_epochs=10, target=0.25, eval_every=1, eval_first=1,
                  max_grad_norm=1.0, base_lr=6e-3, warmup_epochs=1, hold_epochs=4, decay=0.8, ema=0.99,
                  fused_optimizer=True,
                  model=rnnt_model.RNNTConfig(init_scale=0.5, pieces=64, enc_hidden=128, pre_layers=1, post_layers=1,
                                     pred_hidden=64, pred_layers=1, joint_hidden=128, enc_dropout=0.0,
                                     pred_dropout=0.0, joint_dropout=0.0),
                  train_subsets="train-clean-100", in_memory=True, loader_threads=2, eval_batch_size=128,
                  synthetic_seconds=1.2, synthetic_pieces=3, bucket_frames=(32, 64, 128, 656), bucket_labels=(4, 8, 16))
