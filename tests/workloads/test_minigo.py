"""MiniGo: positions on OpenSpiel's Go, the mlperf07 feature planes against hand-written ones, the
search (a forced capture found, a self-atari avoided), and the dual network."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from trainperf.workloads.minigo import go, mcts
from trainperf.workloads.minigo import model as M

N = 5


def _points(*moves: int) -> np.ndarray:
    plane = np.zeros((N, N), dtype=np.uint8)
    for m in moves:
        plane[m // N, m % N] = 1
    return plane


def _play(*moves: int) -> go.Position:
    position = go.start(go.load_game(N, 7.5))
    for m in moves:
        position = position.play(m)
    return position


def test_feature_planes_of_a_known_position_are_the_hand_written_ones():
    # B c3, W c2, B b2, W d3 (action = row * 5 + column, row 0 the first rank); black to play.
    planes = go.features(_play(12, 7, 6, 13))
    expected = np.stack([
        _points(12, 6), _points(7, 13),  # now: black's (to play) stones, white's
        _points(12, 6), _points(7),      # one move ago
        _points(12), _points(7),         # two
        _points(12), _points(),          # three
        np.ones((N, N), np.uint8),       # black to play
        _points(),                       # stones whose group has 1 liberty
        _points(12, 7),                  # 2: c3 (b3, c4 free) and c2 (c1, d2 free)
        _points(6, 13),                  # 3
        _points(),                       # would capture: no white group in atari
    ])
    assert planes.shape == (go.PLANES, N, N) == (13, N, N)
    np.testing.assert_array_equal(planes, expected)


def test_liberties_and_the_capture_plane_see_an_atari():
    # B c3, W c2, B c1, W e5, B b2, W d5: white c2's last liberty is d2; black to play.
    position = _play(12, 7, 2, 24, 6, 23)
    planes = go.features(position)
    np.testing.assert_array_equal(planes[9], _points(7))  # c2 in atari
    np.testing.assert_array_equal(planes[12], _points(8))  # d2 captures it
    np.testing.assert_array_equal(planes[8], 1)
    captured = position.play(8)
    assert captured.board[1, 2] == 0 and captured.board[1, 3] == go.BLACK
    white = go.features(captured)  # white to play: own/opponent planes swap, colour plane is zeros
    np.testing.assert_array_equal(white[0], _points(24, 23))
    np.testing.assert_array_equal(white[8], 0)


def test_a_long_chain_counts_its_shared_liberties_once():
    board = np.zeros((N, N), np.int8)
    board[0, :] = go.BLACK  # the first rank: liberties are the 5 points above it
    board[1, 0] = go.WHITE
    libs = go.liberties(board)
    assert libs[0, 0] == 4 and libs[1, 0] == 2  # a2 is white's; b2..e2 are black's liberties


def test_symmetries_move_planes_and_policy_together():
    planes = go.features(_play(12, 7, 6, 13)).astype(np.float32)
    policy = np.zeros(N * N + 1)
    policy[7], policy[-1] = 0.75, 0.25
    seen = set()
    for k in range(8):
        turned, moved = go.symmetries(planes, policy, k)
        point = int(np.argmax(moved[:-1]))
        assert turned[1].reshape(-1)[point] == 1  # the policy's point is still white's c2 stone
        assert moved[-1] == 0.25 and moved.sum() == pytest.approx(1.0)
        seen.add(turned[:2].tobytes())
    assert len(seen) == 8


def material(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stand-in network: uniform priors, a value from the stone count (player to move's minus the
    opponent's): the search alone must find what material gains or loses a few plies ahead."""
    own = planes[:, 0].reshape(len(planes), -1).sum(1).astype(np.float64)
    other = planes[:, 1].reshape(len(planes), -1).sum(1).astype(np.float64)
    return np.full((len(planes), N * N + 1), 1.0 / (N * N + 1)), np.tanh(0.5 * (own - other))


def test_search_finds_a_forced_capture():
    root = mcts.Node(_play(12, 7, 2, 24, 6, 23))  # d2 captures white's c2
    mcts.search([root], material, mcts.SearchConfig(virtual_losses=4), readouts=300)
    assert int(np.argmax(root.visits)) == 8
    assert root.total_visits == pytest.approx(300)


