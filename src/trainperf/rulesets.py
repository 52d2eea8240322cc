"""The records trainperf adds to its MLPerf logs (the official checker ignores keys it does not know).
What the rules say of each benchmark key is declared by its workload (results/keys.py asks it)."""

from __future__ import annotations

import re

# Which trainperf workload wrote the log: two share an MLPerf key (RetinaNet was submitted as `ssd` in the
# v2.0 round, whose rules are 2.0.0, where the key meant SSD-ResNet34 under 1.0.0).
WORKLOAD_KEY = "trainperf_workload"
# The ruleset the run's recipe was written against (`Recipe.ruleset`, else the workload's): it decides.
RULESET_KEY = "trainperf_ruleset"


def known() -> list[str]:
    """The training rulesets the installed official checker knows ("1.0.0", "2.0.0", ...)."""
    from pathlib import Path

    import mlperf_logging

    folder = Path(mlperf_logging.__file__).parent / "compliance_checker"
    found = {p.name.removeprefix("training_") for p in folder.glob("training_*") if p.is_dir()}
    versions = [v for v in found if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
