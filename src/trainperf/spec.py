"""The workload contract and the typed records the harness, runtime and results share.

A workload *declares* what it is (name, MLPerf key, ruleset, metric, recipes, evaluation cadence) and
*returns* the parts the harness needs (model, optimizer, loss, LR schedule, evaluation forward, data,
evaluation). It never starts a clock, writes a log or touches the process group: the harness owns
those, and hands the workload a `RuntimeContext` (device, rank, seed) instead of global state.

What the contract can express, and which MLPerf workload needs it:
- quality as one value or as named values with a target each (Mask R-CNN: BBOX and SEGM AP);
- evaluation outputs as tensor sums, tensor gathers, or Python objects gathered to rank 0
  (detections, decoded strings), scored on rank 0, the verdict shared with every rank;
- a cadence every k epochs from s, at listed epochs (SSD), k times per epoch (DLRM), every N samples
  (BERT), or in epochs of a reference size rescaled to the data (3D U-Net); a budget in epochs or
  samples;
- training data the model produces (MiniGo self-play), of unknown length, and rule-required events
  logged from inside the timed region;
- batches that are not dim-0 tensors (lists of images) and losses normalised by tokens;
- gradient clipping, an after-step hook, a separate evaluation model (EMA weights);
- an evaluation forward (decoding, sliding windows) compiled and warmed up before run_start.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch

from trainperf import devices
from trainperf.errors import TrainperfError

SCALES = ("mini", "full")

# A quality value: one number, or named numbers (Mask R-CNN logs {"BBOX": 0.38, "SEGM": 0.34}).
Quality = float | dict[str, float]
# A recipe's target: one number, or one per named value of a composite metric, in the metric's order.
Target = float | tuple[float, ...]

# How the log's epoch_num reads: epochs trained (most rules), 1 + epochs (DLRM: 1.05, 1.10, …), or
# training samples (BERT, which has no epochs).
EPOCH_NUM_STYLES = ("epochs", "1+epochs", "samples")


# ---------------------------------------------------------------------------------------------
# quality
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A quality metric: its name, which direction is better and, for a composite metric, the names
    of its values (`parts`), each with its own target; a composite target is met when all are."""

    name: str
    higher_is_better: bool = True
    parts: tuple[str, ...] = ()

    @property
    def composite(self) -> bool:
        return bool(self.parts)

    def targets(self, target: Target) -> dict[str, float]:
        """The target of each named value ({name: target} for a scalar metric)."""
        if not self.parts:
            if isinstance(target, tuple):
                if len(target) != 1:
                    raise TrainperfError(f"target {target}: {self.name} takes one value")
                target = target[0]
            return {self.name: float(target)}
        values = target if isinstance(target, tuple) else (target,)
        if len(values) != len(self.parts):
            raise TrainperfError(f"target {target}: {self.name} needs one value for each of "
                                 + ", ".join(self.parts))
        return {part: float(v) for part, v in zip(self.parts, values, strict=True)}

    def values(self, value: Quality) -> dict[str, float]:
        """The named values of a quality ({name: value} for a scalar metric)."""
        if not self.parts:
            if isinstance(value, dict):
                raise TrainperfError(f"{self.name}: expected one value, got {value}")
            return {self.name: float(value)}
        if not isinstance(value, dict) or set(value) != set(self.parts):
            raise TrainperfError(f"{self.name}: expected values for {', '.join(self.parts)}, got {value!r}")
        return {part: float(value[part]) for part in self.parts}

    def reached(self, value: Quality, target: Target) -> bool:
        goals = self.targets(target)
        got = self.values(value)
        if self.higher_is_better:
            return all(got[k] >= goals[k] for k in goals)
        return all(got[k] <= goals[k] for k in goals)

    def finite(self, value: Quality) -> bool:
        return all(math.isfinite(v) for v in self.values(value).values())

    def logged(self, value: Quality) -> float | dict[str, float]:
        """The eval_accuracy value of the MLPerf log: a number, or the dict of named values."""
        got = self.values(value)
        return got if self.parts else got[self.name]

    def describe(self, value: Quality | None, digits: int = 4) -> str:
        if value is None:
            return "-"
        got = self.values(value)
        if not self.parts:
            return f"{got[self.name]:.{digits}f}"
        return ", ".join(f"{k} {v:.{digits}f}" for k, v in got.items())

    def describe_target(self, target: Target) -> str:
        goals = self.targets(target)
        sign = ">=" if self.higher_is_better else "<="
        if not self.parts:
            return f"{sign} {goals[self.name]:g}"
        return " and ".join(f"{k} {sign} {v:g}" for k, v in goals.items())


