"""The mini's data: captions of three attributes (a colour, a shape, a place) encoded by a fixed "text encoder",
and latents drawn from a Gaussian whose mean the caption fixes, written in the reference's preprocessed format
(data.py) — so the loss floor is known in closed form and a model blind to the text has a computable best.

- captions: the three attribute words in a random order among 0-3 filler words, padded to TEXT_TOKENS; the
  "T5" encoding is each token's fixed vector plus small noise, the "CLIP" pooled output a fixed projection of the
  mean word vector; the empty prompt is all padding;
- latents: mean μ(caption) = a colour's channel offsets everywhere + a shape's spatial template times its
  channel loadings + a place's quadrant times its channel offsets (between-caption variance ≈ 0.75 an
  element), and within a caption an isotropic spread s² = 0.04 a latent element, half in the stored posterior
  mean (the autoencoder's per-image variation), half in its stored variance (exp(logvar)), in the autoencoder's
  raw units: the pipeline's normalisation (z - 0.1159) x 0.3611 maps them back.

With v = noise - x0 and x_t = (1 - t) x0 + t noise, the best prediction knowing the caption leaves
s² / ((1 - t)² s² + t²) an element (1 at t = 0, where the noise is not in x_t at all): `floor`. A model that
ignores the text can still guess the caption from x_t; the best it can do is the mixture's posterior mean over the
256 captions' Gaussians: `text_blind`. Both are computed on the validation rows with their fixed noise and kept in
the folder's manifest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.files import write_json_atomic
from trainperf.workloads.flux1 import data as D

LATENT = (16, 8, 8)
TEXT_TOKENS = 8
TEXT_DIM = 32
POOLED_DIM = 16
COLOURS, SHAPES, PLACES = 8, 8, 4
FILLERS = 12
WITHIN = 0.04  # s²: a latent element's variance given the caption
TRAIN_ROWS = 8_192
VALID_ROWS = 1_024
SOURCE_SEED = 4_711
MANIFEST = "trainperf_flux1_mini.json"
PAD = COLOURS + SHAPES + PLACES + FILLERS  # the padding token's id
WORDS = PAD + 1


class World:
    """The fixed parts of the generator: word vectors, the pooling projection and the attributes' latents."""

    def __init__(self, seed: int = SOURCE_SEED) -> None:
        rng = np.random.default_rng(seed)
        self.words = rng.normal(0.0, 0.5, (WORDS, TEXT_DIM)).astype(np.float32)
        self.pool = (rng.normal(0.0, 1.0, (TEXT_DIM, POOLED_DIM)) / math.sqrt(TEXT_DIM)).astype(np.float32)
        c, h, w = LATENT
        self.colour = rng.normal(0.0, 0.5, (COLOURS, c, 1, 1))
        yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
        templates = []
        for _ in range(SHAPES):
            fy, fx = rng.integers(1, 3), rng.integers(1, 3)
            py, px = rng.uniform(0, 2 * np.pi), rng.uniform(0, 2 * np.pi)
            field = np.cos(np.pi * fy * yy + py) * np.cos(np.pi * fx * xx + px)
            templates.append(field / field.std())
        self.shape = np.stack(templates)[:, None] * rng.normal(0.0, 0.5, (SHAPES, c, 1, 1))
        quadrants = np.zeros((PLACES, 1, h, w))
        for q in range(PLACES):
            quadrants[q, 0, (q // 2) * h // 2:(q // 2 + 1) * h // 2, (q % 2) * w // 2:(q % 2 + 1) * w // 2] = 1.0
        self.place = quadrants * rng.normal(0.0, 1.0, (PLACES, c, 1, 1))

    def mean(self, colour: np.ndarray, shape: np.ndarray, place: np.ndarray) -> np.ndarray:
        """μ of each caption's latents [N, C, H, W] (normalised latent units)."""
        return self.colour[colour] + self.shape[shape] + self.place[place]

    def means(self) -> np.ndarray:
        """μ of every caption [COLOURS x SHAPES x PLACES, C, H, W]: caption (a, b, q) at (a x SHAPES + b) x PLACES
        + q."""
        a, b, q = np.meshgrid(np.arange(COLOURS), np.arange(SHAPES), np.arange(PLACES), indexing="ij")
        return self.mean(a.ravel(), b.ravel(), q.ravel())

    def encode(self, tokens: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """"T5" [N, TEXT_TOKENS, TEXT_DIM] and pooled "CLIP" [N, POOLED_DIM] encodings of token rows."""
        t5 = self.words[tokens]
        if rng is not None:
            t5 = t5 + rng.normal(0.0, 0.05, t5.shape).astype(np.float32)
        content = tokens != PAD
        bag = (self.words[tokens] * content[..., None]).sum(1) / np.maximum(content.sum(1, keepdims=True), 1)
        bag = np.where(content.any(1, keepdims=True), bag, self.words[PAD])
        return t5, bag @ self.pool


def captions(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n captions: their attributes [n, 3] and token rows [n, TEXT_TOKENS]."""
    attributes = np.stack([rng.integers(0, COLOURS, n), rng.integers(0, SHAPES, n), rng.integers(0, PLACES, n)], 1)
    tokens = np.full((n, TEXT_TOKENS), PAD)
    for i, (a, b, q) in enumerate(attributes):
        words = [a, COLOURS + b, COLOURS + SHAPES + q]
        words += list(COLOURS + SHAPES + PLACES + rng.integers(0, FILLERS, rng.integers(0, 4)))
        rng.shuffle(words)
        tokens[i, :len(words)] = words
    return attributes, tokens


def _rows(world: World, n: int, rng: np.random.Generator, key: str, timesteps: bool
          ) -> tuple[dict[str, list[Any]], np.ndarray]:
    attributes, tokens = captions(n, rng)
    t5, pooled = world.encode(tokens, rng)
    mu = world.mean(*attributes.T)
    half = WITHIN / 2 / D.SCALE_FACTOR**2  # each half of s², in the autoencoder's raw units
    mean = mu / D.SCALE_FACTOR + D.SHIFT_FACTOR + rng.normal(0.0, math.sqrt(half), mu.shape)
    logvar = np.full(LATENT, math.log(half))
    rows: dict[str, list[Any]] = {"__key__": [], "timestep": [], **{c: [] for c in D.BINARY}}
    logvar_cell = D.encode(torch.from_numpy(logvar))
    for i in range(n):
        rows["__key__"].append(f"{key}{i:08d}")
        rows["timestep"].append(i % D.TIMESTEPS if timesteps else None)
        rows["t5_encodings"].append(D.encode(torch.from_numpy(t5[i])))
        rows["clip_encodings"].append(D.encode(torch.from_numpy(pooled[i])))
        rows["mean"].append(D.encode(torch.from_numpy(mean[i])))
        rows["logvar"].append(logvar_cell)
    index = (attributes[:, 0] * SHAPES + attributes[:, 1]) * PLACES + attributes[:, 2]
    return rows, index


def write(data_dir: Path, train_rows: int = TRAIN_ROWS, valid_rows: int = VALID_ROWS, seed: int = SOURCE_SEED
          ) -> dict[str, Any]:
    """The mini dataset in the reference's layout, and its manifest (floors and baselines)."""
    world = World(seed)
    rng = np.random.default_rng(seed + 1)
    train, _ = _rows(world, train_rows, rng, "cc12m", timesteps=False)
    valid, classes = _rows(world, valid_rows, rng, "coco", timesteps=True)
    D.write_dataset(data_dir / D.TRAIN_DIR, train, shard_rows=4_096)
    D.write_dataset(data_dir / D.VALID_DIR, valid)
    empty_t5, empty_clip = world.encode(np.full((1, TEXT_TOKENS), PAD), None)
    (data_dir / D.EMPTY_DIR).mkdir(parents=True, exist_ok=True)
    for name, value in zip(D.EMPTY_FILES, (empty_t5, empty_clip), strict=True):
        partial = data_dir / D.EMPTY_DIR / f"{name}.partial"
        with partial.open("wb") as f:
            np.save(f, value.astype(np.float16), allow_pickle=False)
        partial.replace(data_dir / D.EMPTY_DIR / name)
    manifest = {"source": "three-attribute captions, Gaussian latents", "latent": list(LATENT),
                "text_tokens": TEXT_TOKENS, "text_dim": TEXT_DIM, "pooled_dim": POOLED_DIM,
                "captions": COLOURS * SHAPES * PLACES, "within_variance": WITHIN,
                "train_rows": train_rows, "valid_rows": valid_rows,
                **references(data_dir, world, classes)}
    write_json_atomic(data_dir / MANIFEST, manifest)
    return manifest


def best_velocity(xt: torch.Tensor, mu: torch.Tensor, t: float, s2: float) -> torch.Tensor:
    """E[noise - x0 | x_t] when x0 ~ N(mu, s2 I): for each row of mu, the best prediction knowing the caption."""
    a, b = 1 - t, t
    return (b - a * s2) / (a * a * s2 + b * b) * (xt - a * mu) - mu


def references(data_dir: Path, world: World, classes: np.ndarray) -> dict[str, float]:
    """On the validation rows as the evaluation reads them (their fixed noise): the best loss knowing the caption
    (`floor`; `floor_expected`: its expectation), the best ignoring it (`text_blind`), and predicting zero."""
    rows = D._Rows(data_dir / D.VALID_DIR, D.Shapes(TEXT_TOKENS, TEXT_DIM, POOLED_DIM, LATENT[0], LATENT[1]),
                   eval_noise=True)
    means = torch.from_numpy(world.means()).float().flatten(1)  # [captions, d]
    s2 = WITHIN
    floor = blind = zero = expected = 0.0
    for i in range(len(rows)):
        row = rows[i]
        x0 = D.latents(row["mean"], row["logvar"], row["posterior_noise"]).flatten()
        noise, t = row["noise"].flatten(), float(row["t"])
        a, b = 1 - t, t
        xt, v = a * x0 + b * noise, noise - x0
        var = a * a * s2 + b * b

        mu = means[int(classes[i])]
        floor += float(((v - best_velocity(xt, mu[None], t, s2)[0]) ** 2).mean())
        expected += s2 / var
        logits = -((xt[None] - a * means) ** 2).sum(1) / (2 * var)
        weights = torch.softmax(logits.double(), 0).float()
        blind += float(((v - weights @ best_velocity(xt, means, t, s2)) ** 2).mean())
        zero += float((v**2).mean())
    n = len(rows)
    return {"floor": floor / n, "floor_expected": expected / n, "text_blind": blind / n, "zero": zero / n}


class MiniFlux(D.PreprocessedFlux):
    """The mini's data source: generated by `prepare`, into the cache; counted and verified as the real one."""

    generated = True
    writers = None

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        manifest = write(data_dir)
        say(f"wrote {manifest['train_rows']:,} training and {manifest['valid_rows']:,} validation rows to {data_dir} "
            f"(validation loss floor {manifest['floor']:.3f}, blind to the text {manifest['text_blind']:.3f})")
