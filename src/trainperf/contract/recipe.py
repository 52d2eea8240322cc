"""Recipes: the typed, overridable hyperparameters of a run, and what moves with the global batch."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from trainperf.contract import fields
from trainperf.contract.cadence import Cadence
from trainperf.contract.fields import Count, Counts
from trainperf.contract.quality import EPOCH_NUM_STYLES
from trainperf.errors import TrainperfError
from trainperf.errors import shown as shown_text

# What records the graphs of --cuda-graphs (Recipe.graphs_backend).
GRAPHS_BACKENDS = ("inductor", "cudagraphs")


@dataclass(frozen=True)
class Recipe:
    """Fields every recipe has. Workloads subclass it with their own typed fields.

    A recipe is data: variants (another optimizer, another batch size) are new recipes, and any field
    can be overridden from the command line with `--set key=value` (see `with_overrides`). A workload
    with a composite metric redeclares `target: tuple[float, ...]` (one per named value).
    """

    name: str
    global_batch_size: Count
    max_epochs: int  # budget in epochs (0: none; then max_samples must be set)
    target: float
    eval_every: Count
    eval_first: Count
    grad_accum_steps: Count = 1
    # Evaluations inside each epoch, evenly spaced by steps (DLRM: 20, i.e. every 0.05 epoch); the
    # last of them is the end-of-epoch evaluation that eval_every/eval_first schedule.
    evals_per_epoch: Count = 1
    # Evaluate after these epochs instead of every eval_every from eval_first (SSD v0.7: 40,50,55,…).
    eval_epochs: Counts = ()
    # Evaluate every N training samples instead (BERT); the log's epoch_num is then samples.
    eval_every_samples: int = 0
    eval_first_samples: int = 0  # the first such evaluation (0: at eval_every_samples)
    max_samples: int = 0  # budget in training samples (0: none)
    # The epoch counts above are in epochs of this many samples, rescaled to the dataset's epoch
    # (0: the dataset's own epochs). 3D U-Net's rules: 168.
    cadence_epoch_samples: int = 0
    log_epoch_num: str = "epochs"  # see EPOCH_NUM_STYLES
    # Gradient clipping by global norm (0: off), after unscaling under fp16 (GNMT 5, BERT/RNN-T 1).
    max_grad_norm: float = 0.0
    # Speedups the recipe turns on (applied by the runtime, never by the workload; see runtime/speedups).
    precision: str = "fp32"  # fp32 | bf16 | fp16 | fp8 (torch.autocast; fp16 with gradient scaling; fp8 via torchao)
    channels_last: bool = False
    compile: bool = False  # torch.compile of the model and eval forward, warmed up before run_start
    cuda_graphs: bool = False  # capture the model's forward and backward once, replay them (GPU only)
    # What records --cuda-graphs' graphs: "inductor" (torch.compile's mode="reduce-overhead": compiled kernels,
    # then recorded) or "cudagraphs" (dynamo's graphs recorded as they are: no kernel compilation, for the models
    # Inductor takes minutes to compile).
    graphs_backend: str = "inductor"  # one of GRAPHS_BACKENDS
    # Compile the model's repeated blocks (ModelParts.regions) one by one instead of the whole model: a block's
    # code is compiled once and reused by its repeats, so compiling takes a fraction of the time.
    regional_compile: bool = False
    fused_optimizer: bool = False  # torch's fused optimizer kernels where they exist (else foreach)
    async_eval: bool = False  # score evaluations in the background while training goes on
    packing: bool = False  # several short sequences in one row, attention kept within each (BERT)
    # Batches padded to the workload's few fixed shapes (Workload.shape_buckets), padding kept out of the loss:
    # compiled graphs and CUDA Graphs are then reused instead of made again for every new shape.
    static_shapes: bool = False
    # The compliance ruleset this recipe is written against (blank: the workload's): an RCP point that
    # only a later round's rules allow (Mask R-CNN's BS 8 at LR 0.02/2, a 2.0.0 rule) says so here; the
    # log records it (`trainperf_ruleset`) and check/score/compare then use it.
    ruleset: str = ""

    # What global_batch_size counts: "samples" (what train_samples counts too), or "tokens" (a
    # translation model's token budget per batch).
    BATCH_UNIT: ClassVar[str] = "samples"
    # Values a field may take, for fields restricted to a set (checked by `validate`).
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {}
    # What moves with the global batch (`for_batch`): the learning rates (a number or a tuple of them),
    # and the schedule points counted in optimizer steps (warmup, decay boundaries), which are rescaled
    # to cover the same number of samples. Schedules written in epochs need nothing.
    LR_FIELDS: ClassVar[tuple[str, ...]] = ()
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ()
    # The warmup's length (in steps if it is also a STEP_FIELD, else in epochs), which `for_batch`
    # scales by its own rule: the same samples (Goyal et al.: epochs fixed) or the same steps (its
    # epochs grow with the batch, as in the MLPerf ResNet and BERT recipes at large batches).
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ()
    LR_RULES: ClassVar[tuple[str, ...]] = ("linear", "sqrt", "none")
    WARMUP_RULES: ClassVar[tuple[str, ...]] = ("samples", "steps")

    @property
    def bucketed(self) -> bool:
        """Whether training batches are padded to the workload's shape buckets: asked for, or needed by
        CUDA Graphs (a recording replays one shape)."""
        return self.static_shapes or self.cuda_graphs

    @property
    def cadence(self) -> Cadence:
        return Cadence(every=self.eval_every, first=self.eval_first, epochs=self.eval_epochs,
                       per_epoch=self.evals_per_epoch, every_samples=self.eval_every_samples,
                       first_samples=self.eval_first_samples, max_epochs=self.max_epochs,
                       max_samples=self.max_samples, reference_epoch_samples=self.cadence_epoch_samples)

    def validate(self) -> None:
        """Raise TrainperfError naming the field when a value makes no sense: each numeric field against
        the interval declared with it (spec.fields), then the rules across fields. A subclass extends
        it with its own rules across fields only."""
        fields.check(self, "recipe field ")
        if self.max_epochs == 0 and self.max_samples == 0:
            raise TrainperfError("recipe fields max_epochs and max_samples: at least one budget must be > 0")
        if self.ruleset:
            from trainperf import rulesets

            if self.ruleset not in rulesets.known():
                raise TrainperfError(f"recipe field ruleset={self.ruleset[:40]!r}: expected blank or one of the "
                                     "official checker's rulesets: " + ", ".join(rulesets.known()))
        if self.precision not in ("fp32", "bf16", "fp16", "fp8"):
            raise TrainperfError(f"recipe field precision={self.precision!r} is not one of: fp32, bf16, fp16, fp8")
        if self.graphs_backend not in GRAPHS_BACKENDS:
            raise TrainperfError(f"recipe field graphs_backend={self.graphs_backend!r} is not one of: "
                                 + ", ".join(GRAPHS_BACKENDS))
        if self.log_epoch_num not in EPOCH_NUM_STYLES:
            raise TrainperfError(f"recipe field log_epoch_num={self.log_epoch_num!r} is not one of: "
                                 + ", ".join(EPOCH_NUM_STYLES))
        if (self.eval_every_samples > 0) != (self.log_epoch_num == "samples"):
            raise TrainperfError("recipe fields eval_every_samples and log_epoch_num: a sample cadence logs "
                                 "epoch_num as samples (log_epoch_num=samples), and only a sample cadence does")
        for key, allowed in self.CHOICES.items():
            if getattr(self, key) not in allowed:
                raise TrainperfError(
                    f"recipe field {key}={getattr(self, key)!r} is not one of: "
                    + ", ".join(str(a) for a in allowed)
                )
        self.cadence  # noqa: B018 - builds (and so checks) the cadence

    def intervals(self) -> dict[str, str]:
        """"name" or "config.name" -> the interval each numeric field must lie in, as written."""
        return fields.intervals(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def for_batch(self, batch: int, rule: str = "linear", warmup: str = "samples") -> tuple[Recipe, list[str]]:
        """This recipe at another global batch B (base B0): learning rates x B/B0 (`linear`) or
        x sqrt(B/B0) (`sqrt`); step-counted schedule points x B0/B, so decays stay where they were in
        samples; the warmup keeps its samples (`samples`) or its steps (`steps`: its epochs x B/B0).
        Returns the recipe and what changed."""
        if rule not in self.LR_RULES:
            raise TrainperfError(f"--lr-rule {rule!r}: expected one of {', '.join(self.LR_RULES)}")
        if warmup not in self.WARMUP_RULES:
            raise TrainperfError(f"--warmup-rule {warmup!r}: expected one of {', '.join(self.WARMUP_RULES)}")
        if batch < 1:
            raise TrainperfError(f"batch size {batch}: expected >= 1")
        ratio = batch / self.global_batch_size
        factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]

        def times(value: Any, k: float, whole: bool) -> Any:
            if isinstance(value, tuple):
                return tuple(times(v, k, whole) for v in value)
            if whole:
                return max(1, round(value * k)) if value else 0
            return type(value)(value * k) if isinstance(value, float) else max(1, round(value * k)) if value else 0

        changes: dict[str, Any] = {"global_batch_size": batch}
        for key in self.LR_FIELDS:
            changes[key] = times(getattr(self, key), factor, whole=False)
        for key in self.STEP_FIELDS:
            if key not in self.WARMUP_FIELDS or warmup == "samples":
                changes[key] = times(getattr(self, key), 1 / ratio, whole=True)
        for key in self.WARMUP_FIELDS:
            if key not in self.STEP_FIELDS and warmup == "steps":
                changes[key] = times(getattr(self, key), ratio, whole=False)
        recipe = dataclasses.replace(self, **changes)
        recipe.validate()
        said = [f"{k} {_short(getattr(self, k))} -> {_short(v)}" for k, v in changes.items() if getattr(self, k) != v]
        return recipe, said

    def with_overrides(self, assignments: Iterable[str]) -> Recipe:
        """Return a copy with `key=value` assignments applied, each parsed to the field's type. A field
        of a nested config (the model's) is `model.key=value`, or `key=value` where no other field has
        that name."""
        fields = _settable(type(self))
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for item in assignments:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or not key:
                raise TrainperfError(f"--set {item!r}: expected key=value")
            path = fields.get(key) or next((p for name, p in fields.items() if name.endswith("." + key)), None)
            if path is None:
                raise TrainperfError(
                    f"--set {item!r}: unknown recipe field {key!r}; valid fields: " + ", ".join(sorted(fields)))
            *outer, leaf, annotation = path
            value = _parse_value(raw.strip(), annotation, f"--set {shown_text(item, 60)}")
            if outer:
                nested.setdefault(outer[0], {})[leaf] = value
            else:
                top[leaf] = value
        for name, changes in nested.items():
            top[name] = dataclasses.replace(getattr(self, name), **changes)
        recipe = dataclasses.replace(self, **top)
        recipe.validate()
        return recipe


def _settable(cls: type) -> dict[str, tuple[Any, ...]]:
    """"name" or "config.name" -> (config?, name, type) for every field `--set` can change: the
    recipe's own and, one level down, those of a dataclass-typed field (the model's config)."""
    hints = typing.get_type_hints(cls)
    found: dict[str, tuple[Any, ...]] = {}
    for f in dataclasses.fields(cls):
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            inner = typing.get_type_hints(annotation)
            for g in dataclasses.fields(annotation):
                found[f"{f.name}.{g.name}"] = (f.name, g.name, inner[g.name])
        else:
            found[f.name] = (f.name, annotation)
    return found


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


INT64_MAX = 2**63 - 1


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
            value = int(raw)
        except ValueError:
            raise TrainperfError(f"{where}: expected an integer, got {shown_text(raw)!r}") from None
        if abs(value) > INT64_MAX:  # every count ends in a tensor or a C loop: 64 bits at most
            raise TrainperfError(f"{where}: out of range (at most {INT64_MAX:,})")
        return value
    if annotation is float:
        try:
            return float(raw)
        except ValueError:
            raise TrainperfError(f"{where}: expected a number, got {raw!r}") from None
    return raw


R = TypeVar("R", bound=Recipe)