def tactical(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stand-in network with priors that favour capturing moves (the would-capture plane), as a
    trained network's do: the opponent's reply to a self-atari is then looked at first."""
    _, value = material(planes)
    prior = np.concatenate([1.0 + 20.0 * planes[:, 12].reshape(len(planes), -1), np.ones((len(planes), 1))], 1)
    return prior / prior.sum(1, keepdims=True), value


def test_search_avoids_a_self_atari():
    # B c3, W b1, B d4, W d5; black to play. Black a1 (beside white b1) and e5 (beside white d5) would
    # each have one liberty, which white then takes.
    root = mcts.Node(_play(12, 1, 18, 23))
    mcts.search([root], tactical, mcts.SearchConfig(virtual_losses=4), readouts=400)
    q = root.value_sum / np.maximum(root.visits, 1)
    board_moves = np.flatnonzero(root.legal[:-1])
    safe = [m for m in board_moves if m not in (0, 24)]
    assert root.legal[0] and root.legal[24] and int(np.argmax(root.visits)) in safe
    assert max(q[0], q[24]) < 0.05 < min(q[safe])  # searched, and found to lose a stone
    assert max(root.visits[0], root.visits[24]) <= min(root.visits[safe])


def test_many_trees_share_one_network_call_per_round():
    calls = []

    def counting(planes):
        calls.append(len(planes))
        return material(planes)

    roots = [mcts.Node(_play(12)) for _ in range(6)]
    mcts.search(roots, counting, mcts.SearchConfig(virtual_losses=4), readouts=32)
    assert calls[0] == 6 and max(calls) == 24  # the roots, then 6 trees x 4 leaves per call
    assert all(r.total_visits == pytest.approx(32) for r in roots)


def test_the_dual_network_shapes_and_loss():
    torch.manual_seed(0)
    net = M.DualNet(N, width=8, blocks=2, fc_width=16)
    planes = torch.from_numpy(np.stack([go.features(_play(12)), go.features(_play(12, 7))]))
    logits, value = net(planes)
    assert logits.shape == (2, N * N + 1) and value.shape == (2,) and value.abs().max() <= 1
    target = torch.zeros(2, N * N + 1)
    target[:, 3] = 1
    loss = M.loss(net, planes, target, torch.tensor([1.0, -1.0]), 0.5)
    loss.backward()
    groups = M.param_groups(net, 1e-4)
    assert all(p.ndim == 1 for p in groups[1]["params"]) and groups[1]["weight_decay"] == 0
    probabilities, values = M.NetworkEvaluator(net, torch.device("cpu"))(planes.numpy())
    assert probabilities.sum(1) == pytest.approx(np.ones(2)) and net.training


# -- self-play, matches, the workload ------------------------------------------------------------
from tests.conftest import write_minimal_closed_log  # noqa: E402
from trainperf.contract import Assets, RuntimeContext  # noqa: E402
from trainperf.errors import TrainperfError  # noqa: E402
from trainperf.results.compliance import check  # noqa: E402
from trainperf.workloads import minigo as W  # noqa: E402
from trainperf.workloads.minigo import selfplay as S  # noqa: E402


def _small_config(readouts: int = 8) -> S.PlayConfig:
    return S.PlayConfig(mcts.SearchConfig(virtual_losses=2, dirichlet_alpha=0.25), readouts, fastplay_frequency=0.5,
                        fastplay_readouts=2, softpick_moves=4, min_resign_threshold=-0.9, max_resign_threshold=-0.9,
                        disable_resign_pct=0.5)


@pytest.mark.slow
def test_self_play_with_a_fixed_seed_is_reproducible():
    game = go.load_game(N, 7.5)

    def once(seed: int) -> tuple[S.Examples, S.GameStats]:
        torch.manual_seed(0)
        net = M.DualNet(N, width=8, blocks=1, fc_width=8)
        return S.selfplay(game, M.NetworkEvaluator(net, torch.device("cpu")), 6, _small_config(),
                          np.random.default_rng(seed))

    (a, stats), (b, _), (c, _) = once(3), once(3), once(4)
    assert len(a) > 0 and stats.games == 6 and stats.moves >= len(a)
    np.testing.assert_array_equal(a.planes, b.planes)
    np.testing.assert_array_equal(a.policy, b.policy)
    np.testing.assert_array_equal(a.outcome, b.outcome)
    assert len(a) != len(c) or not np.array_equal(a.planes, c.planes)
    # Every example is a legal position's full search: its policy sums to 1, its outcome is +-1.
    assert a.policy.sum(1) == pytest.approx(np.ones(len(a))) and set(np.unique(a.outcome)) <= {-1.0, 1.0}
    assert a.planes.shape[1:] == (go.PLANES, N, N)


class _Passer:
    def moves(self, positions, moves_played, rng):
        return [N * N for _ in positions]


def test_a_match_alternates_colours_and_the_komi_decides_an_empty_board():
    """Two players that always pass: the board stays empty, so white wins by the komi (7.5, area
    scoring) every game, and the candidate wins exactly the games where it is white."""
    result = S.match(go.load_game(N, 7.5), _Passer(), _Passer(), 10, np.random.default_rng(0))
    counts = (result.games, result.wins, result.wins_as_black, result.wins_as_white, result.black_wins)
    assert counts == (10, 5, 0, 5, 0)
    reverse = S.match(go.load_game(N, -0.5), _Passer(), _Passer(), 10, np.random.default_rng(0))
    assert reverse.black_wins == 10 and reverse.wins == reverse.wins_as_black == 5  # a komi for black: black wins
    with pytest.raises(ValueError, match="even"):
        S.match(go.load_game(N, 7.5), _Passer(), _Passer(), 3, np.random.default_rng(0))


def test_a_search_player_beats_random_and_greedy_players_need_no_network():
    rng = np.random.default_rng(0)
    capture_vs_random = S.match(go.load_game(N, 0.5), S.CapturePlayer(), S.RandomPlayer(), 20, rng)
    assert capture_vs_random.win_rate > 0.5


def test_the_mini_is_open_division_only(tmp_path):
    """The full recipes in closed logs are the conformance test's (v0.6's 4,096 games declared open
    there); the mini's 64 games per generation must fail the closed rules too."""
    ctx = RuntimeContext(device=torch.device("cpu"), world_size=8)
    hyper = W.MiniGoWorkload().mlperf_hyperparameters(W.MINI, ctx)
    write_minimal_closed_log(tmp_path / "mini.txt", "minigo", 64, {**hyper, "actual_selfplay_games_per_generation": 64},
                             0.52, 5)
    assert not check(tmp_path / "mini.txt", "1.0.0").valid


