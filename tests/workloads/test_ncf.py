"""NCF: the reference conversion on hand-written ml-20m files, HR@10, and the mini run end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import top_k_accuracy_score

from tests.conftest import read_log
from trainperf.cli import main
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.ncf import MINI, NCFWorkload, hit_rate_hits, popularity_hr
from trainperf.workloads.ncf import data as D


def _ratings(path: Path, rows: list[tuple]) -> Path:
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(f"{u},{m},{r},{t}\n" for u, m, r, t in rows))
    return path


def _small(tmp_path: Path) -> Path:
    rows = []
    # user 7: 20 ratings of movies 100..119; the latest (timestamp 50) is movie 105.
    for k in range(20):
        rows.append((7, 100 + k, 4.0, 50 if k == 5 else k))
    # user 3: 21 ratings of movies 110..130; two share the latest timestamp: file order keeps 130 last.
    for k in range(21):
        rows.append((3, 110 + k, 3.5, 99 if k in (19, 20) else k))
    # user 9: 19 ratings: dropped (fewer than 20).
    for k in range(19):
        rows.append((9, 200 + k, 5.0, k))
    return _ratings(tmp_path / "ratings.csv", rows)


def test_conversion_gives_the_reference_outputs(tmp_path):
    manifest = D.convert(_small(tmp_path), tmp_path, lambda s: None)
    assert (manifest["users"], manifest["items"]) == (2, 31)  # movies 100..130; user 9's 200.. are gone
    train, test_users, test_pos, test_neg = D.load(tmp_path)
    # Contiguous ids in order of the original ids: user 3 -> 0, user 7 -> 1; movie 100 + k -> k.
    assert test_users.tolist() == [0, 1] and test_pos.tolist() == [30, 5]
    assert sorted(map(tuple, train[train[:, 0] == 1].tolist())) == [(1, k) for k in range(20) if k != 5]
    assert sorted(train[train[:, 0] == 0][:, 1].tolist()) == list(range(10, 30))
    assert train.shape == (19 + 20, 2)
    assert test_neg.shape == (2, 999)
    rated = {0: set(range(10, 31)), 1: set(range(20))}
    for user in (0, 1):
        assert not set(test_neg[user].tolist()) & rated[user]
        assert test_neg[user].min() >= 0 and test_neg[user].max() < 31
    # With replacement: 999 draws from 10 or 11 unrated items repeat.
    assert len(set(test_neg[0].tolist())) == 10
    # Seed 0, as the reference: a second conversion gives the same negatives.
    other = tmp_path / "again"
    other.mkdir()
    D.convert(_small(other), other, lambda s: None)
    assert np.array_equal(D.load(other)[3], test_neg)
    lines = (tmp_path / "train-ratings.csv").read_text().splitlines()
    assert lines[0].count("\t") == 2 and lines[0].endswith("\t1")


@pytest.mark.parametrize("data, message", [
    (b"userId,movieId,rating\n1,2,3\n", "ratings.csv:1: expected the header userId,movieId,rating,timestamp"),
    (b"userId,movieId,rating,timestamp\n1,2,3.5,100\n1,2,3.5\n", "ratings.csv:3: expected 4 fields"),
    (b"userId,movieId,rating,timestamp\n1,x,3.5,100\n", "ratings.csv:2: expected integer ids"),
    (b"userId,movieId,rating,timestamp\n1,2,9.5,100\n", "ratings.csv:2: rating 9.5 outside 0-5"),
    (b"userId,movieId,rating,timestamp\n1,2,3.5,100\n1,2,\xff,100\n", "ratings.csv:3: not UTF-8 text (byte 0xff)"),
    (b"userId,movieId,rating,timestamp\n1,2,3.5,100\n9" + b"9" * 30 + b",2,3.5,100\n",
     "ratings.csv:3: expected integer"),
    (b"userId,movieId,rating,timestamp\n1,2,3\x00.5,100\n", r"ratings.csv:2: expected integer ids .* got '1,2,3\\x00"),
    # An invisible character in the header is shown, not printed as it is (it would look right).
    (b"userId,movieId,rating,time\xe2\x80\x8bstamp\n1,2,3,4\n", r"got 'userId,movieId,rating,time\u200bstamp'"),
])
def test_malformed_lines_are_rejected_with_file_and_line(tmp_path, data, message):
    path = tmp_path / "ratings.csv"
    path.write_bytes(data)
    pattern = message if message.startswith("ratings.csv:2: expected integer ids .*") else re.escape(message)
    with pytest.raises(TrainperfError, match=pattern) as err:
        D.convert(path, tmp_path, lambda s: None)
    assert "\n" not in str(err.value)
    assert not any((tmp_path / name).exists() for name in D.OUTPUTS)  # nothing half-written


def test_a_byte_order_mark_and_windows_line_ends_are_accepted(tmp_path):
    """Spreadsheet programs save "CSV UTF-8" with a byte-order mark; pandas reads it, so do we."""
    plain = tmp_path / "plain"
    plain.mkdir()
    D.generate_ratings(plain / "ratings.csv", 40, 30)
    text = (plain / "ratings.csv").read_text()
    bom = tmp_path / "bom"
    bom.mkdir()
    (bom / "ratings.csv").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    a = D.read_ratings(plain / "ratings.csv", lambda s: None)
    b = D.read_ratings(bom / "ratings.csv", lambda s: None)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)) and a[0].size > 0


def test_missing_ratings_file(tmp_path):
    problems = NCFWorkload().data_problems("full", tmp_path)
    assert "ratings.csv: missing" in problems[0]


def test_hr10_agrees_with_scikit_learn():
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(500, 1000, generator=gen)
    ours = hit_rate_hits(scores[:, 0], scores[:, 1:]).float().mean().item()
    reference = top_k_accuracy_score(np.zeros(500, dtype=int), scores.numpy(), k=10, labels=np.arange(1000))
    assert ours == pytest.approx(reference)


def test_hr10_ties_rank_the_positive_last():
    pos = torch.tensor([1.0, 1.0])
    neg = torch.zeros(2, 999)
    neg[0, :10] = 1.0  # ten ties, ranked ahead of the positive: it is 11th -> miss
    neg[1, :9] = 1.0  # nine ties: the positive is 10th -> hit
    assert hit_rate_hits(pos, neg).tolist() == [0, 1]


@pytest.fixture(scope="module")
def ncf_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ncf") / "run"
    assert main(["run", "ncf", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.to_target
@pytest.mark.slow
def test_mini_reaches_target_above_popularity(ncf_run):
    result = json.loads((ncf_run / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= MINI.target
    root = NCFWorkload().default_data_dir("mini")
    train, _, test_pos, test_neg = D.load(root)
    baseline = popularity_hr(train, test_pos, test_neg, json.loads((root / D.MANIFEST).read_text())["items"])
    assert baseline < MINI.target / 3  # the target is far above ranking by popularity


@pytest.mark.slow
def test_mini_log_passes_checker_with_ncf_rules(ncf_run, tmp_path):
    verdict = check(ncf_run / "mlperf_log.txt")
    assert verdict.valid, verdict.output
    assert verdict.config and verdict.config.endswith("ncf/rules.yaml") and verdict.ruleset == "0.7.0"
    keys = [r["key"] for r in read_log(ncf_run / "mlperf_log.txt")]
    assert keys.count("opt_adam_beta_1") == 1 and keys.count("eval_hp_num_neg") == 1
    # The rules bite: a closed-division log below HR@10 0.635 fails.
    closed = tmp_path / "closed.txt"
    closed.write_text((ncf_run / "mlperf_log.txt").read_text().replace('"value": "open"', '"value": "closed"'))
    assert not check(closed).valid


@pytest.mark.slow
def test_a_user_who_rated_every_item_is_an_error_not_a_hang(tmp_path):
    """Evaluation negatives are drawn from the items a user never rated; with none left, rejection
    sampling used to loop for ever. Run in a subprocess so that a hang fails the test."""
    import subprocess
    import sys

    rows = ["userId,movieId,rating,timestamp"]
    rows += [f"1,{item},4.0,{100 + item}" for item in range(1, 26)]  # user 1 rates all 25 items
    rows += [f"2,{item},3.0,{200 + item}" for item in range(1, 21)]
    (tmp_path / "ratings.csv").write_text("\n".join(rows) + "\n")
    code = ("from pathlib import Path\nfrom trainperf.workloads.ncf import data as D\n"
            "from trainperf.errors import TrainperfError\ntry:\n"
            "    D.convert(Path('ratings.csv'), Path('.'), lambda s: None)\n"
            "except TrainperfError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "user 1 rated every one of the 25 items: no negatives can be drawn" in proc.stdout, proc.stderr


def test_a_repeated_rating_never_puts_the_test_item_into_training(tmp_path):
    rows = [(1, 100 + k, 4.0, k) for k in range(20)]  # user 1: movies 100..119
    rows.append((1, 107, 5.0, 999))                    # movie 107 again, latest: the test item
    rows.append((1, 103, 2.0, 500))                    # movie 103 again, in the middle
    rows += [(2, 200 + k, 3.0, k) for k in range(21)]  # user 2: no repeats
    rows += [(2, 205, 3.0, 5)]                          # an exact duplicate line
    said: list[str] = []
    manifest = D.convert(_ratings(tmp_path / "ratings.csv", rows), tmp_path, said.append)
    train, test_users, test_pos, _ = D.load(tmp_path)
    pairs = list(map(tuple, train.tolist()))
    assert len(pairs) == len(set(pairs)), "a (user, item) pair is a training positive at most once"
    for user, item in zip(test_users.tolist(), test_pos.tolist(), strict=True):
        assert (user, item) not in set(pairs), f"user {user}'s test item {item} is also a training positive"
    assert test_pos.tolist()[0] == 7  # movie 107 (ids 100.. -> 0..): still the latest, still the test item
    assert manifest["train_ratings"] == 19 + 20
    assert any("3 repeated" in line for line in said), said
