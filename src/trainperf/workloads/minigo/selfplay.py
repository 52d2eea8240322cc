"""Self-play games (the training data MiniGo's network produces for itself) and evaluation matches
against the target model, each playing many games at once so that every network call evaluates the
leaves of all of them.

Self-play follows the reference's selfplay flags: each move is searched with `readouts`, or, with
probability `fastplay_frequency`, with `fastplay_readouts` and then not kept for training (playout cap
randomisation); full searches get Dirichlet noise at the root; the first `softpick_moves` moves are
drawn in proportion to the visits, later ones are the most visited; a player resigns when its best
move's value falls below the game's threshold (drawn per game from [`min_resign_threshold`,
`max_resign_threshold`)), except in a `disable_resign_pct` share of games, which play on and so measure
how often resigning would have been wrong; a `holdout_pct` share of games is played but not trained
on. A training example is a full search's position (feature planes), its visit distribution and the
game's result for the player to move there.

A match plays an even number of games, the candidate taking black in the first of each pair and white
in the second; no noise, no resignation (the reference's eval flags); the first `softpick_moves` moves
are drawn by visits so that games differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainperf.contract import DataSource
from trainperf.workloads.minigo import go, mcts


@dataclass(frozen=True)
class PlayConfig:
    search: mcts.SearchConfig
    readouts: int
    fastplay_frequency: float = 0.0
    fastplay_readouts: int = 0
    softpick_moves: int = 30
    # Each game resigns below its own threshold, drawn uniformly from [min, max) (the reference's
    # concurrent_selfplay; min == max: one fixed threshold, v0.6's); -1: never resign.
    min_resign_threshold: float = -1.0
    max_resign_threshold: float = -1.0
    disable_resign_pct: float = 0.0
    holdout_pct: float = 0.0  # games played but kept out of training (the reference's holdout directory)
    # The reference's concurrent_selfplay (flags/19): the recorded policy is the pruned visits
    # (`mcts.pruned_visits`), visits count ** visits_exponent in the opening (move choice and target), the
    # opening never draws a pass, and a full search starts from a fresh tree when fast-play is on. The
    # defaults are the plain AlphaZero choices (the mini's).
    target_pruning: bool = False
    visits_exponent: float = 1.0
    soft_pass: bool = True
    fresh_full_search: bool = False


@dataclass
class Examples:
    planes: np.ndarray  # uint8 [M, 13, N, N]
    policy: np.ndarray  # float32 [M, N*N+1]
    outcome: np.ndarray  # float32 [M]: +1 if the player to move won

    def __len__(self) -> int:
        return len(self.outcome)

    @staticmethod
    def concat(parts: Sequence[Examples]) -> Examples:
        return Examples(np.concatenate([p.planes for p in parts]), np.concatenate([p.policy for p in parts]),
                        np.concatenate([p.outcome for p in parts]))


@dataclass
class GameStats:
    games: int = 0
    moves: int = 0
    black_wins: int = 0
    resigned: int = 0
    resign_disabled: int = 0
    held_out: int = 0
    false_resigns: int = 0  # among resign-disabled games: the side that would have resigned won
    readouts: int = 0
    lengths: list[int] = field(default_factory=list)

    @property
    def false_resign_rate(self) -> float:
        return self.false_resigns / self.resign_disabled if self.resign_disabled else 0.0


@dataclass
class _Game:
    root: mcts.Node
    resign_allowed: bool
    resign_threshold: float
    held_out: bool = False
    planes: list[np.ndarray] = field(default_factory=list)
    policies: list[np.ndarray] = field(default_factory=list)
    players: list[int] = field(default_factory=list)
    would_resign: int = 0  # the colour that would have resigned first, in a resign-disabled game
    result: int | None = None
    moves: int = 0


def game_settings(config: PlayConfig, rng: np.random.Generator) -> tuple[bool, float, bool]:
    """One self-play game's draw: whether it may resign, below which value, and whether it is held out."""
    allowed = bool(rng.random() >= config.disable_resign_pct)
    # Drawn only when there is something to draw, so that a fixed setting keeps its random stream.
    low, high = config.min_resign_threshold, config.max_resign_threshold
    threshold = float(rng.uniform(low, high)) if low < high else low
    held_out = bool(config.holdout_pct > 0 and rng.random() < config.holdout_pct)
    return allowed, threshold, held_out