def test_the_lr_schedule_is_the_references_piecewise_constant():
    factor = W.lr_factor(W.FULL_RECIPES["reference"])
    rates = [factor(s) * 0.016 for s in (0, 127, 128, 9999, 10_000, 20_000, 50_000)]
    assert rates == pytest.approx([0.016, 0.016, 0.16, 0.16, 0.016, 0.0016, 0.0016])


def test_the_shipped_target_is_checksum_verified_and_shape_checked(tmp_path, monkeypatch):
    workload = W.MiniGoWorkload()
    manifest = __import__("json").loads(W.MINI_MANIFEST.read_text())
    assert W.sha256(W.MINI_TARGET) == manifest["sha256"] and manifest["made_by"].startswith("trainperf make-minigo")
    target = workload.target_network(W.MINI, Assets(workload.assets(W.MINI, None)))
    assert not target.training
    damaged = tmp_path / "target.pt"
    damaged.write_bytes(W.MINI_TARGET.read_bytes()[:-10] + b"0123456789")
    monkeypatch.setattr(W, "MINI_TARGET", damaged)
    with pytest.raises(TrainperfError, match="SHA-256 differs"):
        workload.target_network(W.MINI, Assets({"target model": damaged}))
    other = tmp_path / "other.pt"
    torch.save(M.DualNet(N, width=8, blocks=3, fc_width=32).state_dict(), other)  # narrower: 8 channels, not 32
    recipe = W.MINI.with_overrides([f"target_model={other}"])
    with pytest.raises(TrainperfError, match="shape"):
        workload.target_network(recipe, Assets(workload.assets(recipe, None)))


