"""The Workload: what one MLPerf benchmark declares, and the parts and data it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic

import torch

from trainperf.errors import TrainperfError
from trainperf.spec.assets import Assets
from trainperf.spec.batches import count_samples, split_batch
from trainperf.spec.context import RuntimeContext
from trainperf.spec.parts import DataParts, ModelParts
from trainperf.spec.quality import Metric
from trainperf.spec.recipe import R


class Workload(ABC, Generic[R]):
    """One MLPerf benchmark: identity, metric, recipes per scale, data and parts."""

    name: ClassVar[str]
    benchmark: ClassVar[str]  # the mllog `submission_benchmark` value
    # The compliance-checker ruleset this workload is written against (its logs name it; `check`,
    # `score` and `predict` use it, and score published logs of its benchmark key by it).
    ruleset: ClassVar[str]
    metric: ClassVar[Metric]
    summary: ClassVar[str]
    mlperf_runs: ClassVar[int]  # number of runs MLPerf scores with the olympic mean
    olympic_drop: ClassVar[int] = 1  # the runs the olympic mean drops at each end (3D U-Net: 4 of 40)
    # Whether the RCP checker reads its convergence in training samples (the train_samples records):
    # BERT logs no epochs.
    rcp_in_samples: ClassVar[bool] = False
    # Rules for the official checker where no official ruleset knows the benchmark (NCF, retired after
    # v0.5): a YAML file of the checker's format, run with the ruleset's common rules.
    own_rules: ClassVar[Path | None] = None
    # The full dataset's training samples per epoch (ImageNet's 1,281,167 images), and what one full
    # evaluation costs in forward passes of one training sample (NCF: 138,493 users x 1,000 candidates;
    # 3D U-Net: its sliding-window patches). `predict` and `scale --project` read them; None: unknown.
    full_epoch_samples: ClassVar[int | None] = None
    full_eval_forwards: ClassVar[int | None] = None
    # The full evaluation set's size as the log's `eval_samples` gives it (3D U-Net: 42 cases; some
    # closed rules require the exact count). None: the evaluation is not a fixed set (MiniGo's games).
    full_eval_samples: ClassVar[int | None] = None
    # Full recipes that are not meant to pass the closed rules of the workload's ruleset (an older
    # round's settings: MiniGo's v0.6 9x9 plays 4,096 games a generation, 1.0.0 requires 8,192).
    open_recipes: ClassVar[frozenset[str]] = frozenset()
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
    # `--set` overrides that give this workload model-parallel embedding tables (ModelParts.model_parallel):
    # `trainperf plan` applies them. Empty: it has none.
    model_parallel_sets: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def recipes(self, scale: str) -> dict[str, R]:
        """Named recipes for a scale; the first is the default."""

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
        """Where the mini dataset is generated; full scale has no default (the user says --data)."""
        from trainperf.paths import cache_root

        return cache_root() / f"{self.name}-mini" if scale == "mini" else None

    @abstractmethod
    def data_problems(self, scale: str, data_dir: Path) -> list[str]:
        """What is missing or malformed in `data_dir` for this scale (empty when ready)."""

    @abstractmethod
    def prepare(self, scale: str, data_dir: Path, say: Callable[[str], None]) -> None:
        """mini: generate the dataset in the real on-disk format; full: verify and raise on problems."""

    def verify(self, scale: str, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]
               ) -> list[str]:
        """Read every sample of the dataset once, outside any timed region (`prepare --verify`); return
        one line per unreadable sample, which the loaders then skip. progress(done, total, bad)."""
        raise TrainperfError(f"--verify: not available for {self.name}")

    def eval_set(self, scale: str, data_dir: Path) -> tuple[Path, int] | None:
        """Where the prepared evaluation set is and how many samples it holds, counted cheaply (no
        decoding), for the shared check that refuses an empty one (jobs.eval_set_problems). Called on
        data `data_problems` passed. None: not known without loading it (MiniGo's games)."""
        return None

    def sources(self, scale: str, data_dir: Path) -> dict[str, Path]:
        """The files or folders `prepare` derives cached outputs from (ratings.csv, the day files), by
        name. Each preparation records their fingerprints (trainperf.prepared): when one changes,
        `data_problems` names it and `prepare` redoes the work. None for data read as it is."""
        return {}

    @abstractmethod
    def mlperf_hyperparameters(self, recipe: R, ctx: RuntimeContext) -> dict[str, Any]:
        """The hyperparameter keys the closed ruleset requires, with this recipe's values (a `Logged`
        value where the rules check the event's metadata too)."""

    def assets(self, recipe: R, data_dir: Path | None) -> dict[str, Path]:
        """Files `build` reads, by name. None by default."""
        return {}

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

    def synthetic_eval_batch(self, recipe: R, ctx: RuntimeContext, model: torch.nn.Module) -> Any:
        """A random batch shaped like the evaluation's batches (for warming up the eval forward)."""
        return self.synthetic_batch(recipe, ctx, model)

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

    def check_recipe(self, recipe: R) -> None:
        """A recipe's target fits the metric (one value, or one per named value)."""
        self.metric.targets(recipe.target)
