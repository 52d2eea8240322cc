"""The workload contract and the typed records the harness, runtime and results share.

A workload *declares* what it is (name, MLPerf key, ruleset, metric, recipes, eval schedule) and
*returns* the parts the harness needs (model, optimizer, loss, LR schedule, data, evaluation).
It never starts a clock, writes a log or touches the process group: the harness owns those.
"""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from trainperf.errors import TrainperfError

SCALES = ("mini", "full")


@dataclass(frozen=True)
class Metric:
    """A quality metric: its name and which direction is better."""

    name: str
    higher_is_better: bool = True

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target


@dataclass(frozen=True)
class EvalSchedule:
    """Evaluate after epoch `first`, then every `every` epochs (MLPerf ResNet: every 4, first at 1..4)."""

    every: int
    first: int

    def __post_init__(self) -> None:
        if self.every < 1 or self.first < 1:
            raise TrainperfError(
                f"eval schedule: eval_every and eval_first must be >= 1, got {self.every} and {self.first}"
            )

    def due(self, epoch: int) -> bool:
        return epoch >= self.first and (epoch - self.first) % self.every == 0

    def next_eval(self, epoch: int) -> int:
        """The first epoch >= `epoch` after which an evaluation is due."""
        if epoch <= self.first:
            return self.first
        return epoch + (-(epoch - self.first)) % self.every

    def blocks(self, max_epochs: int) -> Iterator[tuple[int, int]]:
        """(first_epoch_num, epoch_count) of each training block: epochs between two evaluations."""
        start = 1
        while start <= max_epochs:
            stop = min(self.next_eval(start), max_epochs)
            yield start, stop - start + 1
            start = stop + 1