# ---------------------------------------------------------------------------------------------
# cadence and budget
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cadence:
    """When the harness evaluates, and when it gives up. Recipe data (see `Recipe.cadence`), resolved
    against the dataset by `resolve` once the number of samples in an epoch is known.

    Epoch cadence: after epoch `first`, then every `every` epochs, or after each epoch listed in
    `epochs`; with `per_epoch` > 1, also at evenly spaced steps inside every epoch. Sample cadence
    (`every_samples` > 0): after the step at which the training samples reach `first_samples`, then
    every `every_samples`; samples are counted as global_batch_size per optimizer step, as MLPerf
    BERT counts them, so that every process takes the same decision without communicating.
    Budget: `max_epochs` and/or `max_samples` (0 = none); the point where it is spent is evaluated.
    """

    every: int = 1
    first: int = 1
    epochs: tuple[int, ...] = ()
    per_epoch: int = 1
    every_samples: int = 0
    first_samples: int = 0
    max_epochs: int = 0
    max_samples: int = 0
    # Counts in epochs of this many samples, rescaled to the dataset's own epoch by `resolve`
    # (3D U-Net: first evaluation at epoch ceil(1000 * 168 / S), S = samples per epoch).
    reference_epoch_samples: int = 0

    def __post_init__(self) -> None:
        if self.every < 1 or self.first < 1 or self.per_epoch < 1:
            raise TrainperfError(f"eval cadence: eval_every, eval_first and evals_per_epoch must be >= 1, got "
                                 f"{self.every}, {self.first} and {self.per_epoch}")
        if any(e < 1 for e in self.epochs) or list(self.epochs) != sorted(set(self.epochs)):
            raise TrainperfError(f"eval cadence: eval_epochs must be increasing epoch numbers >= 1, got "
                                 f"{list(self.epochs)}")
        if min(self.every_samples, self.first_samples, self.max_epochs, self.max_samples,
               self.reference_epoch_samples) < 0:
            raise TrainperfError("eval cadence: sample counts and budgets must be >= 0")
        if self.max_epochs == 0 and self.max_samples == 0:
            raise TrainperfError("budget: max_epochs or max_samples must be > 0")

    @property
    def by_samples(self) -> bool:
        return self.every_samples > 0

    def resolve(self, samples_per_epoch: int | None) -> Cadence:
        """The cadence in this dataset's epochs (only a reference epoch size changes anything)."""
        ref = self.reference_epoch_samples
        if not ref:
            return self
        if not samples_per_epoch:
            raise TrainperfError("eval cadence: cadence_epoch_samples needs a dataset of known size")

        def scaled(count: int) -> int:
            return max(1, math.ceil(count * ref / samples_per_epoch)) if count else 0

        return dataclasses.replace(self, every=scaled(self.every), first=scaled(self.first),
                                   epochs=tuple(sorted({scaled(e) for e in self.epochs})),
                                   max_epochs=scaled(self.max_epochs), reference_epoch_samples=0)

    def due_after_epoch(self, epoch: int) -> bool:
        """An evaluation at the end of `epoch` (epoch cadence only)."""
        if self.by_samples:
            return False
        if self.epochs:
            return epoch in self.epochs
        return epoch >= self.first and (epoch - self.first) % self.every == 0

    def next_eval_epoch(self, epoch: int) -> int | None:
        """The first epoch >= `epoch` after which an evaluation is due (None: none is left)."""
        if self.by_samples:
            return None
        if self.epochs:
            return next((e for e in self.epochs if e >= epoch), None)
        if epoch <= self.first:
            return self.first
        return epoch + (-(epoch - self.first)) % self.every

    def block_epochs(self, epoch: int) -> int:
        """Epochs in the training block that starts at `epoch`: up to the next evaluation or the budget."""
        stop = self.next_eval_epoch(epoch)
        if self.max_epochs:
            stop = self.max_epochs if stop is None else min(stop, self.max_epochs)
        return 1 if stop is None else max(1, stop - epoch + 1)

    def blocks(self, max_epochs: int | None = None) -> Iterator[tuple[int, int]]:
        """(first_epoch_num, epoch_count) of every block of an epoch cadence, up to the budget."""
        last = max_epochs or self.max_epochs
        start = 1
        while start <= last:
            count = min(self.block_epochs(start), last - start + 1)
            yield start, count
            start += count

    def marks(self, steps_per_epoch: int | None) -> set[int]:
        """Steps inside an epoch after which an evaluation is due (`per_epoch` > 1): evenly spaced,
        never at step 0 nor at the epoch's end (the epoch cadence covers it); short epochs get fewer."""
        n = self.per_epoch
        if n <= 1 or not steps_per_epoch:
            return set()
        return {s for k in range(1, n) if 0 < (s := round(k * steps_per_epoch / n)) < steps_per_epoch}

    def sample_evals(self) -> Iterator[int]:
        """The sample counts of a sample cadence's evaluations, in order."""
        if not self.by_samples:
            return
        point = self.first_samples or self.every_samples
        while True:
            yield point
            point += self.every_samples

    def describe_budget(self) -> str:
        parts = []
        if self.max_epochs:
            parts.append(f"{self.max_epochs} epochs")
        if self.max_samples:
            parts.append(f"{self.max_samples} samples")
        return " or ".join(parts)


