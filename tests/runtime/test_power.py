"""Energy to train (trainperf/power): the sources with strict fakes (NVML, ipmitool, a Redfish endpoint, a
powercap tree whose counters advance at a known power), the sampler process, the official layout read back by
the official package's summarizer and package checker, and a series scored with its energy."""

from __future__ import annotations

import http.server
import json
import os
import random
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from trainperf import power
from trainperf.errors import TrainperfError
from trainperf.power import sources

# -- options -------------------------------------------------------------------------------------------------


def test_sources_are_parsed_and_bad_ones_refused_in_one_line(tmp_path):
    specs = sources.parse_specs(f"nvml,rapl,ipmi,ipmi:https://bmc/redfish/v1/Chassis/1/Power,file:{tmp_path}/m.csv")
    assert [s.kind for s in specs] == ["nvml", "rapl", "ipmi", "ipmi", "file"]
    assert [s.node_level for s in specs] == [False, False, True, True, True]
    for bad in ("nvm", "ipmi:bmc", "file:", "rapl:x", ""):
        with pytest.raises(TrainperfError, match="expected nvml, rapl, ipmi"):
            sources.parse_specs(bad)
    with pytest.raises(TrainperfError, match="named twice"):
        sources.parse_specs("nvml,nvml")
    with pytest.raises(TrainperfError, match="at least one sample a second"):
        power.request_from("rapl", 2.0)
    with pytest.raises(TrainperfError, match="go with --power"):
        power.request_from(None, 0.5)
    request = power.request_from("rapl,ipmi", 0.5, True, 40.0)
    assert request.interval_s == 0.5 and request.optional and request.interconnect_w == 40.0
    with pytest.raises(TrainperfError, match="--power-interconnect -1.0: expected watts >= 0"):
        power.request_from("rapl", None, False, -1.0)


def test_an_unavailable_source_refuses_the_run_unless_optional(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPERF_POWERCAP_ROOT", str(tmp_path / "none"))
    with pytest.raises(TrainperfError, match=r"--power rapl: RAPL: .* is not present.*--power-optional"):
        power.check(power.request_from("rapl"))
    said = []
    assert power.check(power.request_from("rapl", optional=True), said.append) is None
    assert said[0].startswith("power: rapl left out: RAPL:") and "no source is available" in said[1]
    with pytest.raises(TrainperfError, match="is not a folder"):
        power.check(power.request_from(f"file:{tmp_path}/absent/meter.csv"))


# -- the sources, each with a strict fake ---------------------------------------------------------------------


class FakePowercap:
    """/sys/class/powercap as the kernel lays it out: a package zone and its dram subzone, whose energy_uj
    counters advance at `package_w` and `dram_w` from a thread (written atomically, as the kernel's reads are)."""

    def __init__(self, root: Path, package_w: float, dram_w: float, wrap_uj: int = 262143328850) -> None:
        self.root, self.rates = root, {"intel-rapl:0": package_w, "intel-rapl:0/intel-rapl:0:0": dram_w}
        self.wrap = wrap_uj
        for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0/intel-rapl:0:0", "dram"),
                           ("intel-rapl:0/intel-rapl:0:1", "core")):
            (root / zone).mkdir(parents=True)
            (root / zone / "name").write_text(name + "\n")
            (root / zone / "max_energy_range_uj").write_text(f"{wrap_uj}\n")
            (root / zone / "energy_uj").write_text(f"{wrap_uj - 1_000_000}\n")  # wraps within a second
        (root / "intel-rapl:0" / "intel-rapl:0:1" / "energy_uj").write_text("999999999\n")  # inside the package
        self.energy = {zone: float(wrap_uj - 1_000_000) for zone in self.rates}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._advance, daemon=True)

    def _advance(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(0.01):  # 10 ms steps: a 0.3 s reading window is off by at most 1/30
            now = time.monotonic()
            for zone, watts in self.rates.items():
                self.energy[zone] = (self.energy[zone] + watts * (now - last) * 1e6) % self.wrap
                tmp = self.root / zone / "energy_uj.tmp"
                tmp.write_text(f"{int(self.energy[zone])}\n")
                os.replace(tmp, self.root / zone / "energy_uj")
            last = now

    def __enter__(self) -> FakePowercap:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_rapl_reads_packages_and_dram_through_a_counter_wrap(tmp_path):
    with FakePowercap(tmp_path, package_w=95.0, dram_w=12.0):
        rapl = sources.Rapl(sources.SourceSpec("rapl"), tmp_path)
        assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:0:0"]  # core is inside the package
        readings = []
        for _ in range(4):
            time.sleep(0.3)
            readings.append(rapl.read())
    # Each counter wraps (max_energy_range_uj) within the first second: undone, every reading is ~107 W.
    assert all(w == pytest.approx(107.0, rel=0.15) for w in readings), readings


def test_rapl_says_why_it_cannot_read(tmp_path, monkeypatch):
    with pytest.raises(sources.Unavailable, match="not present"):
        sources.Rapl(sources.SourceSpec("rapl"), tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(sources.Unavailable, match="no intel-rapl zone"):
        sources.Rapl(sources.SourceSpec("rapl"), tmp_path / "empty")
    FakePowercap(tmp_path / "locked", 1.0, 1.0)

    def refuse(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", refuse)  # as root, a chmod would not refuse this test
    with pytest.raises(sources.Unavailable, match="not readable .*root only since Linux 5.10"):
        sources.Rapl(sources.SourceSpec("rapl"), tmp_path / "locked")


def test_rapl_on_this_machine_where_it_is_readable():
    root = Path("/sys/class/powercap")
    try:
        rapl = sources.Rapl(sources.SourceSpec("rapl"), root)
    except sources.Unavailable as exc:
        pytest.skip(f"this machine: {exc}")
    time.sleep(0.5)
    assert 0.0 < rapl.read() < 5000.0


class StrictNvml:
    """pynvml's functions that trainperf calls, and nothing else: any other name is an AttributeError."""

    def __init__(self, watts: list[float], fail_init: bool = False) -> None:
        self.watts, self.fail_init, self.calls = watts, fail_init, []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.watts)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        assert isinstance(i, int) and 0 <= i < len(self.watts)
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h:08d}-aaaa".encode()

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self.watts[h] * 1000)  # milliwatts, as NVML answers

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 1_000_000 * (h + 1)  # millijoules


