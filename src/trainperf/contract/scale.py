"""A scale: its recipes and the data source that fills and checks its folder.

A workload declares one per scale, e.g. `mini = Scale(MINI, DigitsGenerator())` and
`full = Scale(FULL_RECIPES, ImageNetFolder())`; the Workload base class dispatches on the scale's name once.
The data *pipeline* (`Workload.load_data`) is not part of a scale: a mini dataset is written in the real
dataset's on-disk format so that both scales are read by the same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic

from trainperf.contract.recipe import R, Recipe


class DataSource(ABC):
    """Where one scale's dataset comes from, and what makes its folder ready to train on."""

    # A generated dataset (a mini) has a default folder in trainperf's cache; a real one is where the
    # user says (--data).
    generated: bool = False

    @abstractmethod
    def problems(self, data_dir: Path) -> list[str]:
        """What is missing or malformed in `data_dir` (empty when ready)."""

    @abstractmethod
    def prepare(self, data_dir: Path, say: Callable[[str], None]) -> None:
        """A generator writes the dataset in the real on-disk format; a real dataset is checked (raising
        on problems) and converted where the reference converts it."""

    def sources(self, data_dir: Path) -> dict[str, Path]:
        """The files or folders `prepare` derives cached outputs from (ratings.csv, the day files), by
        name. Each preparation records their fingerprints (trainperf.prepared): when one changes,
        `problems` names it and `prepare` redoes the work. None for data read as it is."""
        return {}

    # Whether the loaders skip what `verify` found unreadable (it keeps their list: ResNet's images). Where they
    # do not (the reference reads every row), a damaged sample stops a run and `prepare --verify` says so.
    skips_unreadable: bool = False

    def verify(self, data_dir: Path, workers: int, progress: Callable[[int, int, int], None]) -> list[str] | None:
        """Read every sample once, outside any timed region (`prepare --verify`); one line per unreadable
        sample (which the loaders then skip where `skips_unreadable`). progress(done, total, bad). None: not
        available here."""
        return None

    def eval_set(self, data_dir: Path) -> tuple[Path, int] | None:
        """Where the prepared evaluation set is and how many samples it holds, counted cheaply (no
        decoding), for the shared check that refuses an empty one (jobs.eval_set_problems). Called on
        data `problems` passed. None: not known without loading it (MiniGo's games)."""
        return None


@dataclass(frozen=True)
class Scale(Generic[R]):
    """A scale's named recipes (the first is its default) and its data source."""

    recipes: Mapping[str, R]
    data: DataSource

    def __init__(self, recipes: R | Iterable[R] | Mapping[str, R], data: DataSource) -> None:
        if isinstance(recipes, Mapping):
            named = dict(recipes)
        else:
            items = [recipes] if isinstance(recipes, Recipe) else list(recipes)
            named = {r.name: r for r in items}
            if len(named) != len(items):
                raise ValueError("Scale: two recipes share a name")  # a programming error in a declaration
        if not named:
            raise ValueError("Scale: at least one recipe")
        object.__setattr__(self, "recipes", named)
        object.__setattr__(self, "data", data)
