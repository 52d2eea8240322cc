"""The records of a run: its evaluations and the result.json it leaves."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainperf.contract.quality import Quality


@dataclass
class Evaluation:
    epoch: float  # epochs of training before it (fractional for evaluations inside an epoch)
    value: Quality
    samples: int  # training samples seen when the evaluation was taken
    time_s: float  # since run_start
    epoch_num: float | None = None  # as logged (epochs, 1 + epochs, or samples)


@dataclass
class RunResult:
    """Everything a run folder's result.json holds."""

    workload: str
    benchmark: str
    scale: str
    recipe_name: str
    seed: int
    status: str  # "success" | "aborted"
    abort_reason: str | None
    metric: str
    target: Quality  # one value, or {name: target} for a composite metric
    time_to_train_s: float | None  # run_start -> run_stop, from the log's clock
    init_time_s: float
    epochs: int  # epochs completed
    samples: int  # training samples processed
    epochs_to_target: float | None
    samples_to_target: int | None
    final_metric: Quality | None
    evaluations: list[Evaluation]
    train_samples_per_s: float | None  # training throughput, evaluation time excluded
    epoch_times_s: list[float]
    train_samples: int | None
    eval_samples: int | None
    division: str
    recipe: dict[str, Any]
    environment: dict[str, Any]
    log_file: str | None = None
    steps: int = 0  # optimizer steps taken
    cadence: dict[str, Any] = field(default_factory=dict)  # the evaluation cadence as resolved for the data
    layout: dict[str, Any] | None = None  # how the model was distributed: the sharding plan (ModelParts.layout)
    # How busy the machine was while the run was timed (trainperf.runtime.load): `busy` says its time is
    # not a figure.
    machine_load: dict[str, Any] | None = None
    # The shapes the training batches were padded to (Workload.shape_buckets; None: not bucketed).
    shape_buckets: dict[str, Any] | None = None
    # The data side's running totals at the end of the run (DataParts.counters, process 0's): MiniGo's self-play
    # games, an RL workload's rollout tokens and its rollout and reward seconds. None: the workload keeps none.
    counters: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
