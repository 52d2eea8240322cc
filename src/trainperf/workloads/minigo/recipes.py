"""MiniGo's recipes: the reference's 19x19 (v0.7+) and the v0.6 9x9 settings, and the mini's 5x5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import annotated_types as at

from trainperf.contract import (
    Recipe,
)
from trainperf.contract.fields import Count, Fraction
from trainperf.errors import TrainperfError


@dataclass(frozen=True)
class MiniGoRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("lr_rates",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("lr_boundaries",)
    board_size: Count = 19
    komi: float = 7.5
    width: Count = 64  # residual trunk channels (conv_width)
    blocks: Count = 6  # trunk_layers
    fc_width: Count = 64
    value_weight: float = 0.5  # value_cost_weight
    l2: float = 1e-4
    momentum: Fraction = 0.9
    lr_rates: tuple[float, ...] = (0.016, 0.16, 0.016, 0.0016)
    lr_boundaries: tuple[int, ...] = (128, 10_000, 20_000)  # optimizer steps
    games_per_generation: Count = 8192  # min_games_per_iteration
    window: int = 5  # generations whose games are trained on
    train_filter: float = 0.3  # share of the window's positions trained on per generation
    readouts: Count = 800
    fastplay_frequency: float = 0.75
    fastplay_readouts: int = 80
    virtual_losses: Count = 4
    dirichlet_alpha: float = 0.03
    noise_mix: Fraction = 0.3
    value_init_penalty: float = 0.2
    softpick_moves: int = 30
    # The reference's flags/19 selfplay: each game draws its threshold from [min, max), resignation is
    # never disabled, no game is held out.
    min_resign_threshold: Annotated[float, at.Interval(ge=-1, le=0)] = -1.0
    max_resign_threshold: Annotated[float, at.Interval(ge=-1, le=0)] = -0.9
    disable_resign_pct: Annotated[float, at.Interval(ge=0, le=1)] = 0.0  # 1: every game plays to the end
    holdout_pct: Fraction = 0.0
    # The reference's search and targets (cc/mcts_tree, cc/concurrent_selfplay; see selfplay.PlayConfig):
    # PUCT's exploration doubled, pruned policy targets, visits ** 0.98 in the opening, no pass drawn
    # there, a fresh tree for each full search. The mini keeps AlphaZero's plain choices (calibrated).
    c_puct_scale: float = 2.0
    target_pruning: bool = True
    visits_exponent: float = 0.98
    soft_pass: bool = False
    fresh_full_search: bool = True
    eval_games: Count = 100
    eval_readouts: Count = 100
    eval_softpick_moves: int = 4
    # Search only sensible moves (no own-eye filling; the pass only after a pass or when nothing else is
    # left): the mini's few readouts need it; the reference searches every legal move.
    reasonable_moves: bool = False
    target_model: str = ""  # the target's state dict ("": the mini's shipped one; full: required)
    bootstrap: str = ""  # the generation-0 network's state dict (full: the reference's; "": random)

    def validate(self) -> None:
        super().validate()
        if not 2 <= self.board_size <= 19:
            raise TrainperfError(f"recipe field board_size={self.board_size}: expected 2..19")
        if len(self.lr_rates) != len(self.lr_boundaries) + 1 or list(self.lr_boundaries) != sorted(self.lr_boundaries):
            raise TrainperfError("recipe fields lr_rates and lr_boundaries: one more rate than boundaries, boundaries "
                                 "increasing")
        if self.eval_games < 2 or self.eval_games % 2:
            raise TrainperfError(f"recipe field eval_games={self.eval_games}: an even number >= 2 (colours alternate)")
        if self.games_per_generation < 1 or self.window < 1 or not 0 < self.train_filter <= 1:
            raise TrainperfError("recipe: need games_per_generation >= 1, window >= 1, 0 < train_filter <= 1")
        if self.min_resign_threshold > self.max_resign_threshold:
            raise TrainperfError(f"recipe fields min_resign_threshold={self.min_resign_threshold} and "
                                 f"max_resign_threshold={self.max_resign_threshold}: expected min <= max")
        if self.readouts < 1 or self.eval_readouts < 1 or not 0 <= self.fastplay_frequency < 1:
            raise TrainperfError("recipe: need readouts >= 1, eval_readouts >= 1, 0 <= fastplay_frequency < 1")


def _full(name: str, **fields: Any) -> MiniGoRecipe:
    base = {"global_batch_size": 4096, "max_epochs": 100, "target": 0.5, "eval_every": 1, "eval_first": 1}
    return MiniGoRecipe(name=name, **{**base, **fields})


FULL_RECIPES: dict[str, MiniGoRecipe] = {r.name: r for r in (
    # v0.7+ (flags/19): 19x19, 13 planes, 6 blocks of 64; 100 generations at most.
    _full("reference"),
    # v0.6 (flags/9): 9x9, 9 blocks of 32, value weight 0.25, 4,096 games, 240 readouts, window 10, train
    # filter 0.5, one fixed resign threshold (-0.99) disabled in 10 % of games, 3 % of games held out, no
    # target pruning (its flags do not ask for it; the rest of the search as v0.7's reference). Its
    # network reads v0.7's 13 input planes, not v0.6's 17 (an open-division recipe: notes() says so).
    _full("v0.6-9x9", board_size=9, width=32, blocks=9, value_weight=0.25, lr_rates=(0.16, 0.016, 0.0016),
          lr_boundaries=(25_000, 37_500), games_per_generation=4096, window=10, readouts=240, fastplay_frequency=0.0,
          fastplay_readouts=0, virtual_losses=8, max_epochs=50, train_filter=0.5, min_resign_threshold=-0.99,
          max_resign_threshold=-0.99, disable_resign_pct=0.1, holdout_pct=0.03, target_pruning=False),
)}

MINI = MiniGoRecipe(
    name="mini", global_batch_size=64, max_epochs=30, target=0.5, eval_every=1, eval_first=1, board_size=5,
    komi=7.5, width=32, blocks=3, fc_width=32, lr_rates=(0.02, 0.05, 0.01), lr_boundaries=(20, 600),
    games_per_generation=64, window=4, train_filter=1.0, readouts=48, fastplay_frequency=0.5, fastplay_readouts=12,
    dirichlet_alpha=0.25, softpick_moves=6, min_resign_threshold=-0.9, max_resign_threshold=-0.9,
    disable_resign_pct=0.2, eval_games=64, c_puct_scale=1.0, target_pruning=False, visits_exponent=1.0,
    soft_pass=True, fresh_full_search=False,
    eval_readouts=16, eval_softpick_moves=4, reasonable_moves=True)
