"""The RNN-T reference's audio features, as torch ops on the training device.

Per utterance (host, at load): silence trimmed at -60 dB (librosa's rule: frames of 2,048 samples
every 512, RMS relative to the loudest frame). Per batch (device): speed perturbation by resampling
(training only; band-limited FFT resampling per utterance, scipy.signal.resample's method), dither, pre-emphasis,
|STFT|^2 (n_fft 512, 20 ms Hann window, 10 ms hop), an 80-band Slaney mel filterbank (librosa's
default, which the reference calls), log, per-feature normalisation over each utterance's valid frames,
SpecAugment (training only) and frame stacking x3 with subsampling x3 (240 features every 30 ms).

Decoding FLAC is the only per-utterance host work; everything after it runs batched on the device,
so on a GPU the features cost a few kernels per batch rather than the host's data-loading cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = 16_000
    n_fft: int = 512
    window: int = 320  # 20 ms
    hop: int = 160  # 10 ms
    mels: int = 80
    dither: float = 1e-5
    preemphasis: float = 0.97
    stack: int = 3  # frames stacked and kept one in `stack`
    speed_min: float = 0.85
    speed_max: float = 1.15
    freq_masks: int = 2
    freq_max: int = 20
    time_masks: int = 10
    time_max: float = 0.03  # a time mask is at most this fraction of the utterance
    trim_db: float = 60.0

    @property
    def out_features(self) -> int:
        return self.mels * self.stack


def trim_silence(wave: np.ndarray, top_db: float = 60.0, frame: int = 2048, hop: int = 512) -> np.ndarray:
    """The utterance without its leading and trailing frames quieter than `top_db` below the loudest
    (librosa.effects.trim's rule, centred frames)."""
    if wave.size == 0:
        return wave
    padded = np.pad(wave.astype(np.float64), frame // 2, mode="constant")
    count = 1 + (padded.size - frame) // hop
    idx = np.arange(frame)[None, :] + hop * np.arange(count)[:, None]
    power = np.mean(padded[idx] ** 2, axis=1)
    ref = power.max()
    if ref <= 0:
        return wave[:0]
    loud = np.flatnonzero(10 * np.log10(np.maximum(power, 1e-10) / ref) > -top_db)
    start = int(loud[0]) * hop
    stop = min(wave.size, (int(loud[-1]) + 1) * hop)
    return wave[start:stop]


def resample(wave: torch.Tensor, length: int) -> torch.Tensor:
    """`wave` (1-D) band-limited to `length` samples by zero-padding or truncating its spectrum (the
    method, and within rounding the values, of scipy.signal.resample)."""
    n = wave.shape[-1]
    if length == n:
        return wave
    kept = min(n, length)
    # norm="forward" on both sides: the spectrum divided by n once, the (length / n) gain that keeps
    # the amplitude.
    spectrum = torch.fft.rfft(wave if wave.dtype == torch.float64 else wave.float(), norm="forward")
    spectrum = spectrum[: kept // 2 + 1]
    if kept % 2 == 0:  # the unpaired bin at kept // 2: united when shrinking, split when growing
        spectrum = spectrum.clone()
        spectrum[kept // 2] *= 2.0 if length < n else 0.5
    return torch.fft.irfft(spectrum, n=length, norm="forward")


def fast_sizes(n: int, speed: float, tolerance: float = 1e-3, tries: int = 32) -> tuple[int, int]:
    """(padded input, output) FFT sizes for playing n samples `speed` times faster: both 11-smooth
    (an FFT of a prime number of samples takes ~10x longer), their ratio the closest to `speed`
    among the first `tries` padded sizes (within 0.2 % of it over LibriSpeech's range of lengths)."""
    from scipy.fft import next_fast_len

    size = next_fast_len(n, real=False)
    best: tuple[float, int, int] | None = None
    for _ in range(tries):
        out = next_fast_len(max(1, round(size / speed)), real=False)
        error = abs(size / out - speed) / speed
        if best is None or error < best[0]:
            best = (error, size, out)
        if error < tolerance:
            break
        size = next_fast_len(size + 1, real=False)
    assert best is not None
    return best[1], best[2]


def speed_perturb(wave: torch.Tensor, speed: float) -> torch.Tensor:
    """The utterance played `speed` times faster (shorter), its pitch shifted with it, as the
    reference's resampling does: band-limited FFT resampling, zero-padded to `fast_sizes`, then cut."""
    n = wave.shape[-1]
    padded, target = fast_sizes(n, speed)
    out = resample(torch.nn.functional.pad(wave, (0, padded - n)), target)
    return out[: max(1, round(n * target / padded))]


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    # Slaney's scale: linear below 1 kHz, logarithmic above.
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_part, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), (200.0 / 3) * m)


def mel_filterbank(sample_rate: int, n_fft: int, mels: int, fmin: float = 0.0, fmax: float | None = None
                   ) -> torch.Tensor:
    """(mels, n_fft // 2 + 1) triangular filters on Slaney's mel scale, area-normalised (librosa's
    `filters.mel` defaults)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    points = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), mels + 2))
    widths = np.diff(points)
    ramps = points[:, None] - freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (points[2:] - points[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


class Featurizer:
    """Batched features of padded waveforms on one device (buffers built once)."""

    def __init__(self, cfg: FeatureConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.window = torch.hann_window(cfg.window, periodic=False, device=device)
        self.filters = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.mels).to(device)

    def frames(self, samples: torch.Tensor) -> torch.Tensor:
        """Output frames (after stacking) of utterances of `samples` samples."""
        spectral = torch.div(samples + self.cfg.hop - 1, self.cfg.hop, rounding_mode="floor")
        return torch.div(spectral + self.cfg.stack - 1, self.cfg.stack, rounding_mode="floor")

    @torch.no_grad()
    def __call__(self, waves: torch.Tensor, lengths: torch.Tensor, train: bool, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """waves (B, S) float on the device, zero-padded; lengths (B,) samples. Returns features
        (B, T, mels * stack) and their valid frames (B,)."""
        cfg = self.cfg
        x = waves.float()
        if cfg.dither > 0:
            x = x + cfg.dither * torch.randn(x.shape, generator=generator, device=x.device)
        if cfg.preemphasis:
            x = torch.cat([x[:, :1], x[:, 1:] - cfg.preemphasis * x[:, :-1]], dim=1)
        spec = torch.stft(x, cfg.n_fft, hop_length=cfg.hop, win_length=cfg.window, window=self.window,
                          center=True, pad_mode="constant", return_complex=True)
        power = spec.real.square() + spec.imag.square()
        feats = torch.log(torch.matmul(self.filters, power) + 1e-20)  # (B, mels, F)
        n_frames = torch.div(lengths + cfg.hop - 1, cfg.hop, rounding_mode="floor").clamp(1, feats.shape[2])
        valid = torch.arange(feats.shape[2], device=feats.device)[None, :] < n_frames[:, None]  # (B, F)
        feats = feats.masked_fill(~valid[:, None, :], 0.0)
        count = n_frames[:, None].to(feats.dtype)
        mean = feats.sum(2) / count
        centred = (feats - mean[:, :, None]).masked_fill(~valid[:, None, :], 0.0)
        std = torch.sqrt(centred.square().sum(2) / (count - 1).clamp_min(1))
        feats = centred / (std[:, :, None] + 1e-5)
        if train:
            feats = self._spec_augment(feats, n_frames, generator)
        b, m, f = feats.shape
        pad = (-f) % cfg.stack
        stacked = torch.nn.functional.pad(feats, (0, pad)).transpose(1, 2).reshape(b, (f + pad) // cfg.stack,
                                                                                  m * cfg.stack)
        out_frames = torch.div(n_frames + cfg.stack - 1, cfg.stack, rounding_mode="floor")
        return stacked, out_frames

    def _spec_augment(self, feats: torch.Tensor, n_frames: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        b, m, f = feats.shape
        dev = feats.device
        keep = torch.ones(b, m, f, dtype=torch.bool, device=dev)
        if cfg.freq_masks:
            width = torch.randint(0, cfg.freq_max + 1, (b, cfg.freq_masks), generator=gen, device=dev)
            start = (torch.rand(b, cfg.freq_masks, generator=gen, device=dev) * (m - width + 1)).floor()
            bins = torch.arange(m, device=dev)[None, None, :]
            hit = (bins >= start[..., None]) & (bins < (start + width)[..., None])
            keep &= ~hit.any(1)[:, :, None]
        if cfg.time_masks:
            longest = (n_frames.to(torch.float32) * cfg.time_max).floor()  # (B,)
            width = (torch.rand(b, cfg.time_masks, generator=gen, device=dev) * (longest[:, None] + 1)).floor()
            room = (n_frames[:, None] - width + 1).clamp_min(1)
            start = (torch.rand(b, cfg.time_masks, generator=gen, device=dev) * room).floor()
            steps = torch.arange(f, device=dev)[None, None, :]
            hit = (steps >= start[..., None]) & (steps < (start + width)[..., None])
            keep &= ~hit.any(1)[:, None, :]
        return feats.masked_fill(~keep, 0.0)


def padding_fraction(lengths: list[np.ndarray]) -> float:
    """Padded share of the samples in batches of these lengths (each batch padded to its longest)."""
    total = sum(float(x.size) * float(x.max()) for x in lengths if x.size)
    real = sum(float(x.sum()) for x in lengths)
    return 0.0 if total == 0 else 1.0 - real / total


def max_frames(seconds: float, cfg: FeatureConfig) -> int:
    return math.ceil(math.ceil(seconds * cfg.sample_rate / cfg.hop) / cfg.stack)
