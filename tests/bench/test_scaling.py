"""The scaling table: speedup and efficiency from the runs' results, and the files it writes."""

from __future__ import annotations

import csv
import json

import pytest

from trainperf.bench import scaling
from trainperf.errors import TrainperfError


def _result(ttt: float, status: str = "success", epochs: int = 4, gbs: int = 32) -> dict:
    return {"status": status, "time_to_train_s": ttt, "epoch_times_s": [ttt / epochs] * epochs,
            "epochs_to_target": epochs if status == "success" else None, "recipe": {"global_batch_size": gbs}}


def test_speedup_and_efficiency():
    rows = scaling.summarize({
        1: [_result(10.0), _result(12.0), _result(11.0)],
        2: [_result(6.0, gbs=64), _result(5.0, gbs=64), _result(30.0, "aborted", gbs=64)],
        4: [_result(3.0, gbs=128)],
    })
    one, two, four = rows
    assert one.time_to_train_s == 11.0 and one.speedup == 1.0 and one.efficiency == 1.0
    assert two.converged == 2 and two.runs == 3 and two.time_to_train_s == 5.5  # median of converged runs
    assert two.speedup == pytest.approx(2.0) and two.efficiency == pytest.approx(1.0)
    assert four.speedup == pytest.approx(11 / 3) and four.efficiency == pytest.approx(11 / 12)
    assert two.global_batch == 64
    text = scaling.table_text(rows)
    assert "speedup" in text.splitlines()[0] and "2/3" in text


def test_files_written(tmp_path):
    rows = scaling.summarize({1: [_result(10.0)], 2: [_result(7.0)]})
    paths = scaling.save(rows, tmp_path, "resnet mini")
    assert [p.name for p in paths] == ["scaling.csv", "scaling.json", "scaling.png"]
    table = list(csv.DictReader(paths[0].open()))
    assert [r["devices"] for r in table] == ["1", "2"]
    assert json.loads(paths[1].read_text())["rows"][1]["speedup"] == pytest.approx(10 / 7)
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text", ["", "0,1", "1,1", "two"])
def test_bad_nproc_list(text):
    with pytest.raises(TrainperfError, match="--nproc"):
        scaling.parse_nprocs(text)


def test_nproc_list_sorted():
    assert scaling.parse_nprocs("4,1,2") == [1, 2, 4]
