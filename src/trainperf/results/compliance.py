"""Run the official MLCommons compliance checker on a log, with the ruleset that knows its benchmark."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.results import keys
from trainperf.results.logs import for_official_checker, read_records
from trainperf.rulesets import RULESET_KEY, WORKLOAD_KEY


@dataclass
class CheckResult:
    valid: bool
    benchmark: str
    division: str
    ruleset: str
    output: str
    config: str | None = None  # trainperf's own rules file, for benchmarks no official ruleset knows

    @property
    def verdict(self) -> str:
        return "SUCCESS" if self.valid else "FAILED"

    def problems(self) -> list[str]:
        """The checker's own complaint lines (ERROR/WARNING), for a short report."""
        return [line for line in self.output.splitlines()
                if line.startswith(("ERROR", "WARNING")) and "FAILED" not in line]


def read_header(log: Path) -> dict[str, str]:
    """submission_benchmark, submission_division and (trainperf's logs) the workload and ruleset from a log (noise
    lines between records ignored)."""
    found: dict[str, str] = {}
    for record in read_records(log):
        if record["key"] in ("submission_benchmark", "submission_division", WORKLOAD_KEY, RULESET_KEY):
            found.setdefault(record["key"], str(record.get("value")))
    if "submission_benchmark" not in found:
        raise TrainperfError(f"{log}: no ':::MLLOG' submission_benchmark record (is this an MLPerf log?)")
    return found


def check(log: Path, ruleset: str | None = None) -> CheckResult:
    """Run `python -m mlperf_logging.compliance_checker --usage training --ruleset R LOG`."""
    header = read_header(log)
    benchmark = header["submission_benchmark"]
    if ruleset is None:
        ruleset = keys.ruleset_for(benchmark, header.get(WORKLOAD_KEY), header.get(RULESET_KEY))
        if ruleset is None:
            raise TrainperfError(f"{log}: no compliance ruleset is known for benchmark {benchmark!r}")
    own = keys.own_rules(benchmark, header.get(WORKLOAD_KEY))
    with tempfile.TemporaryDirectory() as tmp, for_official_checker(log) as copy:
        cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
               "--ruleset", ruleset, "--log_output", str(Path(tmp) / "checker.log"), str(copy)]
        if own is not None:
            cmd[-1:-1] = ["--config", str(own)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # The checker names the copy it was given (a temporary file, gone by now): name the user's log.
    output = (proc.stdout + proc.stderr).strip().replace(str(copy), str(log))
    output = "\n".join(line for line in output.splitlines() if tmp not in line)
    return CheckResult(valid=proc.returncode == 0, benchmark=benchmark,
                       division=header.get("submission_division", "?"), ruleset=ruleset, output=output,
                       config=str(own) if own else None)
