"""Where a run's power comes from: the sources `--power` names, each able to say in one line why it is not
available on this machine, and to read watts now.

What MLPerf's power rules (training_policies `power_measurement.adoc`) accept for a closed submission is a
node's power at its supply or PDU: `ipmi` (the BMC's PSU reading, through ipmitool's DCMI or a Redfish
endpoint) and `file:` (a PDU's or meter's own log) can be that. `nvml` (the GPUs alone) and `rapl` (the CPU
packages and DRAM) leave out fans, NICs, disks and the supplies' losses: indicative only.
"""

from __future__ import annotations

import base64
import csv
import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainperf.errors import TrainperfError

LIVE = ("nvml", "rapl", "ipmi")
NODE_LEVEL = ("ipmi", "file")  # what the rules accept as a node's power (the PSU or PDU side)
ACCEPTANCE = {
    "ipmi": "node-level (the BMC's PSU reading): accepted for a closed submission when the BMC's meter is within "
            "the rules' 5 %",
    "file": "node-level when the meter is the node's PDU or an inline meter: accepted for a closed submission "
            "(meter within 5 %)",
    "nvml": "indicative only: the GPUs' own boards, without CPUs, memory, fans, NICs or the supplies' losses",
    "rapl": "indicative only: CPU packages and DRAM from the kernel's counters, without GPUs or the supplies",
}
SPEC_HELP = "nvml, rapl, ipmi, ipmi:URL (a Redfish Power resource) or file:PATH"


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # nvml, rapl, ipmi, file
    target: str = ""  # ipmi: a Redfish URL ("" = ipmitool); file: the path

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.target}" if self.target else self.kind

    @property
    def node_level(self) -> bool:
        return self.kind in NODE_LEVEL


def parse_specs(text: str) -> list[SourceSpec]:
    """`--power nvml,rapl` into its sources; a malformed one refused in one line."""
    specs: list[SourceSpec] = []
    for raw in (part.strip() for part in text.split(",")):
        kind, _, target = raw.partition(":")
        if kind in ("nvml", "rapl") and not target:
            spec = SourceSpec(kind)
        elif kind == "ipmi" and (not target or re.match(r"https?://", target)):
            spec = SourceSpec("ipmi", target)
        elif kind == "file" and target:
            spec = SourceSpec("file", str(Path(target).expanduser().absolute()))
        else:
            raise TrainperfError(f"--power {raw or text!r}: expected {SPEC_HELP}, separated by commas")
        if spec in specs:
            raise TrainperfError(f"--power {text}: {spec.name} is named twice")
        specs.append(spec)
    return specs


class Unavailable(Exception):
    """A source this machine cannot read, with the one line that says why."""


