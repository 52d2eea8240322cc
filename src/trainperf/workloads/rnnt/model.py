"""The MLPerf RNN-T: an LSTM transducer (encoder, prediction network, joint), batched greedy decoding,
and the reference's learning-rate policy.

Encoder: `pre_rnn` LSTM over the 240 stacked features, time stacking x2 (pairs of frames
concatenated), `post_rnn` LSTM. Prediction network: embedding of the previous piece (an all-zero
vector before the first), `dec_rnn` LSTM. Joint: `joint_enc` and `joint_pred` projections summed,
ReLU, dropout, `joint_net` to pieces + blank (the blank is the last class). Initialisation as the
reference's: PyTorch defaults, the LSTMs' input-hidden forget-gate bias set to 1 and their
hidden-hidden one to 0, then every LSTM weight and bias scaled by `init_scale`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainperf.contract.fields import Count, Fraction, Positive
from trainperf.workloads.common.rnn import LSTM

# The tensors the closed rules require a weights_initialization event for, by module name.
INITIALIZED = ("pre_rnn", "post_rnn", "pred_embed", "dec_rnn", "joint_pred", "joint_enc", "joint_net")


@dataclass(frozen=True)
class RNNTConfig:
    features: int = 240
    pieces: Count = 1023  # sentencepiece pieces; classes = pieces + 1 (blank last)
    enc_hidden: Count = 1024
    pre_layers: Count = 2
    post_layers: Count = 3
    stack_time: int = 2
    pred_hidden: Count = 512
    pred_layers: Count = 2
    joint_hidden: Count = 512
    enc_dropout: Fraction = 0.1
    pred_dropout: Fraction = 0.3
    joint_dropout: Fraction = 0.3
    forget_bias: float = 1.0
    init_scale: Positive = 0.45

    @property
    def classes(self) -> int:
        return self.pieces + 1

    @property
    def blank(self) -> int:
        return self.pieces


def _lstm(inputs: int, hidden: int, layers: int, dropout: float, forget_bias: float, scale: float) -> nn.LSTM:
    lstm = LSTM(inputs, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
    with torch.no_grad():
        for name, p in lstm.named_parameters():
            if name.startswith("bias_ih"):
                p[hidden: 2 * hidden].fill_(forget_bias)
            elif name.startswith("bias_hh"):
                p[hidden: 2 * hidden].zero_()
            p.mul_(scale)
    return lstm


class RNNT(nn.Module):
    def __init__(self, cfg: RNNTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.pre_rnn = _lstm(cfg.features, cfg.enc_hidden, cfg.pre_layers, cfg.enc_dropout, cfg.forget_bias,
                             cfg.init_scale)
        self.post_rnn = _lstm(cfg.enc_hidden * cfg.stack_time, cfg.enc_hidden, cfg.post_layers, cfg.enc_dropout,
                              cfg.forget_bias, cfg.init_scale)
        self.enc_dropout = nn.Dropout(cfg.enc_dropout)
        self.pred_embed = nn.Embedding(cfg.pieces, cfg.pred_hidden)
        self.dec_rnn = _lstm(cfg.pred_hidden, cfg.pred_hidden, cfg.pred_layers, cfg.pred_dropout, cfg.forget_bias,
                             cfg.init_scale)
        self.pred_dropout = nn.Dropout(cfg.pred_dropout)
        self.joint_enc = nn.Linear(cfg.enc_hidden, cfg.joint_hidden)
        self.joint_pred = nn.Linear(cfg.pred_hidden, cfg.joint_hidden)
        self.joint_net = nn.Sequential(nn.ReLU(), nn.Dropout(cfg.joint_dropout), nn.Linear(cfg.joint_hidden,
                                                                                           cfg.classes))

    def encode(self, feats: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, features) -> (B, ceil(T / stack), enc_hidden) and the valid encoder frames."""
        x, _ = self.pre_rnn(feats)
        x = self.enc_dropout(x)
        b, t, h = x.shape
        k = self.cfg.stack_time
        pad = (-t) % k
        x = nn.functional.pad(x, (0, 0, 0, pad)).reshape(b, (t + pad) // k, h * k)
        x, _ = self.post_rnn(x)
        return self.enc_dropout(x), torch.div(frames + k - 1, k, rounding_mode="floor")

    def predict(self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                start: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Prediction network over `tokens` (B, U); with `start`, the all-zero start input goes first
        (output (B, U+1, H))."""
        x = self.pred_embed(tokens.clamp_min(0))
        if start:
            x = torch.cat([x.new_zeros(x.shape[0], 1, x.shape[2]), x], dim=1)
        y, state = self.dec_rnn(x, state)
        return self.pred_dropout(y), state

    def joint(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """enc (B, T, He), pred (B, U1, Hp) -> logits (B, T, U1, classes)."""
        return self.joint_net(self.joint_enc(enc)[:, :, None, :] + self.joint_pred(pred)[:, None, :, :])

    def forward(self, feats: torch.Tensor, frames: torch.Tensor, tokens: torch.Tensor,
                labels: torch.Tensor | None = None, loss: Callable[..., torch.Tensor] | None = None,
                chunks: int = 1) -> Any:
        """The joint's logits and the valid encoder frames; with `labels` and `loss`, the per-utterance
        loss(logits, tokens, frames, labels) instead, the joint and the loss computed over `chunks`
        slices of the batch and recomputed in the backward pass (activation checkpointing), so that the
        B x T x U x V logits only ever exist one slice at a time."""
        enc, enc_frames = self.encode(feats, frames)
        pred, _ = self.predict(tokens)
        if loss is None:
            return self.joint(enc, pred), enc_frames
        if labels is None:
            raise ValueError("RNNT.forward: a loss needs the labels")
        if chunks <= 1:
            return loss(self.joint(enc, pred), tokens, enc_frames, labels)
        b = enc.shape[0]
        bounds = sorted({b * i // chunks for i in range(chunks + 1)})
        parts = [checkpoint(self._joint_loss, enc[lo:hi], pred[lo:hi], tokens[lo:hi], enc_frames[lo:hi],
                            labels[lo:hi], loss, use_reentrant=False)
                 for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        return torch.cat(parts)

    def _joint_loss(self, enc: torch.Tensor, pred: torch.Tensor, tokens: torch.Tensor, frames: torch.Tensor,
                    labels: torch.Tensor, loss: Callable[..., torch.Tensor]) -> torch.Tensor:
        return loss(self.joint(enc, pred), tokens, frames, labels)


@torch.no_grad()
def greedy_decode(model: RNNT, feats: torch.Tensor, frames: torch.Tensor, max_symbols: int = 300,
                  max_per_frame: int = 30, check_every: int | None = None) -> list[list[int]]:
    """Batched greedy decoding: at every encoder frame each utterance emits its most likely piece
    until the blank wins (at most `max_per_frame` pieces per frame, `max_symbols` per utterance).

    Each utterance keeps its own place (frame, pieces at that frame), so one step of the batch either emits
    a piece or moves an utterance to its next frame, for all of them at once, on the device: no host loop
    over frames, no step that waits for the slowest row's emissions. Whether all are done is read back once
    every `check_every` steps (default: every step on a CPU, where reading costs nothing; every 16 on an
    accelerator, where a read waits for the queue to drain). The hypotheses come back in one transfer."""
    if max_symbols < 1 or max_per_frame < 1:
        raise ValueError(f"greedy_decode: max_symbols ({max_symbols}) and max_per_frame ({max_per_frame}) must be >= 1")
    enc, enc_frames = model.encode(feats, frames)
    b, t_max, _ = enc.shape
    blank = model.cfg.blank
    dev = enc.device
    every = check_every or (1 if dev.type == "cpu" else 16)
    enc_proj = model.joint_enc(enc)
    rows = torch.arange(b, device=dev)
    limit = enc_frames.clamp(0, t_max)
    pred, state = _predict_step(model, torch.full((b, 1), -1, dtype=torch.long, device=dev), None)
    out = torch.full((b, max_symbols), -1, dtype=torch.long, device=dev)
    emitted = torch.zeros(b, dtype=torch.long, device=dev)
    frame = torch.zeros(b, dtype=torch.long, device=dev)  # each utterance's encoder frame
    here = torch.zeros(b, dtype=torch.long, device=dev)  # pieces it emitted at that frame
    done = limit <= 0
    # Each step moves every unfinished utterance one frame on or adds one of its pieces: this many suffice.
    for step in range(t_max + min(max_symbols, t_max * max_per_frame)):
        if step % every == 0 and bool(done.all()):
            break
        logits = model.joint_net(enc_proj[rows, frame.clamp_max(t_max - 1)] + model.joint_pred(pred))
        best = logits.argmax(-1)
        emit = ~done & (best != blank)
        # Written by scatter, not a boolean-mask index (which reads the mask's count back, twice).
        slot = emitted.clamp_max(max_symbols - 1)[:, None]
        out.scatter_(1, slot, torch.where(emit, best, out.gather(1, slot)[:, 0])[:, None])
        emitted = emitted + emit.long()
        here = here + emit.long()
        moves = ~done & (~emit | (here >= max_per_frame))
        frame = frame + moves.long()
        here = torch.where(moves, 0, here)
        new_pred, new_state = _predict_step(model, torch.where(emit, best, 0)[:, None], state)
        keep = emit[:, None]
        pred = torch.where(keep, new_pred, pred)
        state = tuple(torch.where(keep[None], new, old) for new, old in zip(new_state, state, strict=True))
        done = done | (frame >= limit) | (emitted >= max_symbols)
    return [[x for x in row if x >= 0] for row in out.tolist()]


def _predict_step(model: RNNT, token: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One prediction-network step; token -1 is the all-zero start input."""
    x = model.pred_embed(token.clamp_min(0))
    x = torch.where((token >= 0)[..., None], x, torch.zeros_like(x))
    y, state = model.dec_rnn(x, state)
    return y[:, 0], state


def lr_factor(base_lr: float, steps_per_epoch: int, warmup_epochs: int, hold_epochs: int, decay: float,
              min_lr: float) -> Callable[[int], float]:
    """The reference's policy as a multiplier of base_lr at optimizer step `step` (from 1): linear
    warmup over warmup_epochs, held for hold_epochs, then x decay per epoch; never below min_lr."""
    warmup = warmup_epochs * steps_per_epoch
    hold = hold_epochs * steps_per_epoch
    floor = min_lr / base_lr

    def factor(step: int) -> float:
        s = step - 1  # the reference's step counter starts at 0
        if s < warmup:
            a = (s + 1) / (warmup + 1)
        elif s < warmup + hold:
            a = 1.0
        else:
            # the reference counts epochs from 1: the first decayed epoch already has one factor
            a = decay ** (s // steps_per_epoch + 1 - warmup_epochs - hold_epochs)
        return max(a, floor)

    return factor