@pytest.mark.second_tier
def test_the_mini_runs_end_to_end_and_its_log_passes_the_checker(tmp_path):
    """Two generations (self-play, training, a match against the shipped target); the target itself is
    shown reached by the README's 10-seed calibration."""
    from tests.conftest import cut_short_run

    result = cut_short_run(["minigo", "--seed", "0", "--device", "cpu", "--set", "max_epochs=2"], tmp_path / "run",
                           "1.0.0")
    assert [e["epoch"] for e in result["evaluations"]] == [1, 2]
    assert all(0.0 <= e["value"] <= 1.0 for e in result["evaluations"])
    assert result["samples"] > 0 and result["eval_samples"] == W.MINI.eval_games


@pytest.mark.second_tier
def test_two_processes_share_the_games_and_take_the_same_steps(tmp_path):
    """--nproc 2: each process plays half of the generation's games and its half of each batch; the
    log counts the generation's games once, and the processes stay in step (rank 0's step count)."""
    from tests.conftest import cut_short_run, read_log

    result = cut_short_run(["minigo", "--seed", "0", "--device", "cpu", "--nproc", "2", "--set", "max_epochs=1"],
                           tmp_path / "run", "1.0.0")
    games = [r["value"] for r in read_log(tmp_path / "run" / "mlperf_log.txt")
             if r["key"] == "actual_selfplay_games_per_generation"]
    assert games == [W.MINI.games_per_generation] and result["samples"] > 0
    assert [e["epoch"] for e in result["evaluations"]] == [1]


def test_self_play_draws_each_games_resign_threshold_as_the_reference_flags_say():
    """flags/19 (v0.7+): every game resigns below its own threshold, uniform in [-1.0, -0.9), never
    disabled, none held out; v0.6's flags/9: one threshold (-0.99), resignation off in 10 % of games,
    3 % of games held out of training."""
    reference, v06 = (W.play_config(W.MiniGoWorkload().recipe("full", name)) for name in ("reference", "v0.6-9x9"))
    rng = np.random.default_rng(0)
    draws = [S.game_settings(reference, rng) for _ in range(4000)]
    thresholds = np.array([t for _, t, _ in draws])
    assert all(allowed and not held for allowed, _, held in draws)
    assert thresholds.min() >= -1.0 and thresholds.max() < -0.9
    assert np.histogram(thresholds, bins=4, range=(-1.0, -0.9))[0].min() > 800  # spread over the range
    draws = [S.game_settings(v06, rng) for _ in range(4000)]
    assert {t for _, t, _ in draws} == {-0.99}
    assert 0.08 < np.mean([not a for a, _, _ in draws]) < 0.12 and 0.02 < np.mean([h for *_, h in draws]) < 0.04
    assert v06.fastplay_frequency == 0 and W.MiniGoWorkload().recipe("full", "v0.6-9x9").train_filter == 0.5


def test_held_out_games_are_played_but_not_trained_on():
    game = go.load_game(N, 7.5)
    torch.manual_seed(0)
    net = M.DualNet(N, width=8, blocks=1, fc_width=8)
    config = dataclasses.replace(_small_config(), holdout_pct=0.999999)
    examples, stats = S.selfplay(game, M.NetworkEvaluator(net, torch.device("cpu")), 4, config,
                                 np.random.default_rng(0))
    assert stats.games == stats.held_out == 4 and stats.moves > 0 and len(examples) == 0


def test_a_fixed_threshold_keeps_the_random_stream():
    """The mini's fixed threshold draws nothing more per game: its calibrated games are unchanged."""
    config = _small_config()
    rng, plain = np.random.default_rng(5), np.random.default_rng(5)
    assert [S.game_settings(config, rng)[0] for _ in range(50)] == [bool(plain.random() >= 0.5) for _ in range(50)]