# ---------------------------------------------------------------------------------------------
# recipes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """Fields every recipe has. Workloads subclass it with their own typed fields.

    A recipe is data: variants (another optimizer, another batch size) are new recipes, and any field
    can be overridden from the command line with `--set key=value` (see `with_overrides`). A workload
    with a composite metric redeclares `target: tuple[float, ...]` (one per named value).
    """

    name: str
    global_batch_size: int
    max_epochs: int  # budget in epochs (0: none; then max_samples must be set)
    target: float
    eval_every: int
    eval_first: int
    grad_accum_steps: int = 1
    # Evaluations inside each epoch, evenly spaced by steps (DLRM: 20, i.e. every 0.05 epoch); the
    # last of them is the end-of-epoch evaluation that eval_every/eval_first schedule.
    evals_per_epoch: int = 1
    # Evaluate after these epochs instead of every eval_every from eval_first (SSD v0.7: 40,50,55,…).
    eval_epochs: tuple[int, ...] = ()
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
    fused_optimizer: bool = False  # torch's fused optimizer kernels where they exist (else foreach)
    async_eval: bool = False  # score evaluations in the background while training goes on
    packing: bool = False  # several short sequences in one row, attention kept within each (BERT)
    # The compliance ruleset this recipe is written against (blank: the workload's): an RCP point that
    # only a later round's rules allow (Mask R-CNN's BS 8 at LR 0.02/2, a 2.0.0 rule) says so here; the
    # log records it (`trainperf_ruleset`) and check/score/compare then use it.
    ruleset: str = ""

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
    def cadence(self) -> Cadence:
        return Cadence(every=self.eval_every, first=self.eval_first, epochs=self.eval_epochs,
                       per_epoch=self.evals_per_epoch, every_samples=self.eval_every_samples,
                       first_samples=self.eval_first_samples, max_epochs=self.max_epochs,
                       max_samples=self.max_samples, reference_epoch_samples=self.cadence_epoch_samples)

    def validate(self) -> None:
        """Raise TrainperfError naming the field when a value makes no sense."""
        for key in ("global_batch_size", "eval_every", "eval_first", "grad_accum_steps", "evals_per_epoch"):
            if getattr(self, key) < 1:
                raise TrainperfError(f"recipe field {key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_epochs", "max_samples", "eval_every_samples", "eval_first_samples",
                    "cadence_epoch_samples"):
            if getattr(self, key) < 0:
                raise TrainperfError(f"recipe field {key} must be >= 0, got {getattr(self, key)}")
        if self.max_epochs == 0 and self.max_samples == 0:
            raise TrainperfError("recipe fields max_epochs and max_samples: at least one budget must be > 0")
        if self.max_grad_norm < 0:
            raise TrainperfError(f"recipe field max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}")
        if self.ruleset and not re.fullmatch(r"\d+\.\d+\.\d+", self.ruleset):
            raise TrainperfError(f"recipe field ruleset={self.ruleset!r}: expected a version such as 2.0.0, or blank")
        if self.precision not in ("fp32", "bf16", "fp16", "fp8"):
            raise TrainperfError(f"recipe field precision={self.precision!r} is not one of: fp32, bf16, fp16, fp8")
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


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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


R = TypeVar("R", bound=Recipe)


# ---------------------------------------------------------------------------------------------
# the runtime context a workload is given
# ---------------------------------------------------------------------------------------------
@dataclass
class RuntimeContext:
    """Device, process placement and seed of one training process (no module-level state).

    Randomness is explicit: `generator(stream)` gives a torch.Generator seeded from the run's seed
    and a stream name (the same on every process unless `per_rank`), so workloads never read the
    seed back from torch's global generator.
    """

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    seed: int = 0
    # Whether this process joined a process group (a launcher started it), even a group of one.
    grouped: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Collectives and DDP are in use: several processes, or a launched group of one."""
        return ((self.world_size > 1 or self.grouped) and torch.distributed.is_available()
                and torch.distributed.is_initialized())

    def synchronize(self) -> None:
        """Wait for queued device work, so that a clock read after it measures finished work."""
        devices.synchronize(self.device)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def stream_seed(self, stream: str, per_rank: bool = False) -> int:
        """A 63-bit seed for one named random stream of this run (stable across Python processes)."""
        key = f"{self.seed}/{stream}" + (f"/rank{self.rank}" if per_rank else "")
        return (self.seed * 0x9E3779B1 + zlib.crc32(key.encode())) % (2**63)

    def generator(self, stream: str, per_rank: bool = False, device: torch.device | str | None = None
                  ) -> torch.Generator:
        gen = torch.Generator(device=device if device is not None else self.device)
        gen.manual_seed(self.stream_seed(stream, per_rank))
        return gen

    def shard(self, n: int) -> range:
        """This rank's contiguous share of n items: every item exactly once across ranks, no padding."""
        return range(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            tensor = tensor.clone()
            torch.distributed.all_reduce(tensor)
        return tensor

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a tensor across ranks in rank order (shards may differ in length)."""
        if not self.distributed:
            return tensor
        size = torch.tensor([tensor.shape[0]], device=tensor.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        torch.distributed.all_gather(sizes, size)
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, padded)
        return torch.cat([part[: int(s.item())] for part, s in zip(parts, sizes, strict=True)])

    def gather_objects(self, items: list[Any]) -> list[Any] | None:
        """Python objects of every rank, concatenated in rank order on rank 0 (None elsewhere)."""
        if not self.distributed:
            return list(items)
        received: list[Any] | None = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(list(items), received, dst=0)
        if not self.is_main:
            return None
        return [item for part in received for item in part]

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value, on every rank."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def combine(self, partial: EvalPartial) -> dict[str, Any] | None:
        """Merge every rank's share of an evaluation: sums added and tensors concatenated (on every
        rank), objects concatenated on rank 0. Returns the merged dict on rank 0, None elsewhere."""
        out: dict[str, Any] = {key: self.all_reduce_sum(value) for key, value in partial.sums.items()}
        out.update({key: self.all_gather_cat(value) for key, value in partial.gathers.items()})
        for key in sorted(partial.objects):
            out[key] = self.gather_objects(partial.objects[key])
        return out if self.is_main else None

    @classmethod
    def create(cls, device: str | None = None, seed: int = 0) -> RuntimeContext:
        """A single-process context on `device` ('cpu', 'cuda', 'cuda:1'; a bare 'cuda' is the launcher's
        LOCAL_RANK or the current device), or the best available."""
        dev = devices.resolve(device)
        devices.activate(dev)
        return cls(device=dev, seed=seed)


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's wrapper (the DDP wrapper, with several processes)."""
    return getattr(model, "_orig_mod", model)


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module a workload built, under the runtime's wrappers (torch.compile's, then DDP's)."""
    model = uncompiled(model)
    return getattr(model, "module", model)


