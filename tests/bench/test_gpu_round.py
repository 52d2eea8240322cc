"""benchmarks/gpu_round.py on a CPU at toy sizes: the summary it writes (JSON and Markdown), one
workload's benchmark with its profile, the launched group of one, and what a budget too small skips."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_round.py"


def _round(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--quick", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.second_tier
@pytest.mark.multiprocess
def test_the_round_summarises_its_sections(tmp_path):
    done = _round(tmp_path, "--sections", "env,nccl,bench", "--workloads", "resnet", "--budget-min", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "round.json").read_text())
    assert [s["name"] for s in summary["sections"]] == ["env", "nccl", "bench"]
    assert all(s["status"] == "ok" for s in summary["sections"])
    assert summary["environment"]["device"] == "cpu" and summary["environment"]["versions"]["torch"]
    nccl = summary["sections"][1]["results"]
    assert nccl["status"] == "success" and nccl["backend"] == "gloo"  # NCCL on a GPU
    (row,) = summary["sections"][2]["results"]
    assert row["workload"] == "resnet" and row["samples_per_s"] > 0 and row["switches"]["precision"] == "bf16"
    by_host = row["profile"]["by_host"]
    # A convolution's backward among the top operators by self host time: which of its layers holds the
    # time (the dispatching convolution_backward or the kernel below it, _slow_conv2d_backward for bf16
    # on a CPU) depends on the machine's speed.
    assert by_host and any("conv" in r["name"] and "backward" in r["name"] for r in by_host), by_host
    assert all(r["calls"] > 0 and r["host_ms"] >= 0 for r in by_host)
    text = (tmp_path / "round.md").read_text()
    for heading in ("# GPU round:", "## env: ok", "## nccl: ok", "## bench: ok", "### resnet: top operators"):
        assert heading in text
    assert "| resnet | 2 |" in text and "`python -m trainperf bench resnet --device cpu" in text
    with tarfile.open(tmp_path / "details.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"bench-resnet.txt", "bench-resnet.json", "nccl.txt", "result.json"} <= names


def _module():
    """The script as a module: its arguments and sections are tested in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_round", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sections_that_do_not_fit_the_budget_are_skipped_and_said_so(tmp_path):
    assert _module().main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--sections", "tests,ladder",
                           "--budget-min", "0.01"]) == 0
    summary = json.loads((tmp_path / "round.json").read_text())
    assert [s["status"] for s in summary["sections"]] == ["skipped", "skipped"]
    assert "of the budget left" in summary["sections"][0]["reason"]
    assert "## tests: skipped (" in (tmp_path / "round.md").read_text()


def test_unknown_sections_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _module().main(["--out", str(tmp_path), "--device", "cpu", "--sections", "env,warp"])
    assert exit_.value.code == 2 and "unknown warp" in capsys.readouterr().err


def test_a_command_the_budget_stops_is_a_skip_not_a_failure(tmp_path, monkeypatch):
    module = _module()
    round_ = module.Round(tmp_path, 600, "cpu", quick=True)
    round_.summary["workloads"] = ["rnnt", "minigo"]
    stopped = {"rnnt": "timeout", "minigo": 1}

    def fake_run(name, argv, timeout, env=None, shown=None):
        return {"name": name, "command": name, "exit": stopped[name.removeprefix("bench-")], "seconds": 51.0,
                "tail": []}

    monkeypatch.setattr(round_, "run", fake_run)
    section = round_.bench()
    rows = {r["workload"]: r for r in section["results"]}
    assert rows["rnnt"] == {"workload": "rnnt", "skipped": "budget (stopped after 51 s)"}
    assert rows["minigo"] == {"workload": "minigo", "failed": 1}
    assert section["status"] == "failed"  # minigo's exit 1 is a failure; rnnt's stop alone would not be
    summary = {**round_.summary, "sections": [{"name": "bench", "status": "failed", "seconds": 60, **section}]}
    text = module.markdown(summary)
    assert "| rnnt | budget (stopped after 51 s) |" in text and "| minigo | failed |" in text


@pytest.mark.second_tier
def test_the_graphs_section_climbs_eager_compile_graphs_for_each_workload_offering_them(tmp_path):
    done = _round(tmp_path, "--sections", "graphs", "--workloads", "ncf", "--budget-min", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    (section,) = json.loads((tmp_path / "round.json").read_text())["sections"]
    rows = section["results"]
    assert [(r["workload"], r["rung"]) for r in rows] == [("ncf", "eager"), ("ncf", "compile"),
                                                          ("ncf", "CUDA Graphs")]
    assert rows[0]["samples_per_s"] > 0 and rows[1]["switches"]["compile"] is True
    assert rows[2]["skipped"] == "needs a GPU"
    text = (tmp_path / "round.md").read_text()
    assert "## graphs: ok" in text and "| ncf | compile |" in text and "| ncf | CUDA Graphs | needs a GPU |" in text
