"""Monte Carlo tree search as MiniGo plays it (PUCT with MiniGo's growing exploration constant,
unvisited moves valued at the parent's value minus a penalty, virtual losses, Dirichlet noise at the
root), with the leaves of many trees evaluated by the network in one batch.

Values are from the point of view of the player to move at a node: a node's `value_sum[a]` sums what
playing `a` was worth to that player. The network's value head answers for the player to move in
the position it sees, so backing up flips the sign at each ply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trainperf.workloads.minigo import go

# evaluate(planes uint8 [B, 13, N, N]) -> (move probabilities [B, N*N+1], values [B] for the player to move)
Evaluator = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SearchConfig:
    readouts: int = 800
    virtual_losses: int = 4  # leaves one tree sends to each batch, each made unattractive to the next
    c_puct_base: float = 19652.0
    c_puct_init: float = 1.25
    # The reference's tree doubles the AlphaZero exploration term: U_scale = 2 (log((1 + N + base) / base)
    # + init) (cc/mcts_tree.h). 1: AlphaZero's (the mini's calibrated choice).
    c_puct_scale: float = 1.0
    value_init_penalty: float = 0.2
    dirichlet_alpha: float = 0.03
    noise_mix: float = 0.3  # share of Dirichlet noise in the root's priors (self-play only)
    reasonable_moves: bool = False  # search only `Position.reasonable_mask` moves (the mini's choice)


class Node:
    """A position in a tree and the statistics of the moves from it (arrays over N*N+1 moves)."""

    __slots__ = ("position", "parent", "move", "children", "prior", "visits", "value_sum", "legal", "expanded",
                 "pending", "reasonable")

    def __init__(self, position: go.Position, parent: Node | None = None, move: int = -1,
                 reasonable: bool = False) -> None:
        self.position, self.parent, self.move = position, parent, move
        self.children: dict[int, Node] = {}
        moves = position.passes + 1
        self.prior = np.zeros(moves, dtype=np.float64)
        self.visits = np.zeros(moves, dtype=np.float64)
        self.value_sum = np.zeros(moves, dtype=np.float64)
        self.reasonable = reasonable
        if position.is_over():
            self.legal = np.zeros(moves, dtype=bool)
        else:
            self.legal = position.reasonable_mask() if reasonable else position.legal_mask()
        self.expanded = False
        self.pending = False  # sent to the network, not back yet

    @property
    def total_visits(self) -> float:
        return float(self.visits.sum())

    def mean_value(self) -> float:
        """What this position is worth to its player to move, by the search so far (0 before any)."""
        n = self.visits.sum()
        return float(self.value_sum.sum() / n) if n > 0 else 0.0

    def child_values(self, penalty: float) -> np.ndarray:
        q = np.full(self.visits.shape, max(-1.0, self.mean_value() - penalty))
        seen = self.visits > 0
        q[seen] = self.value_sum[seen] / self.visits[seen]
        return q

    def pick(self, config: SearchConfig) -> int:
        """The move maximising Q + U (PUCT: U = (log((1 + N + base) / base) + init) sqrt(N) P / (1 + n)),
        among legal moves. After a pass, the answering pass (which ends the game) is looked at first,
        as MiniGo does, so that a search never loses by passing too early without seeing it."""
        if self.position.passed and self.legal[-1] and self.visits[-1] == 0:
            return len(self.visits) - 1
        total = self.visits.sum()
        u = u_scale(total, config) * self.prior * math.sqrt(max(total, 1.0)) / (1 + self.visits)
        score = self.child_values(config.value_init_penalty) + u
        score[~self.legal] = -np.inf
        return int(np.argmax(score))

    def child(self, move: int) -> Node:
        found = self.children.get(move)
        if found is None:
            found = self.children[move] = Node(self.position.play(move), self, move, self.reasonable)
        return found

    def expand(self, probabilities: np.ndarray) -> None:
        p = np.where(self.legal, probabilities, 0.0)
        total = p.sum()
        self.prior = p / total if total > 0 else self.legal / max(self.legal.sum(), 1)
        self.expanded = True

    def add_noise(self, rng: np.random.Generator, config: SearchConfig) -> None:
        legal = np.flatnonzero(self.legal)
        noise = rng.dirichlet([config.dirichlet_alpha] * len(legal))
        self.prior[legal] = (1 - config.noise_mix) * self.prior[legal] + config.noise_mix * noise

    def policy(self) -> np.ndarray:
        """The visit distribution over moves (the training target)."""
        n = self.visits.sum()
        return self.visits / n if n > 0 else self.legal / max(self.legal.sum(), 1)

    def best_value(self) -> float:
        """The value of the most visited move for this node's player (resignation looks at it)."""
        move = int(np.argmax(self.visits))
        return float(self.value_sum[move] / self.visits[move]) if self.visits[move] > 0 else self.mean_value()


def u_scale(visits: float, config: SearchConfig) -> float:
    """PUCT's exploration coefficient at a node visited `visits` times."""
    return config.c_puct_scale * (math.log((1 + visits + config.c_puct_base) / config.c_puct_base)
                                  + config.c_puct_init)