# ---------------------------------------------------------------------------------------------
# batches: how they split into micro-batches and how many samples they hold
# ---------------------------------------------------------------------------------------------
def per_epoch_schedule(workload: str, make: Callable[[int], Callable[[int], float]]
                       ) -> Callable[[int | None], Callable[[int], float]]:
    """A ModelParts.lr_schedule for a schedule stated in epochs: make(steps_per_epoch) -> f(step). Data
    of unknown length (steps_per_epoch None) cannot drive it: one line naming the workload."""

    def schedule(steps_per_epoch: int | None) -> Callable[[int], float]:
        if not steps_per_epoch:
            raise TrainperfError(f"{workload}: the LR schedule is in epochs and needs the steps per epoch")
        return make(steps_per_epoch)

    return schedule


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split a batch into `parts` micro-batches (fewer if it is smaller). Conventions: a tensor splits
    along dim 0; a tuple or dict is a set of columns, each split alike; a list is a list of samples
    (images of different sizes, say), split into consecutive runs."""
    if isinstance(batch, torch.Tensor):
        return list(torch.chunk(batch, parts))
    if isinstance(batch, list):
        size = -(-len(batch) // parts) if batch else 1
        return [batch[i:i + size] for i in range(0, len(batch), size)] or [batch]
    if isinstance(batch, tuple):
        columns = [split_batch(item, parts) for item in batch]
        count = min(len(col) for col in columns)
        return [type(batch)(col[i] for col in columns) for i in range(count)]
    if isinstance(batch, dict):
        columns = {key: split_batch(value, parts) for key, value in batch.items()}
        count = min(len(col) for col in columns.values())
        return [{key: col[i] for key, col in columns.items()} for i in range(count)]
    raise TrainperfError(f"cannot split a batch of type {type(batch).__name__} into micro-batches "
                         "(the workload must define split_batch)")


def count_samples(batch: Any) -> int:
    """Samples in a batch, by the same conventions: a tensor's first dimension, a list's length, the
    first column of a tuple or dict."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, list):
        return len(batch)
    if isinstance(batch, tuple) and batch:
        return count_samples(batch[0])
    if isinstance(batch, dict) and batch:
        return count_samples(next(iter(batch.values())))
    raise TrainperfError(f"cannot count the samples of a batch of type {type(batch).__name__} "
                         "(the workload must define batch_samples)")


