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
    assert "| resnet | 2 |" in text
    assert "`python benchmarks/bench_worker.py (1 trainperf commands in one process)`" in text
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

    def fake_run(name, argv, timeout, env=None, shown=None):
        # The worker (all benches in one process) ran minigo's, which failed, and was stopped inside rnnt's.
        folder = Path(argv[2]).parent
        assert [job["name"] for job in json.loads(Path(argv[2]).read_text())] == ["bench-rnnt", "bench-minigo"]
        (folder / "bench-minigo.done.json").write_text(json.dumps({"exit": 1, "seconds": 3.0}))
        return {"name": name, "command": name, "exit": "timeout", "seconds": 51.0, "tail": []}

    monkeypatch.setattr(round_, "run", fake_run)
    monkeypatch.setattr(round_, "planned", lambda keys: [
        module.gpu_ledger.Planned(k, "never measured on cpu", "", False, None) for k in keys])
    section = round_.bench()
    rows = {r["workload"]: r for r in section["results"]}
    assert rows["rnnt"] == {"workload": "rnnt", "why": "never measured on cpu",
                            "skipped": "budget (stopped after 51 s)"}
    assert rows["minigo"] == {"workload": "minigo", "why": "never measured on cpu", "failed": 1}
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
    # NCF names no repeated blocks: no regional rung; both graph rungs need a GPU.
    assert [(r["workload"], r["rung"]) for r in rows] == [("ncf", "eager"), ("ncf", "compile"),
                                                          ("ncf", "CUDA Graphs"),
                                                          ("ncf", "CUDA Graphs without Inductor")]
    assert rows[0]["samples_per_s"] > 0 and rows[1]["switches"]["compile"] is True
    assert rows[2]["skipped"] == rows[3]["skipped"] == "needs a GPU"
    text = (tmp_path / "round.md").read_text()
    assert "## graphs: ok" in text and "| ncf | compile |" in text and "| ncf | CUDA Graphs | needs a GPU |" in text


