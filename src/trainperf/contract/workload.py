"""The Workload: what one MLPerf benchmark declares, and the parts and data it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic

import torch

from trainperf.contract.assets import Assets
from trainperf.contract.batches import count_samples, split_batch
from trainperf.contract.context import RuntimeContext
from trainperf.contract.golden import GoldenSpec
from trainperf.contract.mlperf import MLPerf
from trainperf.contract.parallel import Parallelism
from trainperf.contract.parts import DataParts, ModelParts
from trainperf.contract.probes import DeviceProbe, StepBudget
from trainperf.contract.quality import SCALES, Metric
from trainperf.contract.recipe import R
from trainperf.contract.scale import Scale
from trainperf.errors import TrainperfError


class Workload(ABC, Generic[R]):
    """One MLPerf benchmark: identity, metric, recipes per scale, data and parts."""

    name: ClassVar[str]
    benchmark: ClassVar[str]  # the mllog `submission_benchmark` value
    metric: ClassVar[Metric]
    summary: ClassVar[str]
    mlperf: ClassVar[MLPerf]  # how MLPerf scores it: ruleset, runs, olympic drop, full dataset sizes
    # Each scale's recipes and data source (spec.scale); `recipes`, `data_problems`, `prepare`, `sources`,
    # `verify` and `eval_set` dispatch on the scale's name to them.
    # A workload whose rules leave no room for a CPU-sized run (llama31_405b) declares `mini = None`: it
    # is full scale only, and its code path's mini is another workload's.
    mini: ClassVar[Scale[Any] | None]
    full: ClassVar[Scale[Any]]
    # Speedup switches that apply to this workload (e.g. channels-last needs a convolutional model);
    # "fp8" says that precision=fp8 does (a model made of Linear layers).
    speedups: ClassVar[frozenset[str]] = frozenset({"precision", "compile", "fused_optimizer"})
    # Where asynchronous evaluation scores: "thread" (light or GIL-releasing metrics) or "process"
    # (Python-heavy host scoring: COCO AP, BLEU, WER).
    host_scoring: ClassVar[str] = "thread"
    # Whether the rules time training only: MiniGo's time-to-train ends when the passing generation
    # was saved, its evaluations being replayed afterwards. The harness then stops the clock while an
    # evaluation runs (inference and scoring), so the log's times and time-to-train leave them out.
    untimed_evaluation: ClassVar[bool] = False
    # What ModelParts.loss_units counts, as `bench` names its rate ("target tokens": tokens/s).
    loss_units_name: ClassVar[str] = "loss units"
    # What one sample is called where it matters to a reader of `bench` ("utterances": utterances/s).
    sample_name: ClassVar[str] = "samples"
    # `--set` overrides that make the full recipe's training step cheap enough for a CPU while keeping
    # its structure (the same layers, losses and optimizer, so the same operators): a small batch,
    # smaller images or shorter sequences. `bench --count-ops` and the operator budgets use them.
    step_probe: ClassVar[tuple[str, ...]] = ("global_batch_size=2",)
    # `--set` overrides that give this workload model-parallel embedding tables (ModelParts.parallel):
    # `trainperf plan` applies them. Empty: it has none.
    model_parallel_sets: ClassVar[tuple[str, ...]] = ()
    # The golden record of the mini's first steps (bench/goldens.py): what the gate runs of this workload's
    # training path. None for a workload without a mini.
    golden: ClassVar[GoldenSpec | None] = GoldenSpec()
    # The host's budget for one full-scale step at the `step_probe` size (tests/bench/test_stepcount.py holds
    # every workload to its own).
    step_budget: ClassVar[StepBudget | None] = None
    # What the GPU round benchmarks of the full scale on one device (benchmarks/gpu_round.py). None: not run.
    device_probe: ClassVar[DeviceProbe | None] = None
    # A sample of the full dataset's files at the reference's paths: what a real dataset looks like where a
    # forgotten `--scale full` would point a mini (tests/test_data_safety.py builds it and checks the mini
    # refuses it and leaves it whole). Every mini that writes files declares one.
    real_layout: ClassVar[tuple[str, ...]] = ()

    @property
    def scales(self) -> tuple[str, ...]:
        """The scales this workload declares, mini first."""
        return tuple(name for name in SCALES if getattr(self, name, None) is not None)

    def scale(self, scale: str) -> Scale[R]:
        if scale not in SCALES:
            raise TrainperfError(f"--scale {scale!r}: expected one of: " + ", ".join(SCALES))
        declared = getattr(self, scale, None)
        if declared is None:
            others = ", ".join(f"--scale {name}" for name in self.scales)
            raise TrainperfError(f"--scale {scale}: {self.name} declares no {scale} scale (it has {others}; "
                                 f"see docs/workloads/{self.name}.md)")
        return declared

    def recipes(self, scale: str) -> dict[str, R]:
        """Named recipes for a scale; the first is the default."""
        return dict(self.scale(scale).recipes)

    def recipe(self, scale: str, name: str | None = None) -> R:
        options = self.recipes(scale)
        if name is None:
            return next(iter(options.values()))
        if name not in options:
            raise TrainperfError(
                f"--recipe {name!r}: unknown for {self.name} {scale}; choose one of: " + ", ".join(options)
            )
        return options[name]

    def default_data_dir(self, scale: str) -> Path | None:
        """Where a generated dataset goes; a real one has no default (the user says --data)."""
        from trainperf.paths import cache_root

        return cache_root() / f"{self.name}-{scale}" if self.scale(scale).data.generated else None

    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        """What is missing or malformed in `data_dir` for this scale (empty when ready)."""
        return self.scale(scale).data.problems(data_dir)

    def prepare(self, scale: str, data_dir: Path, say: Callable[[str], None]) -> None:
        """mini: generate the dataset in the real on-disk format; full: verify and raise on problems."""
        self.scale(scale).data.prepare(data_dir, say)

    def verify(self, scale: str, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]
               ) -> list[str]:
        """`prepare --verify` (see DataSource.verify)."""
        bad = self.scale(scale).data.verify(data_dir, workers, progress)
        if bad is None:
            raise TrainperfError(f"--verify: not available for {self.name} {scale}")
        return bad

    def skips_unreadable(self, scale: str) -> bool:
        """See DataSource.skips_unreadable."""
        return self.scale(scale).data.skips_unreadable

    def eval_set(self, scale: str, data_dir: Path) -> tuple[Path, int] | None:
        """See DataSource.eval_set."""
        return self.scale(scale).data.eval_set(data_dir)

    def sources(self, scale: str, data_dir: Path) -> dict[str, Path]:
        """See DataSource.sources."""
        return self.scale(scale).data.sources(data_dir)

    @abstractmethod
    def mlperf_hyperparameters(self, recipe: R, ctx: RuntimeContext) -> dict[str, Any]:
        """The hyperparameter keys the closed ruleset requires, with this recipe's values (a `Logged`
        value where the rules check the event's metadata too)."""

    def assets(self, recipe: R, data_dir: Path | None) -> dict[str, Path]:
        """Files `build` reads, by name. None by default."""
        return {}

    def check_assets(self, recipe: R, assets: Assets) -> None:
        """Check what `build` will read without reading it whole (a shipped file's SHA-256, a checkpoint's
        config and tensor headers): a damaged or mismatched one raises TrainperfError naming the file
        before any run folder is written, as a missing one does. Nothing beyond their existence by
        default."""

    def initialized_tensors(self, recipe: R, model: torch.nn.Module) -> list[str]:
        """Names of the tensors the model initialised, logged as `weights_initialization` events
        (rulesets that require them: RetinaNet's 2.0.0), in the reference's naming. None by default.
        `model` is the module `build` returned (unwrapped from DDP and compilation)."""
        return []

    def notes(self, recipe: R, scale: str) -> list[str]:
        """Lines a user should read before a run starts: why its result would not be comparable to
        MLPerf's (a missing pretrained backbone, say). Printed, never fatal."""
        return []

    def divergence_hint(self, recipe: R, scale: str) -> str | None:
        """The likely cause when this recipe's training loss stops being finite, for the abort reason
        (a full recipe started without its pretrained weights, say); None when there is none to give."""
        return None

    @abstractmethod
    def build(self, recipe: R, ctx: RuntimeContext, assets: Assets) -> ModelParts:
        """Model (on ctx.device), optimizer, loss, LR schedule, evaluation forward. Reads nothing but
        its `assets`."""

    @abstractmethod
    def load_data(self, recipe: R, data_dir: Path, ctx: RuntimeContext) -> DataParts:
        """Open the dataset (timed: called after run_start)."""

    @abstractmethod
    def synthetic_batch(self, recipe: R, ctx: RuntimeContext, model: torch.nn.Module) -> Any:
        """A device-resident random batch shaped like this process's training batches (for warm-up,
        compilation and throughput runs; never used for a quality result)."""

    def shape_buckets(self, recipe: R) -> dict[str, Any] | None:
        """How this run's training batches are padded to a few fixed shapes (`recipe.bucketed`: --static-shapes,
        or --cuda-graphs, which records one graph per shape) when their natural shapes vary with the data
        (lengths, image sizes): the buckets and how padding is kept out of the loss, recorded in result.json.
        None: the batches are not bucketed (their shape is the recipe's, or the data's)."""
        return None

    def synthetic_batches(self, recipe: R, ctx: RuntimeContext, model: torch.nn.Module) -> list[Any]:
        """One synthetic batch per shape bucket (see shape_buckets): what a compile check or a warm-up runs
        so that every graph a run will need is made. Default: the one synthetic batch."""
        return [self.synthetic_batch(recipe, ctx, model)]

    def synthetic_eval_batch(self, recipe: R, ctx: RuntimeContext, model: torch.nn.Module) -> Any:
        """A random batch shaped like the evaluation's batches (for warming up the eval forward)."""
        return self.synthetic_batch(recipe, ctx, model)

    def formula_flops(self, recipe: R) -> tuple[float, int, str] | None:
        """Training FLOPs of one sample as the field's published MFUs count them (for a transformer, 6 per
        parameter and token plus attention's), the sample's tokens, and how it is counted: `bench` reports
        its MFU beside torch's FLOP counter's, so figures compare with torchtitan's and Megatron's. None:
        the counter's only."""
        return None

    def make(self, command: str, out: Path, say: Callable[[str], None], options: dict[str, Any]) -> None:
        """Build one of the assets this workload's package declares in its `MAKES` literal (a mini's shipped
        checkpoint, say) into the folder `out`, which the command line made safe to write: `command` is the
        declared `make-*` name, `options` the declared options as the user set them (steps, seed,
        generations). Nothing to make by default."""
        raise TrainperfError(f"{self.name}: makes no asset {command!r}")

    def step_statistics(self, model: torch.nn.Module) -> dict[str, float]:
        """What the model's state says of its last training step, by name (an MoE model's tokens per expert,
        max over mean): `bench` reports them after its timed steps. Read on the host: never called in a
        step."""
        return {}

    def batch_samples(self, batch: Any) -> int:
        """Samples in one of this workload's batches (see `count_samples` for the default rules)."""
        return count_samples(batch)

    def split_batch(self, batch: Any, parts: int) -> list[Any]:
        """This workload's batch as `parts` micro-batches (see `split_batch` for the default rules)."""
        return split_batch(batch, parts)

    def reference_devices(self, recipe: R) -> int:
        """The devices a full recipe's reference run used, for the hyperparameters it logs per device
        (Mask R-CNN's proposals per image times images per device): the conformance test's closed log."""
        return 8

    def logged_during_run(self, recipe: R) -> dict[str, Any]:
        """Keys the closed rules require that this workload logs inside the timed region (through
        EpochView.log), with the values a run of `recipe` logs: MiniGo's self-play games per generation."""
        return {}

    def parallelism(self, recipe: R) -> Parallelism | None:
        """The parallelism record (spec.parallel) that `build` gives its parts for `recipe`, known without
        building: `run` and `bench` check it against the processes before any folder is written. None:
        data parallelism (DDP), which fits any number of processes."""
        return None

    def check_recipe(self, recipe: R) -> None:
        """A recipe's target fits the metric (one value, or one per named value); a workload adds its rules
        across fields and recipes here (a field's own interval is declared with it: spec.fields)."""
        self.metric.targets(recipe.target)