def pruned_visits(root: Node, config: SearchConfig) -> np.ndarray:
    """The reference's target pruning (cc/mcts_tree.cc ReshapeFinalVisits): every move but the most
    visited keeps only the visits its exploration bonus explains — the fewest n for which the best move's
    Q + U still beats Q_i + U_scale P_i sqrt(N) / n — so that the training target does not learn the
    search's exploration. The move played is chosen from the raw visits; this is the target only."""
    visits = root.visits.copy()
    total = float(visits.sum())
    if total <= 0:
        return visits
    q = root.child_values(config.value_init_penalty)
    scale = u_scale(total, config)
    best = int(np.argmax(visits))
    best_score = q[best] + scale * math.sqrt(1 + total) * root.prior[best] / (1 + visits[best])
    gap = best_score - q
    with np.errstate(divide="ignore", invalid="ignore"):
        explained = np.where(gap > 0, np.floor(scale * root.prior * math.sqrt(total) / gap), 0.0)
    keep = np.maximum(0.0, np.minimum(visits, explained))
    keep[best] = visits[best]
    if keep.sum() <= 0:  # nothing left: the reference's fallback, a pass
        keep[-1] = 1.0
    return keep


def search_target(root: Node, config: SearchConfig, prune: bool, exponent: float) -> np.ndarray:
    """The recorded policy: the (pruned) visits raised to `exponent` (the reference's 0.98 during the
    opening), normalised."""
    if not prune and exponent == 1.0:
        return root.policy()
    visits = pruned_visits(root, config) if prune else root.visits
    weights = visits ** exponent
    n = weights.sum()
    return weights / n if n > 0 else root.legal / max(root.legal.sum(), 1)


def _select_leaf(root: Node, config: SearchConfig) -> Node:
    """Walk down from the root by PUCT, adding a virtual loss on the way (undone at backup)."""
    node = root
    while node.expanded and not node.position.is_over():
        move = node.pick(config)
        node.visits[move] += 1
        node.value_sum[move] -= 1  # virtual loss: a loss for the player choosing, until the value is back
        node = node.child(move)
    return node


def _backup(leaf: Node, value: float) -> None:
    """`value` is the leaf's worth to its player to move; each edge above gets it for its chooser
    (undoing the virtual loss: +1 back, then the real value)."""
    node, v = leaf, value
    while node.parent is not None:
        parent, move = node.parent, node.move
        parent.value_sum[move] += 1 + (-v)
        v = -v
        node = parent


def _undo_virtual(leaf: Node) -> None:
    node = leaf
    while node.parent is not None:
        node.parent.visits[node.move] -= 1
        node.parent.value_sum[node.move] += 1
        node = node.parent


def search(roots: Sequence[Node], evaluate: Evaluator, config: SearchConfig, readouts: int | Sequence[int],
           noise: Sequence[bool] | np.ndarray | None = None, rng: np.random.Generator | None = None) -> None:
    """Grow every tree until its root has `readouts` (one count, or one per root) more visits. Each
    round sends up to `virtual_losses` new leaves per tree to one network call; a terminal leaf is
    valued by the game's result. Roots marked in `noise` get Dirichlet noise (drawn from `rng`) mixed
    into their priors first (self-play's full searches)."""
    counts = [readouts] * len(roots) if isinstance(readouts, int) else list(readouts)
    _expand_roots(roots, evaluate)
    if noise is not None:
        assert rng is not None, "noise needs an rng"
        for root, noisy in zip(roots, noise, strict=True):
            if noisy and not root.position.is_over():
                root.add_noise(rng, config)
    goal = {id(r): r.total_visits + n for r, n in zip(roots, counts, strict=True)}
    active = [r for r in roots if not r.position.is_over() and goal[id(r)] > r.total_visits]
    while active:
        leaves: list[Node] = []
        for root in active:
            for _ in range(min(config.virtual_losses, int(goal[id(root)] - root.total_visits))):
                leaf = _select_leaf(root, config)
                if leaf.position.is_over():
                    _backup(leaf, float(leaf.position.result() * leaf.position.to_play))
                elif leaf.pending:  # already on its way this round: this path was a wasted readout
                    _undo_virtual(leaf)
                    break
                else:
                    leaf.pending = True
                    leaves.append(leaf)
        if leaves:
            probabilities, values = evaluate(np.stack([go.features(leaf.position) for leaf in leaves]))
            for leaf, p, v in zip(leaves, probabilities, values, strict=True):
                leaf.pending = False
                leaf.expand(p)
                _backup(leaf, float(v))
        active = [r for r in active if r.total_visits < goal[id(r)]]


def _expand_roots(roots: Sequence[Node], evaluate: Evaluator) -> None:
    fresh = [r for r in roots if not r.expanded and not r.position.is_over()]
    if fresh:
        probabilities, _ = evaluate(np.stack([go.features(r.position) for r in fresh]))
        for root, p in zip(fresh, probabilities, strict=True):
            root.expand(p)


def choose(root: Node, rng: np.random.Generator, soft: bool, exponent: float = 1.0, soft_pass: bool = True
           ) -> int:
    """The move to play: while `soft` (the opening) drawn in proportion to visits ** exponent (the
    reference: 0.98, the pass never drawn), else the most visited."""
    if soft:
        if exponent == 1.0 and soft_pass:
            return int(rng.choice(len(root.visits), p=root.policy()))
        weights = root.visits ** exponent
        if not soft_pass:
            weights[-1] = 0.0
        n = weights.sum()
        if n <= 0:
            return len(root.visits) - 1
        return int(rng.choice(len(root.visits), p=weights / n))
    return int(np.argmax(root.visits))


def advance(root: Node, move: int) -> Node:
    """The subtree after `move`, kept for the next search (detached from its parent)."""
    child = root.child(move)
    child.parent, child.move = None, -1
    return child