@pytest.mark.second_tier
def test_the_syncs_section_sets_the_counter_beside_the_device(tmp_path):
    """On a CPU the audit fills the counter's column only; on a GPU both (tests/bench/test_stepcount.py holds
    them equal there)."""
    done = _round(tmp_path, "--sections", "syncs", "--workloads", "ncf", "--budget-min", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    (section,) = json.loads((tmp_path / "round.json").read_text())["sections"]
    (row,) = section["results"]
    assert row["workload"] == "ncf" and row["counted"] == 0 and "device" not in row
    assert "| ncf | 0 | - |" in (tmp_path / "round.md").read_text()


@pytest.mark.second_tier
def test_the_energy_section_measures_a_mini_with_its_power(tmp_path, monkeypatch):
    """On a CPU: NCF's mini with --power nvml,rapl --power-optional, NVML absent (said so), RAPL from a powercap
    tree advancing at 65 W: the energy of the timed region in round.json and round.md."""
    from tests.runtime.test_power import FakePowercap

    (tmp_path / "powercap").mkdir()
    monkeypatch.setenv("TRAINPERF_POWERCAP_ROOT", str(tmp_path / "powercap"))
    with FakePowercap(tmp_path / "powercap", package_w=60.0, dram_w=5.0):
        done = _round(tmp_path / "round", "--sections", "energy", "--budget-min", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    (section,) = json.loads((tmp_path / "round" / "round.json").read_text())["sections"]
    row = section["results"]
    assert row["workload"] == "ncf" and row["official_source"] == "rapl"
    assert row["average_w"] == pytest.approx(65.0, rel=0.2) and set(row["sources"]) == {"rapl"}
    assert "J over the timed region" in (tmp_path / "round" / "round.md").read_text()


# -- the ledger: what comes first, what is skipped, how long a compile may take (issue 62) ----------------------
def _ledger_module():
    import importlib.util

    path = SCRIPT.parent / "gpu_ledger.py"
    spec = importlib.util.spec_from_file_location("gpu_ledger", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_ledger"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_ledger_puts_the_never_measured_first_then_the_oldest_and_the_unchanged_last():
    L = _ledger_module()
    ledger = {"entries": {}}
    common = {"commit": "abc", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.14.1"}
    for workload, date, code, seconds in [("ncf", "2026-11-20", "old", 10.0), ("dlrm", "2026-11-25", "same", 30.0),
                                          ("ssd", "2026-11-22", "same", 400.0)]:
        L.record(ledger, L.key("graphs", workload, "compile"), {"samples_per_s": 1.0}, date=date, code=code,
                 seconds=seconds, **common)
    keys = [L.key("graphs", w, "compile") for w in ("dlrm", "ssd", "resnet", "ncf")]
    codes = {k: "same" for k in keys}
    planned = L.plan(keys, ledger, "NVIDIA H100 PCIe", "2.14.1", codes)
    assert [p.key.split("/")[1] for p in planned] == ["resnet", "ncf", "ssd", "dlrm"]
    assert planned[0].reason == "never measured on h100" and "code changed since 2026-11-20" in planned[1].reason
    assert [p.unchanged for p in planned] == [False, False, True, True]
    # Another GPU model's figures do not count for this one; another torch makes every figure stale.
    assert all(not p.unchanged for p in L.plan(keys, ledger, "NVIDIA H200", "2.14.1", codes))
    assert all(not p.unchanged for p in L.plan(keys, ledger, "NVIDIA H100", "2.15.0", codes))
    assert L.compile_cap(planned[0]) == L.UNKNOWN_COMPILE_S and L.compile_cap(planned[2]) == 800.0


def test_a_workloads_fingerprint_moves_with_its_code_and_the_shared_code_only(tmp_path):
    L = _ledger_module()
    package = tmp_path / "trainperf"
    for path in ("harness/run.py", "workloads/common/coco/data.py", "workloads/ssd/model.py",
                 "workloads/ncf/model.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text("x = 1\n")
    before = {w: L.fingerprint(w, package) for w in ("ssd", "ncf")}
    (package / "workloads/ncf/model.py").write_text("x = 2\n")
    assert L.fingerprint("ssd", package) == before["ssd"] and L.fingerprint("ncf", package) != before["ncf"]
    (package / "harness/run.py").write_text("x = 3\n")
    assert L.fingerprint("ssd", package) != before["ssd"]


def test_the_ledger_is_seeded_from_the_rounds_with_the_latest_figure_kept():
    L = _ledger_module()
    ledger = {"entries": {}}
    env = {"gpus": ["NVIDIA H100 80GB HBM3"], "git_sha": "1234567890ab", "versions": {"torch": "2.11.0"}}
    late = {"started": "2026-11-26T10:00:00", "environment": env, "sections": [
        {"name": "bench", "commands": [{"name": "bench-ssd", "seconds": 42.0}],
         "results": [{"workload": "ssd", "samples_per_s": 933.0}]}]}
    early = {**late, "started": "2026-11-25T10:00:00", "sections": [
        {"name": "bench", "commands": [], "results": [{"workload": "ssd", "samples_per_s": 800.0},
                                                      {"workload": "rnnt", "skipped": "budget"}]}]}
    assert L.seed_from_round(ledger, late) == 1 and L.seed_from_round(ledger, early) == 1
    entry = L.last(ledger, "bench/ssd", "NVIDIA H100 PCIe")
    assert entry["figures"] == {"samples_per_s": 933.0} and entry["seconds"] == 42.0 and entry["code"] is None
    assert "bench/rnnt" not in ledger["entries"]


def test_the_committed_ledger_reads_and_names_the_current_rounds_gaps():
    L = _ledger_module()
    ledger = L.load()
    assert ledger["entries"], "docs/gpu/ledger.json: seeded from the rounds' summaries"
    keys = [L.key("bench", w) for w in ("resnet", "gpt_oss_20b", "flux1")]
    planned = L.plan(keys, ledger, "NVIDIA H100 80GB HBM3", "2.14.1", {})
    assert [p.key for p in planned][:2] == ["bench/gpt_oss_20b", "bench/flux1"]  # never measured: first


def test_gpu_tests_run_by_the_files_that_hold_them():
    files = _module().gpu_test_files()
    assert "tests/bench/test_stepcount.py" in files and all(f.startswith("tests/") for f in files)
    assert len(files) < 20


@pytest.mark.second_tier
def test_a_round_skips_what_the_ledger_says_is_unchanged(tmp_path):
    """The ledger end to end on a CPU: a first round measures NCF's bench (one worker process) and writes its
    ledger with the code's fingerprint; a second round given that ledger skips it, and measures it with
    --remeasure."""
    first, second, third = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    done = _round(first, "--sections", "env,bench", "--workloads", "ncf", "--budget-min", "4",
                  "--ledger", str(tmp_path / "none.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    ledger = json.loads((first / "ledger.json").read_text())
    (entry,) = ledger["entries"]["bench/ncf"].values()
    assert entry["figures"]["samples_per_s"] > 0 and entry["code"] and entry["seconds"] > 0
    done = _round(second, "--sections", "env,bench", "--workloads", "ncf", "--budget-min", "4",
                  "--ledger", str(first / "ledger.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads((second / "round.json").read_text())["sections"][1]["results"]
    assert row["skipped"].startswith("unchanged since")
    done = _round(third, "--sections", "env,bench", "--workloads", "ncf", "--budget-min", "4",
                  "--ledger", str(first / "ledger.json"), "--remeasure")
    (row,) = json.loads((third / "round.json").read_text())["sections"][1]["results"]
    assert row["samples_per_s"] > 0 and row["why"].startswith("unchanged since")
