"""Shape buckets: a few fixed lengths that a workload's variable-length batches are padded up to, so that a
compiled graph (and a CUDA Graph recording, which replays one shape) is made once per bucket instead of
once per new shape. What the padding costs is the price: the buckets are spaced geometrically so that no
sequence is padded by more than the spacing's ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainperf.errors import TrainperfError


@dataclass(frozen=True)
class LengthBuckets:
    """Sequence lengths, ascending; a sequence of length n is padded to the shortest bucket >= n."""

    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.lengths or any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)) \
                or self.lengths[0] < 1:
            raise ValueError(f"bucket lengths must be positive and ascending: {self.lengths}")

    @classmethod
    def from_recipe(cls, field: str, lengths: tuple[int, ...]) -> LengthBuckets:
        """A recipe field's buckets, or one line naming the field and what is wrong."""
        try:
            return cls(tuple(lengths))
        except ValueError as exc:
            raise TrainperfError(f"recipe field {field}: {exc}") from None

    @classmethod
    def geometric(cls, shortest: int, longest: int, per_doubling: int = 4, multiple: int = 8) -> LengthBuckets:
        """Lengths from `shortest` to `longest` spaced by 2**(1/per_doubling) (4: at most 19 % padding), each
        rounded up to a `multiple` (tensor cores' tile), the last exactly `longest`."""
        found: list[int] = []
        n = max(1, math.ceil(per_doubling * math.log2(longest / shortest))) if longest > shortest else 0
        for i in range(n + 1):
            length = min(longest, math.ceil(shortest * 2 ** (i / per_doubling) / multiple) * multiple)
            if not found or length > found[-1]:
                found.append(length)
        if found[-1] != longest:
            found.append(longest)
        return cls(tuple(found))

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    def length(self, n: int) -> int:
        """The bucket a sequence of `n` tokens is padded to."""
        if n > self.longest:
            raise ValueError(f"a sequence of {n} tokens is longer than the longest bucket ({self.longest})")
        return self.lengths[int(np.searchsorted(self.lengths, n))]

    def of(self, lengths: np.ndarray) -> np.ndarray:
        """Each length's bucket, vectorised."""
        lengths = np.asarray(lengths)
        if lengths.size and lengths.max() > self.longest:
            raise ValueError(f"a sequence of {int(lengths.max())} tokens is longer than the longest bucket "
                             f"({self.longest})")
        return np.asarray(self.lengths)[np.searchsorted(self.lengths, lengths)]

    def rows(self, length: int, tokens: int, multiple: int = 1) -> int:
        """Rows of a `tokens`-budget batch of bucket `length`, a multiple of `multiple` (the processes)."""
        return max(multiple, tokens // length // multiple * multiple)

    def describe(self, **how: Any) -> dict[str, Any]:
        """The scheme as result.json records it: how many shapes, the lengths, what else the workload says."""
        return {"shapes": len(self.lengths), "lengths": list(self.lengths), **how}
