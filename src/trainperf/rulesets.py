"""Which official compliance ruleset knows each MLPerf benchmark key (a leaf module: the results
layer reads it without importing any workload)."""

from __future__ import annotations

from pathlib import Path

# The ruleset of the `:::MLLOG` format whose checker knows the key (the oldest one that trainperf's
# workloads are written against). A workload's `ruleset` is taken from here.
RULESETS: dict[str, str] = {
    "resnet": "1.0.0", "ssd": "1.0.0", "maskrcnn": "1.0.0", "bert": "1.0.0", "rnnt": "1.0.0",
    "unet3d": "1.0.0", "minigo": "1.0.0", "dlrm": "1.0.0", "gnmt": "0.7.0", "transformer": "0.7.0",
    # No official ruleset of the :::MLLOG format knows ncf (retired after v0.5): the 0.7.0 common
    # rules plus trainperf's own rules file (OWN_RULES), run by the official checker.
    "ncf": "0.7.0",
}

# A workload logged under another's MLPerf key with a different ruleset: RetinaNet was submitted as
# `ssd` in the v2.0 round (ruleset 2.0.0), where the key meant SSD-ResNet34 under 1.0.0. trainperf's
# logs name their workload (the `trainperf_workload` record, which the checker ignores).
WORKLOAD_RULESETS: dict[str, str] = {"retinanet": "2.0.0"}
WORKLOAD_KEY = "trainperf_workload"
# Not an MLPerf key either: the ruleset the run's recipe was written against (`Recipe.ruleset`, else
# the workload's). It decides over both tables above.
RULESET_KEY = "trainperf_ruleset"

# Benchmarks whose convergence the RCP checker reads in training samples from the train_samples record
# (its --bert_train_samples mode): BERT logs no epochs, and NVIDIA's published logs put the pass count,
# not samples, in eval_accuracy's epoch_num.
RCP_TRAIN_SAMPLES: frozenset[str] = frozenset({"bert"})

# Benchmarks no official :::MLLOG ruleset knows: trainperf's own rules file for the official checker.
OWN_RULES: dict[str, Path] = {"ncf": Path(__file__).parent / "results" / "rules" / "ncf.yaml"}


def ruleset_for(benchmark: str, workload: str | None = None, logged: str | None = None) -> str | None:
    """The ruleset a log names (`trainperf_ruleset`), else its trainperf workload's where that differs
    from its benchmark key's, else the benchmark key's."""
    return logged or WORKLOAD_RULESETS.get(workload or "") or RULESETS.get(benchmark)
