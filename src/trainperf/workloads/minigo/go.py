"""Go positions for MiniGo on OpenSpiel's Go (rules, captures, ko, komi and area scoring are its C++
code), and the network's input: MiniGo's "mlperf07" feature planes.

OpenSpiel keeps each position as a C++ state; cloning one takes ~0.7 us and listing legal moves ~1.5
us here, so a search clones states freely. What it does not give is what the features need: the
boards of the last moves and each group's liberties. A `Position` keeps the last four boards beside the
state (read from OpenSpiel's observation planes, never recomputed by our own rules), and `features`
derives liberties from a board by connected-component labelling (scipy).

Coordinates are OpenSpiel's: action a is the point (a // N, a % N), row 0 being the first rank ("a1"
is action 0); action N*N is the pass. Boards hold +1 for black stones, -1 for white, 0 for empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage

from trainperf.errors import TrainperfError

BLACK, WHITE = 1, -1
HISTORY = 4  # boards the stone planes look back over (mlperf07: 4, own and opponent stones each)
PLANES = 2 * HISTORY + 1 + 3 + 1  # stones, colour to play, few liberties (1, 2, 3), would-capture
# Groups connect orthogonally, within a layer only (black and white labelled in one call).
_FOUR_IN_LAYERS = np.stack([np.zeros((3, 3), bool), ndimage.generate_binary_structure(2, 1), np.zeros((3, 3), bool)])


def load_game(board_size: int, komi: float) -> Any:
    """OpenSpiel's Go for a board size and komi (max game length: its default, 2 x points)."""
    try:
        import pyspiel
    except ImportError:  # pragma: no cover - a core dependency; an installation without it is broken
        raise TrainperfError("minigo needs OpenSpiel: pip install open-spiel") from None
    if not 2 <= board_size <= 19:
        raise TrainperfError(f"board_size={board_size}: expected 2..19 (OpenSpiel's Go)")
    return pyspiel.load_game("go", {"board_size": board_size, "komi": float(komi)})


@dataclass(frozen=True)
class Position:
    """A position: OpenSpiel's state, the last HISTORY boards (newest first) and who plays next."""

    state: Any
    boards: tuple[np.ndarray, ...]
    to_play: int
    size: int
    last_move: int = -1  # -1 at the start

    @property
    def passed(self) -> bool:
        """Whether the last move was a pass (one more ends the game)."""
        return self.last_move == self.size * self.size

    @property
    def board(self) -> np.ndarray:
        return self.boards[0]

    @property
    def passes(self) -> int:
        return self.size * self.size

    def is_over(self) -> bool:
        return self.state.is_terminal()

    def legal_mask(self) -> np.ndarray:
        """bool [N*N + 1]: OpenSpiel's legal moves (suicide and positional superko refused there)."""
        mask = np.zeros(self.passes + 1, dtype=bool)
        mask[self.state.legal_actions()] = True
        return mask

    def reasonable_mask(self) -> np.ndarray:
        """The legal moves a sensible player considers: no filling of its own eye (an empty point whose
        neighbours are all its stones), and the pass only when the opponent just passed or nothing
        else is left. The rules allow more; a search over few readouts otherwise drifts into passing
        early and filling eyes (see the README)."""
        mask = self.legal_mask()
        board = self.board
        own = np.zeros((self.size + 2, self.size + 2), dtype=bool)
        own[1:-1, 1:-1] = board == self.to_play
        edge = np.ones_like(own)
        edge[1:-1, 1:-1] = False
        wall = own | edge
        eye = (board == 0) & wall[:-2, 1:-1] & wall[2:, 1:-1] & wall[1:-1, :-2] & wall[1:-1, 2:]
        mask[:-1] &= ~eye.reshape(-1)
        if not self.passed and mask[:-1].any():
            mask[-1] = False
        return mask

    def result(self) -> int:
        """+1 if black won, -1 if white won (area scoring with komi, OpenSpiel's), 0 for a draw."""
        return int(np.sign(self.state.returns()[0]))

    def play(self, action: int) -> Position:
        state = self.state.clone()
        state.apply_action(int(action))
        return Position(state, (read_board(state, self.size),) + self.boards[:HISTORY - 1], -self.to_play, self.size,
                        int(action))