def selfplay(game: object, evaluate: mcts.Evaluator, games: int, config: PlayConfig, rng: np.random.Generator
             ) -> tuple[Examples, GameStats]:
    """Play `games` games of the network against itself; their full searches as training examples."""
    reasonable = config.search.reasonable_moves
    playing = [_Game(mcts.Node(go.start(game), reasonable=reasonable), *game_settings(config, rng))
               for _ in range(games)]
    stats = GameStats(games=games)
    active = list(playing)
    while active:
        fast = rng.random(len(active)) < config.fastplay_frequency
        if config.fresh_full_search and config.fastplay_frequency > 0:
            for g, f in zip(active, fast, strict=True):
                if not f and g.moves:  # the reference's ClearSubtrees: the root's statistics go too
                    g.root = mcts.Node(g.root.position, reasonable=reasonable)
        readouts = [config.fastplay_readouts if f else config.readouts for f in fast]
        mcts.search([g.root for g in active], evaluate, config.search, readouts, noise=~fast, rng=rng)
        stats.readouts += sum(readouts)
        still = []
        for g, f in zip(active, fast, strict=True):
            position = g.root.position
            if not f:
                g.planes.append(go.features(position))
                exponent = config.visits_exponent if g.moves < config.softpick_moves else 1.0
                g.policies.append(mcts.search_target(g.root, config.search, config.target_pruning,
                                                     exponent).astype(np.float32))
                g.players.append(position.to_play)
            value = g.root.best_value()
            if value < g.resign_threshold:
                if g.resign_allowed:
                    g.result = -position.to_play
                    stats.resigned += 1
                elif not g.would_resign:
                    g.would_resign = position.to_play
            if g.result is None:
                move = mcts.choose(g.root, rng, g.moves < config.softpick_moves, config.visits_exponent,
                                   config.soft_pass)
                g.root = mcts.advance(g.root, move)
                g.moves += 1
                if g.root.position.is_over():
                    g.result = g.root.position.result()
            if g.result is None:
                still.append(g)
        active = still
    for g in playing:
        assert g.result is not None
        stats.moves += g.moves
        stats.lengths.append(g.moves)
        stats.black_wins += g.result == go.BLACK
        stats.held_out += g.held_out
        if not g.resign_allowed:
            stats.resign_disabled += 1
            stats.false_resigns += bool(g.would_resign) and g.result == g.would_resign
    trained = [g for g in playing if not g.held_out]
    examples = Examples(
        np.stack([p for g in trained for p in g.planes]) if any(g.planes for g in trained)
        else np.zeros((0, go.PLANES, 1, 1), np.uint8),
        np.stack([p for g in trained for p in g.policies]) if any(g.policies for g in trained)
        else np.zeros((0, 1), np.float32),
        np.array([g.result * player for g in trained for player in g.players], dtype=np.float32))
    return examples, stats


@dataclass
class MatchResult:
    games: int
    wins: int  # the candidate's
    wins_as_black: int
    wins_as_white: int
    black_wins: int  # either side's, to see the colour's advantage under the komi

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0


class SearchPlayer:
    """A network with the search: the moves of many games from one batched search."""

    def __init__(self, evaluate: mcts.Evaluator, config: PlayConfig) -> None:
        self.evaluate, self.config = evaluate, config

    def moves(self, positions: Sequence[go.Position], moves_played: Sequence[int], rng: np.random.Generator
              ) -> list[int]:
        roots = [mcts.Node(p, reasonable=self.config.search.reasonable_moves) for p in positions]
        mcts.search(roots, self.evaluate, self.config.search, self.config.readouts)
        config = self.config
        return [mcts.choose(r, rng, n < config.softpick_moves, config.visits_exponent, config.soft_pass)
                for r, n in zip(roots, moves_played, strict=True)]


class RandomPlayer:
    """Uniformly random legal moves (the pass included): the floor a network must beat."""

    def moves(self, positions: Sequence[go.Position], moves_played: Sequence[int], rng: np.random.Generator
              ) -> list[int]:
        return [int(rng.choice(np.flatnonzero(p.legal_mask()))) for p in positions]


class CapturePlayer:
    """One ply of greed: the legal move that captures the most stones, else a random one (never the
    pass while a board move is legal)."""

    def moves(self, positions: Sequence[go.Position], moves_played: Sequence[int], rng: np.random.Generator
              ) -> list[int]:
        chosen = []
        for p in positions:
            legal = np.flatnonzero(p.legal_mask())
            board_moves = legal[legal < p.passes] if (legal < p.passes).any() else legal
            before = int((p.board == -p.to_play).sum())
            gains = np.array([before - int((p.play(m).board == -p.to_play).sum()) for m in board_moves])
            best = board_moves[gains == gains.max()]
            chosen.append(int(rng.choice(best)))
        return chosen


def match(game: object, candidate: object, target: object, games: int, rng: np.random.Generator) -> MatchResult:
    """The candidate player against the target over `games` (even) games, colours alternating."""
    if games < 2 or games % 2:
        raise ValueError(f"a match needs an even number of games, got {games}")
    positions = [go.start(game) for _ in range(games)]
    candidate_colour = [go.BLACK if i % 2 == 0 else go.WHITE for i in range(games)]
    moves = [0] * games
    active = list(range(games))
    while active:
        for player, mine in ((candidate, True), (target, False)):
            turn = [i for i in active
                    if not positions[i].is_over() and (positions[i].to_play == candidate_colour[i]) == mine]
            if not turn:
                continue
            chosen = player.moves([positions[i] for i in turn], [moves[i] for i in turn], rng)  # type: ignore[attr-defined]
            for i, move in zip(turn, chosen, strict=True):
                positions[i] = positions[i].play(move)
                moves[i] += 1
        active = [i for i in active if not positions[i].is_over()]
    results = [p.result() for p in positions]
    wins = [r == c for r, c in zip(results, candidate_colour, strict=True)]
    return MatchResult(games=games, wins=sum(wins),
                       wins_as_black=sum(w for w, c in zip(wins, candidate_colour, strict=True) if c == go.BLACK),
                       wins_as_white=sum(w for w, c in zip(wins, candidate_colour, strict=True) if c == go.WHITE),
                       black_wins=sum(r == go.BLACK for r in results))


class NoDataset(DataSource):
    """MiniGo reads no dataset at either scale: its training data is self-play, made during the run. A
    folder of trainperf's cache stands for it (nothing is read there)."""

    generated = True

    def problems(self, data_dir: Path) -> list[str]:
        return []

    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        say("minigo: nothing to prepare (its training data is self-play, made during the run)")