@dataclass(frozen=True)
class Recipe:
    """Fields every recipe has. Workloads subclass it with their own typed fields.

    A recipe is data: variants (another optimizer, another batch size) are new recipes, and any field
    can be overridden from the command line with `--set key=value` (see `with_overrides`).
    """

    name: str
    global_batch_size: int
    max_epochs: int
    target: float
    eval_every: int
    eval_first: int
    grad_accum_steps: int = 1
    # Evaluations inside each epoch, evenly spaced by steps (DLRM: 20, i.e. every 0.05 epoch); the
    # last of them is the end-of-epoch evaluation that eval_every/eval_first schedule.
    evals_per_epoch: int = 1
    # Speedups the recipe turns on (applied by the runtime, never by the workload; see runtime/speedups).
    precision: str = "fp32"  # fp32 | bf16 | fp16 (torch.autocast; fp16 with gradient scaling)
    channels_last: bool = False
    compile: bool = False  # torch.compile of the model, warmed up on synthetic batches before run_start
    cuda_graphs: bool = False  # capture the model's forward and backward once, replay them (GPU only)
    fused_optimizer: bool = False  # torch's fused optimizer kernels where they exist (else foreach)
    async_eval: bool = False  # score evaluations in a background thread while training goes on

    # Values a field may take, for fields restricted to a set (checked by `validate`).
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {}

    @property
    def eval_schedule(self) -> EvalSchedule:
        return EvalSchedule(every=self.eval_every, first=self.eval_first)

    def validate(self) -> None:
        """Raise TrainperfError naming the field when a value makes no sense."""
        for key in ("global_batch_size", "max_epochs", "eval_every", "eval_first", "grad_accum_steps",
                    "evals_per_epoch"):
            if getattr(self, key) < 1:
                raise TrainperfError(f"recipe field {key} must be >= 1, got {getattr(self, key)}")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise TrainperfError(f"recipe field precision={self.precision!r} is not one of: fp32, bf16, fp16")
        for key, allowed in self.CHOICES.items():
            if getattr(self, key) not in allowed:
                raise TrainperfError(
                    f"recipe field {key}={getattr(self, key)!r} is not one of: "
                    + ", ".join(str(a) for a in allowed)
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_overrides(self, assignments: Iterable[str]) -> Recipe:
        """Return a copy with `key=value` assignments applied, each parsed to the field's type."""
        hints = typing.get_type_hints(type(self))
        fields = {f.name for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for item in assignments:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or not key:
                raise TrainperfError(f"--set {item!r}: expected key=value")
            if key not in fields:
                raise TrainperfError(
                    f"--set {item!r}: unknown recipe field {key!r}; valid fields: " + ", ".join(sorted(fields))
                )
            changes[key] = _parse_value(raw.strip(), hints[key], f"--set {item!r}")
        recipe = dataclasses.replace(self, **changes)
        recipe.validate()
        return recipe


def _parse_value(raw: str, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin is tuple:
        (item_type, *_rest) = typing.get_args(annotation)
        parts = [p for p in raw.replace(" ", "").split(",") if p]
        return tuple(_parse_value(p, item_type, where) for p in parts)
    if annotation is bool:
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise TrainperfError(f"{where}: expected a boolean (true/false), got {raw!r}")
    if annotation is int:
        try:
            return int(raw)
        except ValueError:
            raise TrainperfError(f"{where}: expected an integer, got {raw!r}") from None
    if annotation is float:
        try:
            return float(raw)
        except ValueError:
            raise TrainperfError(f"{where}: expected a number, got {raw!r}") from None
    return raw


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module a workload built, under the runtime's wrappers (torch.compile's, then DDP's)."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


@dataclass
class ModelParts:
    """What a workload builds during initialisation (before run_start): no data is touched here."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    # loss_fn(model, batch) -> scalar loss tensor (the forward pass; the runtime owns backward/step).
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    # lr_schedule(steps_per_epoch) -> f(step) giving the LR multiplier of every param group at `step`.
    lr_schedule: Callable[[int], Callable[[int], float]]


@dataclass
class EvalPartial:
    """One process's share of an evaluation. The harness combines all processes (sums added, gathers
    concatenated in rank order) and `metric` turns the combined tensors into the quality value."""

    metric: Callable[[dict[str, torch.Tensor]], float]
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    gathers: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class DataParts:
    """What a workload opens after run_start: the training batches and the evaluation."""

    # train_batches(epoch) -> this process's batches for that epoch, already on the device.
    train_batches: Callable[[int], Iterable[Any]]
    steps_per_epoch: int
    train_samples: int
    eval_samples: int
    # evaluate(model) -> this process's share of the evaluation set, scored (see EvalPartial).
    evaluate: Callable[[torch.nn.Module], EvalPartial]
    batch_samples: Callable[[Any], int] = field(default=lambda batch: int(batch[0].shape[0]))


class Workload(ABC):
    """One MLPerf benchmark: identity, metric, recipes per scale, data and parts."""

    name: ClassVar[str]
    benchmark: ClassVar[str]  # the mllog `submission_benchmark` value
    ruleset: ClassVar[str]  # the compliance-checker ruleset that knows this benchmark
    metric: ClassVar[Metric]
    summary: ClassVar[str]
    mlperf_runs: ClassVar[int]  # number of runs MLPerf scores with the olympic mean
    # Speedup switches that apply to this workload (e.g. channels-last needs a convolutional model).
    speedups: ClassVar[frozenset[str]] = frozenset({"precision", "compile", "fused_optimizer"})

    @abstractmethod
    def recipes(self, scale: str) -> dict[str, Recipe]:
        """Named recipes for a scale; the first is the default."""

    def recipe(self, scale: str, name: str | None = None) -> Recipe:
        options = self.recipes(scale)
        if name is None:
            return next(iter(options.values()))
        if name not in options:
            raise TrainperfError(
                f"--recipe {name!r}: unknown for {self.name} {scale}; choose one of: " + ", ".join(options)
            )
        return options[name]

    def default_data_dir(self, scale: str) -> Path | None:
        """Where the mini dataset is generated; full scale has no default (the user says --data)."""
        from trainperf.paths import cache_root

        return cache_root() / f"{self.name}-mini" if scale == "mini" else None

    @abstractmethod
    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        """What is missing or malformed in `data_dir` for this scale (empty when ready)."""

    @abstractmethod
    def prepare(self, scale: str, data_dir: Path, say: Callable[[str], None]) -> None:
        """mini: generate the dataset in the real on-disk format; full: verify and raise on problems."""

    @abstractmethod
    def mlperf_hyperparameters(self, recipe: Recipe, ctx: Any) -> dict[str, Any]:
        """The hyperparameter keys the closed ruleset requires, with this recipe's values."""

    def eval_epoch_num(self, epochs: float) -> float:
        """The `epoch_num` an evaluation taken after `epochs` epochs of training is logged with.
        Most rules log the epochs completed; DLRM's log 1 + the fraction of the epoch (1.05, 1.10…)."""
        return epochs

    # Whether `build` needs the prepared dataset's metadata (e.g. NCF sizes its embeddings by it).
    needs_data_to_build: ClassVar[bool] = False

    @abstractmethod
    def build(self, recipe: Recipe, ctx: Any, data_dir: Path | None = None) -> ModelParts:
        """Model (on ctx.device), optimizer, loss and LR schedule. Must not read the dataset itself;
        it may read the metadata `prepare()` wrote (sizes), which is not training data."""

    @abstractmethod
    def load_data(self, recipe: Recipe, data_dir: Path, ctx: Any) -> DataParts:
        """Open the dataset (timed: called after run_start)."""

    @abstractmethod
    def synthetic_batch(self, recipe: Recipe, ctx: Any, model: torch.nn.Module | None = None) -> Any:
        """A device-resident random batch shaped like this process's training batches (for warm-up,
        compilation and throughput runs; never used for a quality result)."""


@dataclass
class Evaluation:
    epoch: float  # epochs of training before it (fractional for evaluations inside an epoch)
    value: float
    samples: int  # training samples seen when the evaluation was taken
    time_s: float  # since run_start


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
    target: float
    time_to_train_s: float | None  # run_start -> run_stop, from the log's clock
    init_time_s: float
    epochs: int  # epochs completed
    samples: int  # training samples processed
    epochs_to_target: float | None
    samples_to_target: int | None
    final_metric: float | None
    evaluations: list[Evaluation]
    train_samples_per_s: float | None  # training throughput, evaluation time excluded
    epoch_times_s: list[float]
    train_samples: int | None
    eval_samples: int | None
    division: str
    recipe: dict[str, Any]
    environment: dict[str, Any]
    log_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
