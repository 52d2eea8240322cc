"""The mini's target model, made once by `trainperf make-minigo-target` and shipped in the package.

It is the mini recipe's own training loop (self-play, window, training; no evaluation) run for a
number of generations from a fixed seed, outside the harness (it is not a timed run). Its strength
is measured and written to its manifest beside its SHA-256: win rates against a uniformly random
player, against a one-ply greedy capture player, and of a freshly initialised network against it
(which must lose clearly for the target to mean something).
"""

from __future__ import annotations

import dataclasses
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.contract import Assets, EpochView, RuntimeContext
from trainperf.files import write_bytes_atomic, write_json_atomic
from trainperf.workloads.minigo import go, selfplay
from trainperf.workloads.minigo import model as minigo_model

SEED = 20261124
GENERATIONS = 8
STRENGTH_GAMES = 100


def make_target(workload: Any, out: Path, generations: int, say: Callable[[str], None], seed: int = SEED
                ) -> dict[str, Any]:
    from trainperf.workloads.minigo import MINI, play_config, sha256

    recipe = dataclasses.replace(MINI, target_model="none")
    ctx = RuntimeContext.create("cpu", seed=seed)
    torch.manual_seed(seed)
    parts = workload.build(recipe, ctx, Assets({}))
    schedule = torch.optim.lr_scheduler.LambdaLR(parts.optimizer, parts.lr_schedule(None))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = workload.load_data(recipe, Path(tmp), ctx)
        parts.model.train()
        for generation in range(generations):
            losses = []
            for batch in data.train_batches(EpochView(generation, parts.model, lambda *a, **k: None)):
                parts.optimizer.zero_grad(set_to_none=True)
                loss = parts.loss_fn(parts.model, batch)
                loss.backward()
                parts.optimizer.step()
                schedule.step()
                losses.append(loss.item())
            say(f"generation {generation + 1}/{generations}: {len(losses)} steps, loss {np.mean(losses):.3f} "
                f"({time.perf_counter() - start:.0f} s)")
    target = parts.model.eval()
    strength = measure_strength(recipe, target, play_config(recipe, evaluation=True), seed)
    say("strength: " + ", ".join(f"{k} {v:.2f}" for k, v in strength.items()))
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in target.state_dict().items()}, buffer)
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / "target.pt", buffer.getvalue())
    manifest = {"sha256": sha256(out / "target.pt"), "seed": seed, "generations": generations,
                "board_size": recipe.board_size, "komi": recipe.komi, "width": recipe.width, "blocks": recipe.blocks,
                "fc_width": recipe.fc_width, "strength": strength, "games_per_measure": STRENGTH_GAMES,
                "made_by": f"trainperf make-minigo-target --generations {generations} --seed {seed}"}
    write_json_atomic(out / "target.json", manifest)
    say(f"wrote {out / 'target.pt'} and {out / 'target.json'}")
    return manifest


def measure_strength(recipe: Any, target: torch.nn.Module, config: selfplay.PlayConfig, seed: int,
                     games: int = STRENGTH_GAMES) -> dict[str, float]:
    """The target's win rate against a random and a greedy-capture player, and a fresh network's
    against the target (colours alternating, the evaluation's search settings)."""
    game = go.load_game(recipe.board_size, recipe.komi)
    rng = np.random.default_rng(seed)
    player = selfplay.SearchPlayer(minigo_model.NetworkEvaluator(target, torch.device("cpu")), config)
    torch.manual_seed(seed + 1)
    fresh = minigo_model.DualNet(recipe.board_size, recipe.width, recipe.blocks, recipe.fc_width).eval()
    newcomer = selfplay.SearchPlayer(minigo_model.NetworkEvaluator(fresh, torch.device("cpu")), config)
    return {
        "target_vs_random": selfplay.match(game, player, selfplay.RandomPlayer(), games, rng).win_rate,
        "target_vs_greedy_capture": selfplay.match(game, player, selfplay.CapturePlayer(), games, rng).win_rate,
        "fresh_network_vs_target": selfplay.match(game, newcomer, player, games, rng).win_rate,
    }