# ---------------------------------------------------------------------------------------------
# what a workload builds
# ---------------------------------------------------------------------------------------------
class Assets(Mapping[str, Path]):
    """Files `build` reads, by name (prepared-dataset metadata, pretrained weights, a start checkpoint,
    a target model). The harness checks they exist before initialisation; reading one that is
    broken is a one-line error naming the file."""

    def __init__(self, paths: Mapping[str, Path] | None = None) -> None:
        self._paths = {name: Path(p) for name, p in (paths or {}).items()}

    def __getitem__(self, name: str) -> Path:
        if name not in self._paths:
            raise TrainperfError(f"asset {name!r} was not declared by the workload")
        return self._paths[name]

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def problems(self) -> list[str]:
        return [f"{path}: missing ({name})" for name, path in self._paths.items() if not path.is_file()]

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise TrainperfError(problems[0])

    def json(self, name: str) -> Any:
        import json

        path = self[name]
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TrainperfError(f"{path}: cannot read {name} ({exc})") from None

    def state_dict(self, name: str, like: Mapping[str, torch.Tensor] | None = None, what: str = "the model"
                   ) -> dict[str, Any]:
        """A PyTorch state dict, loaded with weights_only=True (no code from the file runs). With `like`
        (the state dict of the module it is for), every key of `like` must be there with its shape
        (`num_batches_tracked` may be absent): a mismatch is one line naming the tensor and `what`."""
        path = self[name]
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - pickle, zip and I/O errors all mean a bad file
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            raise TrainperfError(f"{path}: cannot load {name} ({type(exc).__name__}: {first})") from None
        if not isinstance(state, dict):
            raise TrainperfError(f"{path}: {name} is not a state dict (got {type(state).__name__})")
        if like is not None:
            expected = {k: v for k, v in like.items() if not k.endswith("num_batches_tracked")}
            missing = sorted(set(expected) - set(state))
            if missing:
                raise TrainperfError(f"{path}: not a state dict of {what} (missing {missing[0]}, "
                                     f"+{len(missing) - 1} more)")
            for key, value in expected.items():
                found = state[key]
                shape = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
                if shape != tuple(value.shape):
                    raise TrainperfError(f"{path}: {key} has shape {shape}, {what} needs {tuple(value.shape)}")
        return state


@dataclass(frozen=True)
class Logged:
    """A hyperparameter value logged with metadata (`mlperf_hyperparameters`): the Transformer's
    max_sequence_length carries {"method": "discard"}, which its closed rules check."""

    value: Any
    metadata: dict[str, Any]