class Source:
    """A live source: `read()` gives the watts of the interval since the previous read (or now)."""

    spec: SourceSpec

    def read(self) -> float | None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what reading held (NVML's handle)."""


class Nvml(Source):
    """Every visible GPU's board power (nvmlDeviceGetPowerUsage, mW), summed: the average over the driver's
    last sampling window (~1 s on recent GPUs) — the interval before the reading, as the summarizer counts it."""

    def __init__(self, spec: SourceSpec, nvml: Any = None) -> None:
        self.spec = spec
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise Unavailable("NVML: pynvml is not installed (pip install 'trainperf[power]')") from None
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_* (no driver, no GPU) are its own classes
            raise Unavailable(f"NVML: cannot start ({exc})") from None
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.handles = _visible(nvml, handles, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not self.handles:
            nvml.nvmlShutdown()
            raise Unavailable("NVML: no GPU visible" + (" (CUDA_VISIBLE_DEVICES="
                                                       f"{os.environ['CUDA_VISIBLE_DEVICES']})"
                                                       if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
        self.read()  # a GPU without power readings (some virtual ones) refuses here, not mid-run

    def read(self) -> float | None:
        try:
            return sum(self.nvml.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1000.0
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"NVML: cannot read the GPUs' power ({exc})") from None

    def energy_counter_j(self) -> float | None:
        """The GPUs' total energy counters (Volta and later, mJ), summed: a cross-check of the readings."""
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0
        except Exception:  # noqa: BLE001 - older GPUs have no counter
            return None

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _visible(nvml: Any, handles: list[Any], visible: str | None) -> list[Any]:
    """The GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs), all of them when it is unset."""
    if visible is None:
        return handles
    chosen = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit():
            if int(item) < len(handles):
                chosen.append(handles[int(item)])
            continue
        for h in handles:
            uuid = nvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid.startswith(item):
                chosen.append(h)
    return chosen


class Rapl(Source):
    """The CPU packages and their DRAM from the kernel's powercap counters (energy_uj, µJ), as watts over the
    interval since the previous read; a counter's wrap (max_energy_range_uj) is undone."""

    def __init__(self, spec: SourceSpec, root: Path = Path("/sys/class/powercap")) -> None:
        self.spec = spec
        if not root.is_dir():
            raise Unavailable(f"RAPL: {root} is not present (no powercap driver on this kernel or machine)")
        zones = sorted(p for p in root.iterdir() if re.fullmatch(r"intel-rapl:\d+", p.name))
        # A package's dram subzone is outside the package's own counter; its core/uncore subzones are inside.
        zones += sorted(p for z in zones for p in z.glob(z.name + ":*")
                        if _text(p / "name").strip() == "dram")
        if not zones:
            raise Unavailable(f"RAPL: no intel-rapl zone under {root} (AMD CPUs need the powercap driver too)")
        self.zones = zones
        self.ranges = [int(_text(z / "max_energy_range_uj") or 0) for z in zones]
        try:
            self.last = self._energies()
        except PermissionError:
            raise Unavailable(f"RAPL: {zones[0] / 'energy_uj'} is not readable (root only since Linux 5.10: "
                              "run as root or grant read access to the powercap files)") from None
        self.last_t = time.monotonic()

    def _energies(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def read(self) -> float | None:
        now, t = self._energies(), time.monotonic()
        joules = 0.0
        for i, (e, before) in enumerate(zip(now, self.last, strict=True)):
            delta = e - before
            if delta < 0:  # the counter wrapped
                delta += self.ranges[i]
            joules += delta / 1e6
        dt = t - self.last_t
        self.last, self.last_t = now, t
        return joules / dt if dt > 0 else None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


IPMI_LINE = re.compile(r"Instantaneous power reading:\s*([0-9.]+)\s*Watts", re.I)


class Ipmi(Source):
    """A node's power from its BMC: `ipmitool dcmi power reading` (the PSUs' input), or a Redfish Power
    resource (`PowerControl[0].PowerConsumedWatts`, or the newer `PowerWatts.Reading`). Redfish credentials
    come from TRAINPERF_REDFISH_USER / TRAINPERF_REDFISH_PASSWORD; TRAINPERF_REDFISH_INSECURE=1 accepts a BMC's
    self-signed certificate."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        if not spec.target and shutil.which("ipmitool") is None:
            raise Unavailable("IPMI: ipmitool is not installed (or give a Redfish URL: --power ipmi:https://BMC/"
                              "redfish/v1/Chassis/1/Power)")
        self.read()

    def read(self) -> float | None:
        return self._redfish() if self.spec.target else self._ipmitool()

    def _ipmitool(self) -> float:
        try:
            done = subprocess.run(["ipmitool", "dcmi", "power", "reading"], capture_output=True, text=True,
                                  timeout=5, check=False)
        except subprocess.TimeoutExpired:
            raise Unavailable("IPMI: ipmitool dcmi power reading took over 5 s") from None
        found = IPMI_LINE.search(done.stdout)
        if done.returncode != 0 or not found:
            why = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[0]
            raise Unavailable(f"IPMI: ipmitool dcmi power reading: {why}")
        return float(found.group(1))

    def _redfish(self) -> float:
        request = urllib.request.Request(self.spec.target, headers={"Accept": "application/json"})
        user = os.environ.get("TRAINPERF_REDFISH_USER")
        if user:
            token = base64.b64encode(f"{user}:{os.environ.get('TRAINPERF_REDFISH_PASSWORD', '')}".encode())
            request.add_header("Authorization", "Basic " + token.decode())
        context = ssl._create_unverified_context() if os.environ.get("TRAINPERF_REDFISH_INSECURE") == "1" else None
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                body = json.loads(response.read())
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise Unavailable(f"IPMI: Redfish {self.spec.target}: {exc}") from None
        watts = _redfish_watts(body)
        if watts is None:
            raise Unavailable(f"IPMI: Redfish {self.spec.target}: no PowerControl[0].PowerConsumedWatts or "
                              "PowerWatts.Reading in the answer")
        return watts


def _redfish_watts(body: Any) -> float | None:
    if not isinstance(body, dict):
        return None
    control = body.get("PowerControl")
    if isinstance(control, list) and control and isinstance(control[0], dict):
        value = control[0].get("PowerConsumedWatts")
        if isinstance(value, (int, float)):
            return float(value)
    reading = body.get("PowerWatts")
    if isinstance(reading, dict) and isinstance(reading.get("Reading"), (int, float)):
        return float(reading["Reading"])
    return None


def open_live(spec: SourceSpec) -> Source:
    """The source `spec` names, opened (raises Unavailable with its one line)."""
    if spec.kind == "nvml":
        return Nvml(spec)
    if spec.kind == "rapl":
        return Rapl(spec, Path(os.environ.get("TRAINPERF_POWERCAP_ROOT", "/sys/class/powercap")))
    if spec.kind == "ipmi":
        return Ipmi(spec)
    raise ValueError(spec.kind)


def read_meter_log(path: Path) -> tuple[list[tuple[int, float]], float]:
    """A meter's own log: a CSV with the header `timestamp,watts` (Unix seconds, watts), or a power log already
    in MLPerf's format (`:::MLLOG` power_reading records, and its `conversion_eff`, which the summarizer applies:
    0.94 for a PSU log read on the AC side, say). ((time in ms, watts) in time order, conversion efficiency)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read the meter's log ({exc.strerror})") from None
    if ":::MLLOG" in text:
        from trainperf.results.logs import read_records

        records = read_records(path)
        rows = [(int(r["time_ms"]), float(r["value"])) for r in records
                if r["key"] == "power_reading" and isinstance(r.get("value"), (int, float))]
        if not rows:
            raise TrainperfError(f"{path}: an MLPerf log without power_reading records")
        effs = [r["value"] for r in records if r["key"] == "conversion_eff"]
        eff = effs[-1] if effs else 1.0
        if not isinstance(eff, (int, float)) or not 0 < eff <= 1:
            raise TrainperfError(f"{path}: conversion_eff {eff!r}: expected a number in (0, 1]")
        return sorted(rows), float(eff)
    return _read_csv(path, text), 1.0


def _read_csv(path: Path, text: str) -> list[tuple[int, float]]:
    lines = text.splitlines()
    reader = csv.reader(lines)
    header = [h.strip().lower() for h in next(reader, [])]
    if header[:2] != ["timestamp", "watts"]:
        raise TrainperfError(f"{path}:1: expected the header timestamp,watts (Unix seconds, watts), found "
                             f"{','.join(header) or 'nothing'}")
    rows = []
    for number, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            t, w = float(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise TrainperfError(f"{path}:{number}: expected Unix seconds and watts, found {','.join(row)!r}") from None
        if not (w >= 0 and t > 0) or w != w:
            raise TrainperfError(f"{path}:{number}: expected a time after 1970 and watts >= 0, found {','.join(row)!r}")
        rows.append((round(t * 1000), w))
    if not rows:
        raise TrainperfError(f"{path}: no readings under its header")
    return sorted(rows)
