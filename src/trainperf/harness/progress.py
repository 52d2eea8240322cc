"""Live progress: a rich display on a terminal, plain lines otherwise (CI logs, pipes)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class PlainProgress:
    """One line per epoch and per evaluation."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._epoch_t0 = 0.0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, workload: str, max_epochs: int | None, steps_per_epoch: int | None) -> None:
        self.max_epochs = max_epochs or "?"
        steps = f"{steps_per_epoch} steps" if steps_per_epoch else "steps as the data comes"
        budget = f"up to {max_epochs} epochs" if max_epochs else "epochs"
        self._print(f"{workload}: {budget} of {steps}")

    def epoch_start(self, epoch: int) -> None:
        self._epoch_t0 = time.perf_counter()

    def wants_loss(self) -> bool:
        """Whether the next step update should carry a loss value (reading it syncs the device)."""
        return False

    def step(self, epoch: int, step: int, samples_per_s: float, loss: float | None) -> None:
        pass

    def epoch_end(self, epoch: int, samples_per_s: float, loss: float) -> None:
        seconds = time.perf_counter() - self._epoch_t0
        self._print(f"epoch {epoch}/{self.max_epochs}  {seconds:6.2f} s  {samples_per_s:9.1f} samples/s"
                    f"  loss {loss:.4f}")

    def evaluation(self, at: str, quality: str, target: str) -> None:
        """`at`: where it was taken ("epoch 3", "samples 150000"); `quality` and `target` as text."""
        self._print(f"eval  {at}  {quality}  (target {target})")

    def note(self, text: str) -> None:
        """A line a user should see before training starts (the sharding plan, say)."""
        self._print(text)

    def close(self) -> None:
        pass


class RichProgress(PlainProgress):
    """A live bar with epoch, samples/s, loss and the last evaluation."""

    # A loss read forces a device sync; refresh it at most this often.
    REFRESH_S = 0.5

    def __init__(self, console: Console | None = None) -> None:
        super().__init__()
        self.console = console or Console()
        self._bar = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>9.1f} samples/s  loss {task.fields[loss]}  last eval {task.fields[eval]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._task = None
        self._last_eval = "-"
        self._last_refresh = 0.0

    def _print(self, text: str) -> None:
        self._bar.console.print(text, highlight=False)

    def start(self, workload: str, max_epochs: int | None, steps_per_epoch: int | None) -> None:
        self.max_epochs = max_epochs or "?"
        self._bar.start()
        self._task = self._bar.add_task(workload, total=steps_per_epoch, epoch=f"1/{self.max_epochs}", rate=0.0,
                                        loss="-", eval=self._last_eval)

    def epoch_start(self, epoch: int) -> None:
        super().epoch_start(epoch)
        # reset() replaces the task's fields wholesale: pass all of them.
        self._bar.reset(self._task, epoch=f"{epoch}/{self.max_epochs}", rate=0.0, loss="-", eval=self._last_eval)

    def wants_loss(self) -> bool:
        return time.perf_counter() - self._last_refresh >= self.REFRESH_S

    def step(self, epoch: int, step: int, samples_per_s: float, loss: float | None) -> None:
        fields = {"rate": samples_per_s}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
            self._last_refresh = time.perf_counter()
        self._bar.update(self._task, completed=step, **fields)

    def evaluation(self, at: str, quality: str, target: str) -> None:
        self._last_eval = f"{quality} @ {at}"
        self._bar.update(self._task, eval=self._last_eval)
        super().evaluation(at, quality, target)

    def close(self) -> None:
        self._bar.stop()


class NoProgress(PlainProgress):
    """Silent, for ranks other than 0 and for library use."""

    def _print(self, text: str) -> None:
        pass


def make_progress(quiet: bool = False) -> PlainProgress:
    if quiet:
        return NoProgress()
    if sys.stdout.isatty():
        return RichProgress()
    return PlainProgress()