def _root_with(visits: dict[int, float], q: dict[int, float], prior: dict[int, float]) -> mcts.Node:
    root = mcts.Node(go.start(go.load_game(N, 7.5)))
    root.expanded = True
    for move, n in visits.items():
        root.visits[move], root.value_sum[move] = n, q[move] * n
    for move, p in prior.items():
        root.prior[move] = p
    return root


def test_target_pruning_keeps_only_the_visits_exploration_explains():
    """The reference's ReshapeFinalVisits on a hand-made root (N = 140): the best move keeps its 100
    visits; a poor move (Q -0.9) keeps the 7 its prior explains, floor(U P sqrt(N) / (best - Q)); a move
    better than the best by Q keeps all it had; a move worth more than the best's Q + U loses all."""
    config = mcts.SearchConfig(c_puct_scale=2.0)
    root = _root_with({0: 100, 1: 10, 2: 20, 3: 10}, {0: 0.2, 1: -0.9, 2: 0.3, 3: 0.9}, {0: 0.5, 1: 0.3, 2: 0.1,
                                                                                          3: 0.1})
    scale = 2.0 * (math.log((1 + 140 + 19652) / 19652) + 1.25)
    best = 0.2 + scale * math.sqrt(141) * 0.5 / 101
    pruned = mcts.pruned_visits(root, config)
    assert pruned[0] == 100 and pruned[1] == math.floor(scale * 0.3 * math.sqrt(140) / (best + 0.9)) == 7
    assert pruned[2] == 20 and pruned[3] == 0 and pruned[4:].sum() == 0
    assert (pruned <= root.visits).all()
    # The target: pruned visits ** 0.98, normalised; without pruning and with exponent 1, the visits.
    target = mcts.search_target(root, config, prune=True, exponent=0.98)
    expected = pruned ** 0.98 / (pruned ** 0.98).sum()
    np.testing.assert_allclose(target, expected)
    np.testing.assert_allclose(mcts.search_target(root, config, prune=False, exponent=1.0), root.visits / 140)
    assert mcts.u_scale(140, config) == pytest.approx(2 * mcts.u_scale(140, mcts.SearchConfig()))


def test_the_reference_opening_never_draws_the_pass():
    root = _root_with({0: 3, N * N: 50}, {0: 0.0, N * N: 0.0}, {0: 0.5, N * N: 0.5})
    rng = np.random.default_rng(0)
    assert {mcts.choose(root, rng, True, 0.98, soft_pass=False) for _ in range(200)} == {0}
    assert N * N in {mcts.choose(root, rng, True) for _ in range(200)}  # the plain draw takes it


def test_full_recipes_search_as_the_reference_and_the_mini_as_calibrated():
    ref = W.play_config(W.MiniGoWorkload().recipe("full", "reference"))
    assert (ref.search.c_puct_scale, ref.target_pruning, ref.visits_exponent, ref.soft_pass,
            ref.fresh_full_search) == (2.0, True, 0.98, False, True)
    mini = W.play_config(W.MiniGoWorkload().recipe("mini"))
    assert (mini.search.c_puct_scale, mini.target_pruning, mini.visits_exponent, mini.soft_pass,
            mini.fresh_full_search) == (1.0, False, 1.0, True, False)


def test_reference_self_play_runs_with_pruned_targets_and_fresh_full_searches():
    game = go.load_game(N, 7.5)
    torch.manual_seed(0)
    net = M.DualNet(N, width=8, blocks=1, fc_width=8)
    config = dataclasses.replace(_small_config(), search=mcts.SearchConfig(virtual_losses=2, dirichlet_alpha=0.25,
                                                                           c_puct_scale=2.0),
                                 target_pruning=True, visits_exponent=0.98, soft_pass=False, fresh_full_search=True)
    examples, stats = S.selfplay(game, M.NetworkEvaluator(net, torch.device("cpu")), 4, config,
                                 np.random.default_rng(1))
    assert len(examples) > 0 and examples.policy.sum(1) == pytest.approx(np.ones(len(examples)))