@dataclass
class ModelParts:
    """What a workload builds during initialisation (before run_start): no data is touched here."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    # loss_fn(model, batch) -> scalar loss: the mean over the batch's samples, or, with loss_units,
    # the SUM over those units (the step divides by their count over all micro-batches and ranks).
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    # lr_schedule(steps_per_epoch or None) -> f(step) giving the LR multiplier of every param group.
    lr_schedule: Callable[[int | None], Callable[[int], float]]
    # eval_forward(model, batch) -> what the evaluation keeps of a batch (predictions, decoded ids):
    # run without gradients, under the recipe's precision, compiled with --compile and warmed up
    # before run_start. None: model(batch).
    eval_forward: Callable[[torch.nn.Module, Any], Any] | None = None
    # The module evaluations score (EMA weights, say) instead of `model`.
    eval_model: torch.nn.Module | None = None
    # after_step(step) runs after every optimizer step (step counts from 1): an EMA update, say.
    after_step: Callable[[int], None] | None = None
    # loss_units(batch) -> how many loss-normalising units (tokens, masked positions) a batch holds.
    loss_units: Callable[[Any], torch.Tensor | int] | None = None
    # epoch_hyperparameters(steps_per_epoch) -> hyperparameters whose values are counted in steps of
    # data not yet opened at initialisation (GNMT's remain and decay steps, fractions of all the
    # run's iterations in the reference); logged when the data is opened, after run_start.
    epoch_hyperparameters: Callable[[int | None], dict[str, Any]] | None = None
    # The model holds TorchRec embedding collections (built on the meta device, their optimizer applied
    # in the backward pass) for the runtime to shard across the processes (DistributedModelParallel,
    # runtime/recsys.py) instead of replicating the model with DDP; `optimizer` is then the dense one.
    model_parallel: bool = False
    # How the runtime distributed the model (the sharding plan), filled by it and kept with the result.
    layout: dict[str, Any] | None = None


@dataclass
class EvalPartial:
    """One process's share of an evaluation. The harness combines all processes (sums added, tensor
    gathers concatenated in rank order, object lists concatenated in rank order on rank 0) and
    `metric` turns the combined values into the quality, on rank 0 only; every rank then receives
    the verdict. With asynchronous evaluation `metric` runs in the background (a thread, or a worker
    process if the workload's `host_scoring` is "process": then it must be a module-level function)."""

    metric: Callable[[dict[str, Any]], Quality]
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    gathers: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class EpochView:
    """What the training data of one epoch may use: the epoch number, the model being trained (for
    data the model produces, e.g. self-play; the unwrapped module, in train mode) and `log`, which
    writes an MLPerf event inside the timed region (only rank 0 writes)."""

    epoch: int
    model: torch.nn.Module
    log: Callable[..., None]


@dataclass
class DataParts:
    """What a workload opens after run_start: the training batches and the evaluation."""

    # train_batches(view) -> this process's batches for epoch view.epoch, already on the device.
    train_batches: Callable[[EpochView], Iterable[Any]]
    steps_per_epoch: int | None  # None: unknown in advance (data produced during the epoch)
    train_samples: int | None  # per epoch; None: the samples trained are logged at the end
    eval_samples: int
    # evaluate(forward) -> this process's share of the evaluation set, scored (see EvalPartial).
    # forward(batch) runs the workload's eval_forward on the evaluation model.
    evaluate: Callable[[Callable[[Any], Any]], EvalPartial]
    # Running totals the data source keeps of the work behind its batches (MiniGo's self-play: games,
    # network evaluations), by name; `bench` reports each per second of its timed loop.
    counters: Callable[[], dict[str, float]] | None = None


class Workload(ABC, Generic[R]):
    """One MLPerf benchmark: identity, metric, recipes per scale, data and parts."""

    name: ClassVar[str]
    benchmark: ClassVar[str]  # the mllog `submission_benchmark` value
    ruleset: ClassVar[str]  # the compliance-checker ruleset that knows this benchmark
    metric: ClassVar[Metric]
    summary: ClassVar[str]
    mlperf_runs: ClassVar[int]  # number of runs MLPerf scores with the olympic mean
    # Median mini time-to-train in seconds over 10 calibration seeds on the project's 2-core CPU
    # (benchmarks/mini_ttt.py; the README's table states the same): `suite` estimates the time left from it.
    mini_median_s: ClassVar[float | None] = None
    # The full dataset's training samples per epoch (ImageNet's 1,281,167 images), and what one full
    # evaluation costs in forward passes of one training sample (NCF: 138,493 users x 1,000 candidates;
    # 3D U-Net: its sliding-window patches). `predict` and `scale --project` read them; None: unknown.
    full_epoch_samples: ClassVar[int | None] = None
    full_eval_forwards: ClassVar[int | None] = None
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

    def check_recipe(self, recipe: R) -> None:
        """A recipe's target fits the metric (one value, or one per named value)."""
        self.metric.targets(recipe.target)


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
