"""MiniGo (MLPerf key `minigo`, ruleset 1.0.0): reinforcement learning whose training data the network
makes for itself. A generation (the harness's epoch) is: self-play games by the current network, the
last `window` generations' full-search positions as the training window, a training phase on a
`train_filter` share of it; then the generation plays the fixed target model, and the run ends at the
first generation winning at least half the games. The rules time training only — up to the passing
generation's save —, so evaluations are untimed (`untimed_evaluation`).

mini: 5x5 Go, a 3-block network of 32 channels, few readouts, against a target model shipped in the
package (`trainperf make-minigo-target`, checksum verified at load). full: the v0.7+ 19x19 recipe
(and the v0.6 9x9 one) from the user's bootstrap checkpoint and target model.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
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
    GoldenSpec,
    Metric,
    MLPerf,
    ModelParts,
    RuntimeContext,
    Scale,
    StepBudget,
    Workload,
)
from trainperf.errors import TrainperfError
from trainperf.optim import kernels
from trainperf.workloads.minigo import go, mcts, selfplay
from trainperf.workloads.minigo import model as minigo_model
from trainperf.workloads.minigo.recipes import FULL_RECIPES, MINI, MiniGoRecipe

PACKAGE = Path(__file__).parent / "mini"
MINI_TARGET = PACKAGE / "target.pt"
MINI_MANIFEST = PACKAGE / "target.json"


def lr_factor(recipe: MiniGoRecipe) -> Callable[[int], float]:
    """The reference's piecewise-constant LR (lr_rates between lr_boundaries, in steps), as a factor
    of the first rate (the optimizer's base LR)."""
    rates, bounds = recipe.lr_rates, np.asarray(recipe.lr_boundaries)

    def factor(step: int) -> float:
        return rates[int(np.searchsorted(bounds, step, side="right"))] / rates[0]

    return factor


def play_config(recipe: MiniGoRecipe, evaluation: bool = False) -> selfplay.PlayConfig:
    search = mcts.SearchConfig(virtual_losses=recipe.virtual_losses, value_init_penalty=recipe.value_init_penalty,
                               dirichlet_alpha=recipe.dirichlet_alpha, noise_mix=recipe.noise_mix,
                               reasonable_moves=recipe.reasonable_moves, c_puct_scale=recipe.c_puct_scale)
    if evaluation:  # the reference's eval flags: no fast-play, no resignation
        return selfplay.PlayConfig(search, recipe.eval_readouts, softpick_moves=recipe.eval_softpick_moves,
                                   visits_exponent=recipe.visits_exponent, soft_pass=recipe.soft_pass)
    return selfplay.PlayConfig(search, recipe.readouts, recipe.fastplay_frequency, recipe.fastplay_readouts,
                        recipe.softpick_moves, recipe.min_resign_threshold, recipe.max_resign_threshold,
                        recipe.disable_resign_pct, recipe.holdout_pct, recipe.target_pruning,
                        recipe.visits_exponent, recipe.soft_pass, recipe.fresh_full_search)


def _forward(model: nn.Module, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return model(planes)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class MiniGoWorkload(Workload[MiniGoRecipe]):
    name = "minigo"
    benchmark = "minigo"
    # open_recipes: 4,096 games a generation: 1.0.0 requires 8,192
    mlperf = MLPerf(ruleset="1.0.0", runs=10, open_recipes=frozenset({"v0.6-9x9"}))
    metric = Metric("win_rate", higher_is_better=True)
    summary = "MiniGo: self-play RL, win rate against a target model (mini: 5x5 Go, a small network)"
    speedups = frozenset({"precision", "channels_last", "compile", "cuda_graphs", "fused_optimizer"})
    # Self-play makes the data before the first step: fewer, shallower games (the same code) and a 4-game
    # evaluation keep it to seconds.
    golden = GoldenSpec(steps=2, sets=("games_per_generation=8", "readouts=8", "fastplay_readouts=4", "eval_games=4"))
    step_probe = ("global_batch_size=8",)
    step_budget = StepBudget(ops=330)
    device_probe = DeviceProbe(batch=2048)
    untimed_evaluation = True
    sample_name = "positions"

    mini = Scale(MINI, selfplay.NoDataset())
    full = Scale(FULL_RECIPES, selfplay.NoDataset())

    def assets(self, recipe: MiniGoRecipe, data_dir: Path | None) -> dict[str, Path]:
        found: dict[str, Path] = {}
        if recipe.target_model != "none":
            if recipe.target_model:
                found["target model"] = Path(recipe.target_model).expanduser()
            elif recipe.board_size == MINI.board_size and recipe.width == MINI.width and recipe.blocks == MINI.blocks:
                found["target model"] = MINI_TARGET
        if recipe.bootstrap:
            found["bootstrap"] = Path(recipe.bootstrap).expanduser()
        return found

    def mlperf_hyperparameters(self, recipe: MiniGoRecipe, ctx: RuntimeContext) -> dict[str, Any]:
        return {
            "train_batch_size": recipe.global_batch_size,
            "lr_boundaries": list(recipe.lr_boundaries),
            "lr_rates": list(recipe.lr_rates),
            "min_selfplay_games_per_generation": recipe.games_per_generation,
            # Informational, as the reference's logs carry them.
            "num_readouts": recipe.readouts,
            "virtual_losses": recipe.virtual_losses,
            "filter_amount": recipe.train_filter,
            "window_size": recipe.window,
            "eval_games": recipe.eval_games,
            "opt_weight_decay": recipe.l2,
            "value_init_penalty": recipe.value_init_penalty,
            "holdout_pct": recipe.holdout_pct,
            "disable_resign_pct": recipe.disable_resign_pct,
            # The self-play range under the reference's flag names (NVIDIA's `resign_threshold` is its
            # evaluation's flag, where the reference does not resign).
            "min_resign_threshold": recipe.min_resign_threshold,
            "max_resign_threshold": recipe.max_resign_threshold,
        }

    def notes(self, recipe: MiniGoRecipe, scale: str) -> list[str]:
        if scale != "full" or recipe.board_size == 19:
            return []
        return [f"recipe {recipe.name}: v0.6's flags, but the network reads v0.7's 13 input planes (v0.6 read 17: "
                "8 moves of history); an open-division recipe, not comparable with a v0.6 result"]

    def network(self, recipe: MiniGoRecipe) -> minigo_model.DualNet:
        return minigo_model.DualNet(recipe.board_size, recipe.width, recipe.blocks, recipe.fc_width)

    def build(self, recipe: MiniGoRecipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        model = self.network(recipe)
        if "bootstrap" in assets:
            model.load_state_dict(assets.state_dict("bootstrap", like=model.state_dict(), what="this recipe's network"))
        model = model.to(ctx.device)
        impl = kernels(recipe.fused_optimizer)
        optimizer = torch.optim.SGD(minigo_model.param_groups(model, recipe.l2), lr=recipe.lr_rates[0],
                                    momentum=recipe.momentum,
                                    **impl)

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            planes, policy, outcome = batch
            return minigo_model.loss(model, planes, policy, outcome, recipe.value_weight)

        return ModelParts(model=model, optimizer=optimizer, loss_fn=loss_fn, eval_forward=_forward,
                          lr_schedule=lambda steps_per_epoch: lr_factor(recipe))

    def check_assets(self, recipe: MiniGoRecipe, assets: Assets) -> None:
        if "target model" in assets:
            self.target_network(recipe, assets)  # a few MB: loaded and shape-checked before the run

    def target_network(self, recipe: MiniGoRecipe, assets: Assets) -> minigo_model.DualNet:
        """The fixed opponent, loaded with weights_only=True and shape-checked; the shipped mini target
        must also match its manifest's SHA-256."""
        path = assets["target model"]
        if path == MINI_TARGET:
            manifest = json.loads(MINI_MANIFEST.read_text())
            if sha256(path) != manifest.get("sha256"):
                raise TrainperfError(f"{path}: SHA-256 differs from {MINI_MANIFEST} (a damaged or replaced file: "
                                     "the mini's target was calibrated against the shipped one; reinstall trainperf)")
        target = self.network(recipe)
        target.load_state_dict(assets.state_dict("target model", like=target.state_dict(),
                                                 what="this recipe's network"))
        return target.eval()

    def synthetic_batch(self, recipe: MiniGoRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        n, points = ctx.batch_share(recipe.global_batch_size), recipe.board_size ** 2
        gen = torch.Generator().manual_seed(0)
        planes = torch.randint(0, 2, (n, go.PLANES, recipe.board_size, recipe.board_size), generator=gen,
                               dtype=torch.uint8)
        policy = torch.softmax(torch.randn(n, points + 1, generator=gen), dim=1)
        outcome = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
        return planes.to(ctx.device), policy.to(ctx.device), outcome.to(ctx.device)

    def synthetic_eval_batch(self, recipe: MiniGoRecipe, ctx: RuntimeContext, model: nn.Module) -> Any:
        return self.synthetic_batch(recipe, ctx, model)[0][:recipe.virtual_losses * 8]

    def logged_during_run(self, recipe: MiniGoRecipe) -> dict[str, Any]:
        # Logged by each generation's self-play (train_batches): the games it played, all processes'.
        return {"actual_selfplay_games_per_generation": recipe.games_per_generation}

    # -- the loop ---------------------------------------------------------------------------------
    def load_data(self, recipe: MiniGoRecipe, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        if recipe.games_per_generation % ctx.world_size or (recipe.eval_games // ctx.world_size) % 2:
            raise TrainperfError(f"minigo: games_per_generation ({recipe.games_per_generation}) must divide by the "
                                 f"{ctx.world_size} processes, and eval_games ({recipe.eval_games}) into even shares")
        game = go.load_game(recipe.board_size, recipe.komi)
        assets = Assets(self.assets(recipe, data_dir))
        if recipe.target_model != "none" and "target model" not in assets:
            raise TrainperfError("minigo: --set target_model=PATH (the target network, a state dict of this recipe's "
                                 "network: the reference's target converted, or one made with make-minigo-target)")
        assets.check()
        target = self.target_network(recipe, assets).to(ctx.device) if "target model" in assets else None
        window: deque[selfplay.Examples] = deque(maxlen=recipe.window)
        per_rank_batch = ctx.batch_share(recipe.global_batch_size)
        games = recipe.games_per_generation // ctx.world_size
        device = ctx.device
        totals = {"games": 0.0, "moves": 0.0, "network evaluations": 0.0}

        def train_batches(view: EpochView) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            rng = np.random.default_rng(ctx.stream_seed(f"self-play {view.epoch}", per_rank=True))
            evaluator = minigo_model.NetworkEvaluator(view.model, device)
            examples, stats = selfplay.selfplay(game, evaluator, games, play_config(recipe), rng)
            totals["games"] += stats.games
            totals["moves"] += stats.moves
            totals["network evaluations"] += evaluator.positions
            view.log("actual_selfplay_games_per_generation", games * ctx.world_size)
            window.append(examples)
            pool = selfplay.Examples.concat(list(window))
            chosen = rng.permutation(len(pool))[:max(1, round(recipe.train_filter * len(pool)))]
            # Every rank must take the same number of steps (gradients are all-reduced): rank 0's count.
            steps = ctx.broadcast_object(len(chosen) // per_rank_batch)
            chosen = np.resize(chosen, max(steps * per_rank_batch, 1))
            for s in range(steps):
                idx = chosen[s * per_rank_batch:(s + 1) * per_rank_batch]
                planes, policy = augment(pool.planes[idx], pool.policy[idx], rng)
                yield (torch.from_numpy(planes).to(device), torch.from_numpy(policy).to(device),
                       torch.from_numpy(pool.outcome[idx]).to(device))

        def evaluate(forward: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]) -> EvalPartial:
            if target is None:
                raise TrainperfError("minigo: no target model to evaluate against (target_model=none)")

            def candidate(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                logits, value = forward(torch.from_numpy(planes).to(device))
                return (torch.softmax(logits.float(), 1).cpu().numpy().astype(np.float64),
                        value.float().cpu().numpy().astype(np.float64))

            rng = np.random.default_rng(ctx.stream_seed("evaluation", per_rank=True))
            config = play_config(recipe, evaluation=True)
            result = selfplay.match(game, selfplay.SearchPlayer(candidate, config),
                                    selfplay.SearchPlayer(minigo_model.NetworkEvaluator(target, device),
                             config), recipe.eval_games // ctx.world_size, rng)
            counts = torch.tensor([result.wins, result.games, result.wins_as_black, result.black_wins],
                                  dtype=torch.float64)
            return EvalPartial(metric=win_rate, sums={"counts": counts})

        return DataParts(train_batches=train_batches, steps_per_epoch=None, train_samples=None,
                         eval_samples=recipe.eval_games, evaluate=evaluate, counters=lambda: dict(totals))

    def make(self, command: str, out: Path, say: Callable[[str], None], options: dict[str, Any]) -> None:
        """`trainperf make-minigo-target`: the mini's shipped target model (see target.py)."""
        from trainperf.workloads.minigo import target as minigo_target

        seed = options.get("seed")
        minigo_target.make_target(self, out, options.get("generations") or minigo_target.GENERATIONS, say,
                                  minigo_target.SEED if seed is None else seed)


def win_rate(totals: dict[str, Any]) -> float:
    wins, games = totals["counts"].tolist()[:2]
    return wins / games if games else 0.0


def augment(planes: np.ndarray, policy: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each example under one of the board's 8 symmetries, drawn at random (the reference's random
    rotation in training)."""
    out_planes, out_policy = np.empty_like(planes), np.empty_like(policy)
    for i, k in enumerate(rng.integers(0, 8, len(planes))):
        out_planes[i], out_policy[i] = go.symmetries(planes[i], policy[i], int(k))
    return out_planes, out_policy


# What trainperf's registry finds in this package (registry.py reads this line; nothing is imported).
WORKLOAD = MiniGoWorkload
# The assets `trainperf make-*` builds for it (registry.py reads this literal; nothing is imported).
MAKES = {"make-minigo-target": {"help": "train the mini MiniGo's target model (shipped in the package)",
                                "out": "minigo-target", "files": "target.pt, target.json", "generations": None,
                                "seed": None}}