def test_nvml_sums_the_visible_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = StrictNvml([300.0, 250.5, 410.0])
    nvml = sources.Nvml(sources.SourceSpec("nvml"), fake)
    assert nvml.read() == pytest.approx(960.5) and nvml.energy_counter_j() == pytest.approx(6000.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-00000000")
    assert sources.Nvml(sources.SourceSpec("nvml"), fake).read() == pytest.approx(710.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(sources.Unavailable, match="no GPU visible .*CUDA_VISIBLE_DEVICES=7"):
        sources.Nvml(sources.SourceSpec("nvml"), fake)
    with pytest.raises(sources.Unavailable, match="cannot start .*Library Not Found"):
        sources.Nvml(sources.SourceSpec("nvml"), StrictNvml([1.0], fail_init=True))


DCMI = """
    Instantaneous power reading:                   {w} Watts
    Minimum during sampling period:                 80 Watts
    Maximum during sampling period:                720 Watts
    Average power reading over sample period:      350 Watts
    IPMI timestamp:                           Sat Nov 28 10:00:00 2026
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated
"""


def _fake_ipmitool(folder: Path, body: str, code: int = 0) -> None:
    """An `ipmitool` that answers only `dcmi power reading`, as the BMC's tool prints it."""
    folder.mkdir(exist_ok=True)
    script = folder / "ipmitool"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      "if sys.argv[1:] != ['dcmi', 'power', 'reading']:\n"
                      "    sys.exit('unexpected arguments: ' + ' '.join(sys.argv[1:]))\n"
                      f"sys.stdout.write({body!r})\nsys.stderr.write({'Could not open device' if code else ''!r})\n"
                      f"sys.exit({code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_ipmi_reads_the_bmc_through_ipmitool(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    _fake_ipmitool(tmp_path / "bin", DCMI.format(w=612))
    assert sources.Ipmi(sources.SourceSpec("ipmi")).read() == 612.0
    _fake_ipmitool(tmp_path / "bin", "", code=1)
    with pytest.raises(sources.Unavailable, match="ipmitool dcmi power reading: Could not open device"):
        sources.Ipmi(sources.SourceSpec("ipmi"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(sources.Unavailable, match="ipmitool is not installed"):
        sources.Ipmi(sources.SourceSpec("ipmi"))


@pytest.fixture
def redfish():
    """A Redfish service answering GET on two Power resources (the classic and the newer schema) with basic auth."""
    answers = {"/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 1234}]},
               "/redfish/v1/Chassis/1/EnvironmentMetrics": {"PowerWatts": {"Reading": 880.5}},
               "/redfish/v1/Chassis/1/Thermal": {"Fans": []}}
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            body = answers.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body or {"error": "no such resource"}).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/redfish/v1/Chassis/1", seen
    server.shutdown()


def test_ipmi_reads_a_redfish_power_resource(redfish, monkeypatch):
    base, seen = redfish
    monkeypatch.setenv("TRAINPERF_REDFISH_USER", "admin")
    monkeypatch.setenv("TRAINPERF_REDFISH_PASSWORD", "secret")
    assert sources.Ipmi(sources.SourceSpec("ipmi", base + "/Power")).read() == 1234.0
    assert sources.Ipmi(sources.SourceSpec("ipmi", base + "/EnvironmentMetrics")).read() == 880.5
    assert seen[0] == "Basic YWRtaW46c2VjcmV0"
    with pytest.raises(sources.Unavailable, match="no PowerControl"):
        sources.Ipmi(sources.SourceSpec("ipmi", base + "/Thermal"))
    with pytest.raises(sources.Unavailable, match="Redfish .*404"):
        sources.Ipmi(sources.SourceSpec("ipmi", base + "/Nothing"))


def test_a_meters_log_is_read_or_refused_naming_the_line(tmp_path):
    good = tmp_path / "meter.csv"
    good.write_text("timestamp,watts\n1764324000.0,500\n1764324001.5,510.5\n\n")
    assert sources.read_meter_log(good) == ([(1764324000000, 500.0), (1764324001500, 510.5)], 1.0)
    for text, where in (("time,w\n1,2\n", ":1: expected the header timestamp,watts"),
                        ("timestamp,watts\n1764324000,500\n1764324001,lots\n", ":3: expected Unix seconds"),
                        ("timestamp,watts\n1764324000,-5\n", ":2: expected a time after 1970 and watts >= 0"),
                        ("timestamp,watts\n", ": no readings")):
        good.write_text(text)
        with pytest.raises(TrainperfError, match=f"meter.csv{where}"):
            sources.read_meter_log(good)
    mlperf = tmp_path / "node_0.txt"
    mlperf.write_text(power.official_log([(1000, 10.0), (2000, 20.0)], 500, 2000, "node_0"))
    assert sources.read_meter_log(mlperf) == ([(1000, 10.0), (2000, 20.0)], 1.0)


# -- the official layout and arithmetic -----------------------------------------------------------------------


def _readings(start: float, seconds: int, jitter: int = 40) -> list[tuple[int, float]]:
    rng = random.Random(seconds)
    return [(int(start - 1500 + i * 1000 + rng.randint(-jitter, jitter)), 300 + 80 * rng.random())
            for i in range(seconds + 4)]


def test_the_energy_is_the_official_summarizers(tmp_path):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.result_summarizer import result_summarizer as official

    start = 1_764_324_000_000.0
    for seconds in (95, 30):
        stop = start + seconds * 1000 + 317
        readings = _readings(start, seconds)
        path = tmp_path / f"node_{seconds}.txt"
        path.write_text(power.official_log(readings, start, stop, "node_0"))
        lines, errors = parse_file(str(path), "6.1.0")
        assert not errors
        ours = power.window_energy(readings, start, stop)
        assert ours["energy_j"] == pytest.approx(official._compute_power_node(lines, stop - start), rel=1e-12)
        # Readings cover the timed region: the window ends at the first one after run_stop.
        assert ours["window_ms"][1] > stop and ours["samples"] in (seconds, seconds + 1)
        assert ours["meets_sampling_rules"] == (seconds >= 60)
    sw = tmp_path / "sw_0.txt"
    sw.write_text(power.interconnect_log(45.0, start, start + 60_000))
    lines, _ = parse_file(str(sw), "6.1.0")
    assert official._compute_power_sw(lines, 60_000) == pytest.approx(45.0 * 60)


def test_a_gap_in_the_sampling_breaks_the_rules():
    start = 1_764_324_000_000.0
    readings = [r for r in _readings(start, 100) if not (start + 40_000 < r[0] < start + 44_000)]
    measured = power.window_energy(readings, start, start + 100_000)
    assert measured["max_gap_s"] > 4 and not measured["meets_sampling_rules"]


def _write_run_log(path: Path, start_ms: float, stop_ms: float, evals: list[float]) -> None:
    from trainperf.results.logs import MARKER

    lines = [{"key": "run_start", "time_ms": start_ms, "value": None}]
    lines += [{"key": "eval_stop", "time_ms": t, "value": None} for t in evals]
    lines += [{"key": "run_stop", "time_ms": stop_ms, "value": None, "metadata": {"status": "success"}}]
    path.write_text("".join(f"{MARKER}{json.dumps(dict(r, namespace='', event_type='POINT_IN_TIME'))}\n"
                            for r in lines))


def _sampled(request: power.PowerRequest, tmp_path: Path, seconds: float) -> tuple[Path, float, float]:
    """A run folder whose "run" is a timed wait with the sampler beside it: (folder, run_start, run_stop)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with power.sampling(request, run_dir):
        start = time.time() * 1000
        time.sleep(seconds)
        stop = time.time() * 1000
    _write_run_log(run_dir / "mlperf_log.txt", start, stop, [])
    return run_dir, start, stop


def test_the_sampler_runs_beside_the_timed_region_and_its_energy_lands_in_the_result(tmp_path, monkeypatch):
    """The whole path of a run with --power, the training replaced by a timed wait: the sampler process reads a
    powercap tree advancing at 120 W; the node file is the official one; result.json has the energy."""
    monkeypatch.setenv("TRAINPERF_POWERCAP_ROOT", str(tmp_path / "powercap"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"status": "success"}))
    (tmp_path / "powercap").mkdir()
    with FakePowercap(tmp_path / "powercap", package_w=100.0, dram_w=20.0):
        request = power.check(power.request_from("rapl", 0.1, interconnect_w=30.0))
        with power.sampling(request, run_dir):
            start = time.time() * 1000
            time.sleep(2.0)
            stop = time.time() * 1000
    _write_run_log(run_dir / "mlperf_log.txt", start, stop, [start + 800, start + 1600])
    summary = power.finish(request, run_dir, run_dir / "mlperf_log.txt", run_dir / "result.json")
    rapl = summary["sources"]["rapl"]
    assert rapl["average_w"] == pytest.approx(120.0, rel=0.15) and rapl["samples"] >= 15
    assert not rapl["meets_sampling_rules"]  # 2 s: fewer than the 60 samples the rules ask for
    assert summary["official_source"] == "rapl" and not summary["closed_accepted"]
    assert summary["energy_j"] == pytest.approx(rapl["energy_j"] + 30.0 * (stop - start) / 1000)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["energy_j"] == summary["energy_j"] and result["power"]["sources"]["rapl"]["accepted"].startswith(
        "indicative")
    assert (run_dir / "power" / "node_0.txt").is_file() and (run_dir / "power" / "sw_0.txt").is_file()
    assert (run_dir / "power" / "power_node_0.png").stat().st_size > 1000


def test_a_node_level_source_is_the_official_one_and_a_meter_log_is_merged(tmp_path):
    start = 1_764_324_000_000.0
    stop = start + 70_000
    meter = tmp_path / "pdu.csv"
    meter.write_text("timestamp,watts\n" + "".join(f"{(start + i * 500) / 1000},{700 + (i % 3)}\n"
                                                   for i in range(-4, 150)))
    run_dir = tmp_path / "run"
    (run_dir / "power").mkdir(parents=True)
    (run_dir / "power" / "readings_node_0.csv").write_text("".join(f"{i},{int(start + i * 1000)},rapl,150.0\n"
                                                            for i in range(-1, 75)))
    _write_run_log(run_dir / "mlperf_log.txt", start, stop, [])
    request = power.request_from(f"rapl,file:{meter}")
    summary = power.finish(request, run_dir, run_dir / "mlperf_log.txt", None)
    assert summary["official_source"] == f"file:{meter}" and summary["closed_accepted"]
    assert summary["energy_j"] == pytest.approx(701 * 70, rel=2e-3)
    assert summary["sources"]["rapl"]["energy_j"] == pytest.approx(150.0 * 70)
    assert summary["sources"][f"file:{meter}"]["meets_sampling_rules"]


@pytest.mark.slow
def test_a_series_with_power_is_checked_and_scored_as_the_official_package_does(tmp_path, monkeypatch):
    """Five runs' logs and power folders in the submission layout: the package checker's power checks pass,
    `score` gives each run's energy and the olympic energy score equal to the official summarizer's."""
    import dataclasses

    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.package_checker.power_checker import PowerChecker
    from mlperf_logging.result_summarizer import result_summarizer as official

    from trainperf.results import scoring

    # These hand-made SSD logs lack the hyperparameters the compliance rules ask for: counted as converged runs
    # on both sides (ours and the official summarizer's), so that what is compared is the energy alone.
    real = scoring.score_run
    monkeypatch.setattr(scoring, "score_run", lambda path, ruleset: (
        dataclasses.replace(real(path, ruleset)[0], converged=True, reason=None), real(path, ruleset)[1]))
    monkeypatch.setattr(official, "_read_result_file", lambda path, usage, ruleset: parse_file(path, ruleset)[0])

    folder = _series_with_power(tmp_path / "results" / "sys" / "ssd")
    assert PowerChecker("6.1.0").check_power(str(folder / "power"), [str(p) for p in sorted(
        folder.glob("result_*.txt"))]) == (True, set())
    scored = scoring.score_folder(folder)
    assert scored.converged == 5 and all(run.energy_j is not None for run in scored.runs)
    assert scored.energy_j == pytest.approx(_official_energy(folder, scored.ruleset), rel=1e-12)
    # Not the mean of all five: the runs the time score drops (fastest, slowest) are dropped here too.
    assert scored.energy_j != pytest.approx(sum(r.energy_j for r in scored.runs) / 5, rel=1e-6)
    (folder / "power" / "result_3" / "node_0.txt").unlink()
    again = scoring.score_folder(folder)
    assert again.energy_j is None and "no energy score: result_3" in again.note


def _official_energy(folder: Path, ruleset: str) -> float:
    import contextlib
    import io

    from mlperf_logging.result_summarizer import result_summarizer as official

    with contextlib.redirect_stdout(io.StringIO()):
        _, energy, _ = official._compute_strong_score_standalone(folder.name, folder.parent.name, True, str(folder),
                                                                  "training", ruleset)
    return energy


def _series_with_power(folder: Path) -> Path:
    """result_0..4 (closed logs the official checker passes, of different lengths) and, for each, a node's
    power log and the interconnect's estimate."""
    from tests.conftest import write_minimal_closed_log
    from trainperf.results.logs import MARKER

    folder.mkdir(parents=True)
    for i, seconds in enumerate((70, 64, 81, 75, 90)):
        path = folder / f"result_{i}.txt"
        write_minimal_closed_log(path, "ssd", 32, {}, 0.99, 1)
        lines = path.read_text().splitlines()
        records = [json.loads(line[len(MARKER):]) for line in lines]
        start = next(r["time_ms"] for r in records if r["key"] == "run_start")
        for r in records:
            if r["key"] == "run_stop":
                r["time_ms"] = start + seconds * 1000
        path.write_text("".join(f"{MARKER}{json.dumps(r)}\n" for r in records))
        (folder / "power" / f"result_{i}").mkdir(parents=True)
        (folder / "power" / f"result_{i}" / "node_0.txt").write_text(
            power.official_log(_readings(start, seconds), start, start + seconds * 1000, "node_0"))
        (folder / "power" / f"result_{i}" / "sw_0.txt").write_text(
            power.interconnect_log(25.0, start, start + seconds * 1000))
    return folder


@pytest.mark.slow
@pytest.mark.to_target
def test_a_series_run_with_power_leaves_the_official_layout(tmp_path, monkeypatch):
    """`trainperf run ncf --runs 1 --power rapl`: the sampler beside the run (a powercap tree at 80 W), each run's
    energy in its result.json, the node logs under <benchmark>/power/result_<i>/, and `score` reading them."""
    from trainperf.cli import main
    from trainperf.results import scoring

    (tmp_path / "powercap").mkdir()
    monkeypatch.setenv("TRAINPERF_POWERCAP_ROOT", str(tmp_path / "powercap"))
    with FakePowercap(tmp_path / "powercap", package_w=70.0, dram_w=10.0):
        code = main(["run", "ncf", "--runs", "1", "--seed", "0", "--quiet", "--out", str(tmp_path / "sub"),
                     "--power", "rapl", "--power-interval", "0.1"])
    assert code == 0
    results = sorted((tmp_path / "sub").rglob("result_*.txt"))
    assert [p.name for p in results] == ["result_0.txt"]
    folder = results[0].parent
    for i in range(1):
        assert (folder / "power" / f"result_{i}" / "node_0.txt").is_file()
        detail = json.loads(next((tmp_path / "sub").rglob(f"run_{i}/result.json")).read_text())
        assert detail["power"]["sources"]["rapl"]["average_w"] == pytest.approx(80.0, rel=0.2)
        assert detail["energy_j"] == pytest.approx(80.0 * detail["time_to_train_s"], rel=0.2)
    assert main(["report", str(tmp_path / "sub"), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "Energy to train" in page and "alt='" in page.split("Energy to train", 1)[1]
    scored = scoring.score_folder(folder)
    assert [r.energy_j for r in scored.runs] == pytest.approx(
        [json.loads(next((tmp_path / "sub").rglob(f"run_{i}/result.json")).read_text())["energy_j"]
         for i in range(1)], rel=1e-9)


FAKE_PYNVML = '''"""A strict pynvml: the calls trainperf makes and nothing else (another name is an AttributeError)."""
import os
WATTS = [float(w) for w in os.environ["FAKE_NVML_WATTS"].split(",")]
_up = False
def nvmlInit():
    global _up
    _up = True
def nvmlShutdown():
    global _up
    assert _up, "shutdown without init"
    _up = False
def nvmlDeviceGetCount():
    assert _up, "NVML not initialised"
    return len(WATTS)
def nvmlDeviceGetHandleByIndex(i):
    assert _up and 0 <= i < len(WATTS)
    return ("handle", i)
def nvmlDeviceGetUUID(h):
    return "GPU-%08d" % h[1]
def nvmlDeviceGetPowerUsage(h):
    assert _up and h[0] == "handle"
    return int(WATTS[h[1]] * 1000)
def nvmlDeviceGetTotalEnergyConsumption(h):
    import time
    return int(time.time() * 1000 * WATTS[h[1]])  # mJ, growing at the board's power
'''


def test_the_sampler_reads_nvml_in_its_own_process(tmp_path, monkeypatch):
    """`--power nvml` end to end with a strict pynvml module on the path (the sampler process imports it)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pynvml.py").write_text(FAKE_PYNVML)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FAKE_NVML_WATTS", "300,280")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sys.modules.pop("pynvml", None)
    request = power.check(power.request_from("nvml", 0.1))
    run_dir, start, stop = _sampled(request, tmp_path, 1.0)
    summary = power.finish(request, run_dir, run_dir / "mlperf_log.txt", None)
    nvml = summary["sources"]["nvml"]
    assert nvml["average_w"] == pytest.approx(580.0) and nvml["samples"] >= 7
    # The counters grow at 580 W over the whole sampling (from before run_start to after run_stop).
    assert nvml["energy_counter_j"] == pytest.approx(580.0 * (stop - start) / 1000, rel=0.6)
    assert nvml["energy_counter_j"] > nvml["energy_j"]
    sys.modules.pop("pynvml", None)


PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published_power_v5.0_lenovo_bert.tar.xz"


@pytest.mark.slow
def test_a_published_power_submission_scores_as_the_official_summarizer(tmp_path):
    """Lenovo's MLPerf Training v5.0 BERT power submission on one SR780aV3 (8x B200): 10 runs, a node's PSU
    log per run (1 Hz, conversion_eff 0.94 AC), unmodified from mlcommons/training_results_v5.0 at 0fdc28f
    (Lenovo/results/SR780aV3-8xB200_SXM_180GB/bert; Apache-2.0), packed with xz. `score`'s energy equals the
    official summarizer's on it: each run's joules and the olympic energy score (the published results pages'
    figure for it was not found to compare with)."""
    import contextlib
    import io
    import tarfile

    from mlperf_logging.result_summarizer import result_summarizer as official

    from trainperf.results import scoring

    with tarfile.open(PUBLISHED) as archive:
        archive.extractall(tmp_path, filter="data")
    folder = tmp_path / "SR780aV3-8xB200_SXM_180GB" / "bert"
    scored = scoring.score_folder(folder, "5.0.0")
    with contextlib.redirect_stdout(io.StringIO()):
        tracked, energies, time_score, energy_score, _ = official._compute_strong_score_standalone(
            "bert", folder.parent.name, True, str(folder), "training", "5.0.0", return_full_scores=True)
    assert scored.converged == 10 and scored.score == pytest.approx(time_score, rel=1e-12)
    assert scored.energy_j == pytest.approx(energy_score, rel=1e-12) == pytest.approx(1_949_215.94, abs=0.01)
    assert {Path(r.file).name: r.energy_j for r in scored.runs} == pytest.approx(
        {Path(f).name: j for f, j in energies.items()}, rel=1e-12)
    # The node file's own arithmetic, by trainperf's reading of it: conversion_eff 0.94 applied.
    node = folder / "power" / "result_0" / "node_0.txt"
    readings, eff = sources.read_meter_log(node)
    assert eff == 0.94
    run = scored.runs[[Path(r.file).name for r in scored.runs].index("result_0.txt")]
    assert 0.94 * power.window_energy(readings, readings[0][0] - 1000, readings[0][0] - 1000 + run.minutes * 60_000
                                      )["energy_j"] == pytest.approx(run.energy_j, rel=0.02)


# -- what goes wrong ---------------------------------------------------------------------------------------------


def test_no_reading_inside_the_timed_region_writes_no_power_log(tmp_path):
    """A meter log on another clock (its readings all before the run): no node file of 0 J, said in one line."""
    start = 1_764_324_000_000.0
    meter = tmp_path / "pdu.csv"
    meter.write_text("timestamp,watts\n" + "".join(f"{(start - 3_600_000 + i * 1000) / 1000},700\n" for i in range(90)))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_run_log(run_dir / "mlperf_log.txt", start, start + 60_000, [])
    said = []
    summary = power.finish(power.request_from(f"file:{meter}", interconnect_w=20.0), run_dir,
                           run_dir / "mlperf_log.txt", None, said.append)
    assert summary["energy_j"] is None and not list((run_dir / "power").glob("*.txt"))
    assert said == [f"power: no source has a reading inside the timed region: no power log written (file:{meter})"]


def test_a_merged_mlperf_power_log_keeps_its_conversion_efficiency(tmp_path):
    """A PSU log at conversion_eff 0.94 (as Lenovo's published ones): its energy is 0.94 of the readings', in
    result.json and in the node file the official summarizer reads."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.result_summarizer import result_summarizer as official

    start = 1_764_324_000_000.0
    stop = start + 80_000
    meter = tmp_path / "psu.txt"
    meter.write_text(power.official_log([(int(start + i * 1000), 1000.0) for i in range(-3, 85)], start - 3000,
                                        start + 84_000, "node_0", "AC", 0.94))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_run_log(run_dir / "mlperf_log.txt", start, stop, [])
    summary = power.finish(power.request_from(f"file:{meter}"), run_dir, run_dir / "mlperf_log.txt", None)
    assert summary["energy_j"] == pytest.approx(0.94 * 1000 * 80)
    lines, _ = parse_file(str(run_dir / "power" / "node_0.txt"), "6.1.0")
    assert official._compute_power_node(lines, stop - start) == pytest.approx(summary["energy_j"], rel=1e-12)
    meter.write_text(meter.read_text().replace('"value": 0.94', '"value": 1.5'))
    with pytest.raises(TrainperfError, match=r"psu.txt: conversion_eff 1.5: expected a number in \(0, 1\]"):
        sources.read_meter_log(meter)


def test_readings_that_stop_before_run_stop_break_the_sampling_rules():
    start = 1_764_324_000_000.0
    half = [(int(start + i * 500), 300.0) for i in range(1, 200)]  # 100 s of a 200 s run
    measured = power.window_energy(half, start, start + 200_000)
    assert measured["max_gap_s"] == pytest.approx(100.5) and not measured["meets_sampling_rules"]


def test_a_source_failing_mid_run_is_noted_and_the_sampling_goes_on(tmp_path, monkeypatch):
    """An ipmitool that answers three times, then fails: the failures are in the readings file, in the summary
    and on the terminal; the readings before them still count."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "ipmitool"
    counter = tmp_path / "calls"
    script.write_text(f"#!{sys.executable}\nimport pathlib, sys\np = pathlib.Path({str(counter)!r})\n"
                      "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
                      f"if n > 3:\n    sys.stderr.write('Error: Unable to establish IPMI v2 / RMCP+ session')\n"
                      f"    sys.exit(1)\nsys.stdout.write({DCMI.format(w=450)!r})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    request = power.check(power.request_from("ipmi", 0.1))
    run_dir, start, stop = _sampled(request, tmp_path, 0.8)
    said = []
    summary = power.finish(request, run_dir, run_dir / "mlperf_log.txt", None, said.append)
    assert "failed,ipmi,IPMI: ipmitool dcmi power reading: Error: Unable to establish" in summary["sampler"]
    assert said[0].startswith("power: the sampler said: failed,ipmi")
    raw = (run_dir / "power" / "readings_node_0.csv").read_text().splitlines()
    # Calls 1 and 2: the check before the run and the sampler opening the source; call 3: the first tick.
    assert sum(1 for line in raw if line.endswith(",ipmi,450.000")) == 1
    assert sum(1 for line in raw if line.startswith("# failed,ipmi,")) >= 3


def test_one_sampler_a_node_and_one_result_holder(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                 "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NODEID", "3")  # a single-node run on the fourth node of an allocation
    assert power.samples_here() and power.holds_result() and power.node_index() == 0
    monkeypatch.setenv("SLURM_PROCID", "9")  # srun: task 9 of 16, the second on node 3
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert not power.samples_here() and not power.holds_result() and power.node_index() == 3
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert power.samples_here() and not power.holds_result()
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "16"), ("LOCAL_RANK", "0"), ("GROUP_RANK", "0")):
        monkeypatch.setenv(name, value)  # torchrun's variables come first
    assert power.samples_here() and power.holds_result() and power.node_index() == 0


def test_minigo_is_refused_with_power():
    from trainperf import jobs

    with pytest.raises(TrainperfError, match="minigo's evaluations are off the MLPerf clock"):
        jobs.start(jobs.RunRequest(workload="minigo", power=power.request_from("rapl", optional=True)))


@pytest.mark.second_tier
@pytest.mark.multiprocess
def test_a_run_on_two_processes_is_sampled_once_by_its_launcher(tmp_path, monkeypatch):
    """`trainperf run ncf --nproc 2 --power rapl`: the launching process samples (its ranks are not asked to),
    and rank 0's result.json gets the energy."""
    from trainperf.cli import main

    (tmp_path / "powercap").mkdir()
    monkeypatch.setenv("TRAINPERF_POWERCAP_ROOT", str(tmp_path / "powercap"))
    with FakePowercap(tmp_path / "powercap", package_w=50.0, dram_w=5.0):
        code = main(["run", "ncf", "--nproc", "2", "--seed", "0", "--quiet", "--out", str(tmp_path / "run"),
                     "--power", "rapl", "--power-interval", "0.2"])
    assert code == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["power"]["sources"]["rapl"]["average_w"] == pytest.approx(55.0, rel=0.2)
    assert sorted(p.name for p in (tmp_path / "run" / "power").iterdir()) == [
        "node_0.txt", "power_node_0.png", "readings_node_0.csv"]
