"""When the harness evaluates, and when it gives up: the cadence and budget, as data."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

from trainperf.contract import fields
from trainperf.contract.fields import Count, Counts
from trainperf.errors import TrainperfError


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

    every: Count = 1
    first: Count = 1
    epochs: Counts = ()
    per_epoch: Count = 1
    every_samples: int = 0
    first_samples: int = 0
    max_epochs: int = 0
    max_samples: int = 0
    # Counts in epochs of this many samples, rescaled to the dataset's own epoch by `resolve`
    # (3D U-Net: first evaluation at epoch ceil(1000 * 168 / S), S = samples per epoch).
    reference_epoch_samples: int = 0

    def __post_init__(self) -> None:
        fields.check(self, "eval cadence: ")
        if list(self.epochs) != sorted(set(self.epochs)):
            raise TrainperfError(f"eval cadence: eval_epochs must be increasing epoch numbers, got {list(self.epochs)}")
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

    def next_sample_eval(self, samples: int) -> int | None:
        """The first evaluation point of a sample cadence after `samples` (None: an epoch cadence)."""
        if not self.by_samples:
            return None
        first = self.first_samples or self.every_samples
        if samples < first:
            return first
        return first + ((samples - first) // self.every_samples + 1) * self.every_samples

    def due_after_step(self, step: int, steps_per_epoch: int | None, before: int, after: int) -> bool:
        """An evaluation after the `step`-th step of an epoch, which took the samples trained (counted as
        global_batch_size per step) from `before` to `after`: at one of the epoch's marks, where a sample
        cadence's point falls in (before, after], or where the sample budget is spent. The end of an
        epoch is `due_after_epoch`'s."""
        if step in self.marks(steps_per_epoch):
            return True
        point = self.next_sample_eval(before)
        if point is not None and point <= after:
            return True
        return bool(self.max_samples) and before < self.max_samples <= after

    def describe_budget(self) -> str:
        parts = []
        if self.max_epochs:
            parts.append(f"{self.max_epochs} epochs")
        if self.max_samples:
            parts.append(f"{self.max_samples} samples")
        return " or ".join(parts)
