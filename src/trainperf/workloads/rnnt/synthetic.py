"""The mini RNN-T dataset: sentences from a small vocabulary rendered as speech-like audio and written
as a LibriSpeech tree (FLAC + .trans.txt), so the real loader, features and model read it.

Every letter is a short sound with its own spectral shape: vowels and voiced consonants a harmonic
series of the speaker's pitch shaped by three formant resonances; fricatives band-limited noise;
plosives a short burst before a voiced onset. Speakers differ in pitch (90-220 Hz), vocal-tract
length (formants scaled 0.93-1.07), speaking rate, loudness and background noise (15-30 dB SNR);
utterances carry leading and trailing silence, which the loader trims as it trims LibriSpeech.
Training and evaluation speakers are disjoint, as LibriSpeech's train and dev speakers are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainperf.files import AtomicOutput
from trainperf.workloads.rnnt.data import EVAL_SUBSET, SAMPLE_RATE, LibriSpeech

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "yes", "no",
         "up", "down", "left", "right", "go", "stop", "on", "off", "red", "blue", "green", "black")
TRAIN_SUBSET = "train-clean-100"
FRICATIVES = set("fhsvxz")
PLOSIVES = set("bcdgkpqt")


def letter_sounds(seed: int = 7) -> dict[str, tuple[str, np.ndarray]]:
    """letter -> (kind, formants in Hz): a fixed, well-separated assignment."""
    rng = np.random.default_rng(seed)
    letters = sorted(set("".join(WORDS)))
    out: dict[str, tuple[str, np.ndarray]] = {}
    f1 = np.geomspace(300, 1000, 5)
    f2 = np.geomspace(1000, 3000, 5)
    grid = [(a, b) for a in f1 for b in f2 if b > a * 1.5]
    picks = rng.permutation(len(grid))
    for i, letter in enumerate(letters):
        a, b = grid[picks[i % len(grid)]]
        kind = "fricative" if letter in FRICATIVES else "plosive" if letter in PLOSIVES else "voiced"
        if kind == "fricative":
            centre = float(np.geomspace(2500, 7000, len(FRICATIVES))[sorted(FRICATIVES).index(letter)])
            out[letter] = (kind, np.array([centre, 0.0, 0.0]))
        else:
            out[letter] = (kind, np.array([a, b, 2600 + 500 * ((i * 0.61) % 1.0)]))
    return out


def render(words: list[str], speaker: dict[str, float], sounds: dict[str, tuple[str, np.ndarray]],
           rng: np.random.Generator) -> np.ndarray:
    sr = SAMPLE_RATE
    pieces: list[np.ndarray] = [np.zeros(int(sr * rng.uniform(0.08, 0.25)))]
    phase = 0.0
    for w, word in enumerate(words):
        if w:
            pieces.append(np.zeros(int(sr * rng.uniform(0.03, 0.09))))
        for letter in word:
            kind, formants = sounds[letter]
            n = int(sr * speaker["rate"] * rng.uniform(0.85, 1.15))
            t = np.arange(n) / sr
            env = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.008 * sr))
            if kind == "fricative":
                spectrum = np.fft.rfft(rng.standard_normal(n))
                freqs = np.fft.rfftfreq(n, 1 / sr)
                centre = formants[0] * speaker["tract"]
                spectrum *= np.exp(-0.5 * ((freqs - centre) / 700.0) ** 2)
                sound = np.fft.irfft(spectrum, n)
                sound *= 0.6 / (np.abs(sound).max() + 1e-9)
            else:
                f0 = speaker["pitch"] * (1 + 0.05 * np.sin(2 * np.pi * 3 * t + phase))
                harmonics = np.arange(1, int(7000 / speaker["pitch"]))
                shaped = formants * speaker["tract"]
                gain = sum(np.exp(-0.5 * ((harmonics * speaker["pitch"] - f) / 140.0) ** 2) * (0.6 ** k)
                           for k, f in enumerate(shaped) if f > 0)
                keep = gain > 1e-3
                cycles = 2 * np.pi * np.cumsum(f0) / sr + phase
                sound = (gain[keep, None] * np.sin(harmonics[keep, None] * cycles[None, :])).sum(0)
                phase = float(cycles[-1] % (2 * np.pi))
                sound *= 0.8 / (np.abs(sound).max() + 1e-9)
                if kind == "plosive":
                    burst = int(0.012 * sr)
                    sound[:burst] = rng.standard_normal(burst) * 0.5
            pieces.append(sound * env)
    pieces.append(np.zeros(int(sr * rng.uniform(0.08, 0.25))))
    wave = np.concatenate(pieces) * speaker["gain"]
    noise = rng.standard_normal(wave.size)
    power = np.mean(wave ** 2)
    wave = wave + noise * np.sqrt(power / 10 ** (speaker["snr"] / 10))
    return np.clip(wave, -1.0, 1.0).astype(np.float32)


def speaker(rng: np.random.Generator) -> dict[str, float]:
    return {"pitch": rng.uniform(90, 220), "tract": rng.uniform(0.93, 1.07), "rate": rng.uniform(0.055, 0.085),
            "gain": rng.uniform(0.2, 0.6), "snr": rng.uniform(15, 30)}


def sentence(rng: np.random.Generator) -> list[str]:
    return [WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(2, 5))]


def write_subset(root: Path, subset: str, speakers: range, chapters: int, per_chapter: int, seed: int,
                 say: Callable[[str], None]) -> int:
    """speakers x chapters x per_chapter utterances as <subset>/<speaker>/<chapter>/*.flac + .trans.txt."""
    import soundfile

    sounds = letter_sounds()
    count = 0
    with AtomicOutput(root / subset, directory=True) as tmp:
        for spk in speakers:
            rng = np.random.default_rng([seed, spk])
            voice = speaker(rng)
            for chapter in range(chapters):
                folder = tmp / str(spk) / str(chapter)
                folder.mkdir(parents=True)
                lines = []
                for n in range(per_chapter):
                    words = sentence(rng)
                    utt = f"{spk}-{chapter}-{n:04d}"
                    soundfile.write(str(folder / f"{utt}.flac"), render(words, voice, sounds, rng), SAMPLE_RATE,
                                    format="FLAC", subtype="PCM_16")
                    lines.append(f"{utt} {' '.join(words).upper()}")
                    count += 1
                (folder / f"{spk}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        say(f"{subset}: {count:,} utterances by {len(speakers)} speakers")
    return count


def generate(root: Path, say: Callable[[str], None], train_speakers: int = 40, eval_speakers: int = 10,
             per_chapter: int = 25, seed: int = 2021) -> None:
    """The mini LibriSpeech tree: `train-clean-100` and `dev-clean` with disjoint speakers."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / TRAIN_SUBSET).is_dir():
        write_subset(root, TRAIN_SUBSET, range(100, 100 + train_speakers), 2, per_chapter, seed, say)
    if not (root / EVAL_SUBSET).is_dir():
        write_subset(root, EVAL_SUBSET, range(900, 900 + eval_speakers), 1, per_chapter, seed, say)


class SyntheticSpeech(LibriSpeech):
    """The mini: synthesized utterances written as LibriSpeech FLAC subsets, then the reference's conversion."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        if not (data_dir / EVAL_SUBSET).is_dir():
            return [f"{data_dir}: mini dataset not generated yet (trainperf prepare rnnt)"]
        return super().problems(data_dir)

    def write_audio(self, data_dir: Path, say: Callable[[str], None]) -> None:
        generate(data_dir, say)