def start(game: Any) -> Position:
    state = game.new_initial_state()
    size = int(game.get_parameters()["board_size"])
    board = read_board(state, size)
    return Position(state, (board,) * HISTORY, BLACK, size)


def read_board(state: Any, size: int) -> np.ndarray:
    """The board of an OpenSpiel Go state: its observation planes are black, white, empty, to-play."""
    # Player 0's view (the planes are the same for both players; a finished game has no current one).
    planes = np.asarray(state.observation_tensor(0), dtype=np.float32).reshape(4, size, size)
    return (planes[0] - planes[1]).astype(np.int8)


def liberties(board: np.ndarray) -> np.ndarray:
    """int [N, N]: at each stone, the number of liberties of its group; 0 at empty points."""
    n, m = board.shape
    # Both colours labelled in one call: two layers that never connect to each other.
    groups, count = ndimage.label(np.stack([board == BLACK, board == WHITE]), structure=_FOUR_IN_LAYERS)
    groups = groups[0] + groups[1]
    if count == 0:
        return np.zeros(board.shape, dtype=np.int32)
    empty = np.zeros((n + 2, m + 2), dtype=bool)
    empty[1:-1, 1:-1] = board == 0
    # An empty point is a liberty of every group beside it: mark (group, point) pairs once each.
    seen = np.zeros((count + 1, (n + 2) * (m + 2)), dtype=bool)
    rows, cols = np.nonzero(groups)
    owner = groups[rows, cols]
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        r, c = rows + dr + 1, cols + dc + 1
        free = empty[r, c]
        seen[owner[free], r[free] * (m + 2) + c[free]] = True
    per_group = seen.sum(axis=1)
    return per_group[groups] * (groups > 0)


def features(position: Position) -> np.ndarray:
    """MiniGo's mlperf07 planes, uint8 [13, N, N]: for each of the last 4 boards (newest first) the
    stones of the player to move then the opponent's (a board before the game's start repeats the
    oldest); a plane of ones when black is to play; the stones whose group has 1, 2 or 3 liberties
    (one plane each); the points where the player to move would capture (the last liberty of an
    opponent group in atari)."""
    n = position.size
    planes = np.zeros((PLANES, n, n), dtype=np.uint8)
    me = position.to_play
    for i, board in enumerate(position.boards):
        planes[2 * i] = board == me
        planes[2 * i + 1] = board == -me
    planes[2 * HISTORY] = me == BLACK
    libs = liberties(position.board)
    for k in (1, 2, 3):
        planes[2 * HISTORY + k] = libs == k
    planes[2 * HISTORY + 4] = would_capture(position.board, libs, me)
    return planes


def would_capture(board: np.ndarray, libs: np.ndarray, me: int) -> np.ndarray:
    """bool [N, N]: the empty points beside an opponent stone whose group has exactly one liberty."""
    n, m = board.shape
    in_atari = np.zeros((n + 2, m + 2), dtype=bool)
    in_atari[1:-1, 1:-1] = (board == -me) & (libs == 1)
    beside = in_atari[:-2, 1:-1] | in_atari[2:, 1:-1] | in_atari[1:-1, :-2] | in_atari[1:-1, 2:]
    return beside & (board == 0)


def symmetries(planes: np.ndarray, policy: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k-th of the board's 8 symmetries (k in 0..7: k % 4 quarter turns, then a transpose when
    k >= 4) of planes [..., N, N] and of a policy [N*N + 1] over its points (the pass stays)."""
    n = planes.shape[-1]
    board_policy = policy[:-1].reshape(n, n)

    def turn(x: np.ndarray) -> np.ndarray:
        x = np.rot90(x, k % 4, axes=(-2, -1))
        return np.swapaxes(x, -1, -2) if k >= 4 else x

    return (np.ascontiguousarray(turn(planes)),
            np.concatenate([np.ascontiguousarray(turn(board_policy)).reshape(-1), policy[-1:]]))
