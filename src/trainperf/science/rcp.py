"""Epochs to converge at a global batch size, from the official reference convergence points (the RCP
files `mlperf_logging` ships): the olympic mean of the reference runs at that batch, or the
interpolation between the neighbouring pruned points, as the official rcp_checker computes them."""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass

from trainperf.errors import TrainperfError


@dataclass
class Convergence:
    """Epochs (or samples, or the log's `1+epochs` epoch numbers) to converge at one batch size."""

    benchmark: str
    ruleset: str
    batch: int
    mean: float  # olympic mean of the reference runs' convergence points
    stdev: float
    how: str  # "reference point" | "interpolated" | "below the smallest reference batch" | "extrapolated"
    points: list[tuple[int, float]]  # the (batch, mean) points it was read from

    @property
    def relative_stdev(self) -> float:
        return self.stdev / self.mean if self.mean else 0.0


def reference_points(benchmark: str, ruleset: str, runs: int = 5) -> tuple[list[dict], list[dict]]:
    """The RCP records of `benchmark` under `ruleset` with the checker's statistics, by batch size: all
    of them, and the pruned set the checker interpolates between (a point that converges slower than
    its neighbours' interpolation is dropped). `runs`: the benchmark's submission run count, for a
    benchmark the installed checker no longer lists (DLRM after its retirement)."""
    from mlperf_logging.rcp_checker import rcp_checker

    counts = rcp_checker.submission_runs["training"]
    added = benchmark not in counts
    try:
        if added:
            counts[benchmark] = runs
        with contextlib.redirect_stdout(io.StringIO()):
            logging.disable(logging.WARNING)
            checker = rcp_checker.RCP_Checker("training", ruleset, benchmark, verbose=False)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - no RCP file, or a ruleset the checker refuses
        raise TrainperfError(f"no reference convergence points for {benchmark} in training ruleset {ruleset} "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'missing'})"
                             ) from None
    finally:
        logging.disable(logging.NOTSET)
        if added:
            counts.pop(benchmark, None)
    by_batch = sorted(checker.rcp_data.values(), key=lambda r: r["BS"])
    return by_batch, sorted(checker.pruned_rcp_data.values(), key=lambda r: r["BS"])


def epochs_to_converge(benchmark: str, ruleset: str, batch: int, runs: int = 5) -> Convergence:
    """The reference runs' mean at `batch` where there are some; else the checker's interpolation."""
    every, records = reference_points(benchmark, ruleset, runs)
    points = [(int(r["BS"]), float(r["RCP Mean"])) for r in records]
    stdevs = {int(r["BS"]): float(r["RCP Stdev"]) for r in records}
    exact = next((r for r in every if int(r["BS"]) == batch), None)
    if exact is not None:
        return Convergence(benchmark, ruleset, batch, float(exact["RCP Mean"]), float(exact["RCP Stdev"]),
                           "reference point", points)
    below = [p for p in points if p[0] < batch]
    above = [p for p in points if p[0] > batch]
    if below and above:
        (b0, m0), (b1, m1) = below[-1], above[0]
        w = (batch - b0) / (b1 - b0)
        return Convergence(benchmark, ruleset, batch, m0 + w * (m1 - m0),
                           stdevs[b0] + w * (stdevs[b1] - stdevs[b0]), "interpolated", points)
    if above:
        # The checker's rule below the smallest reference batch: converging as fast as it is allowed.
        b0, m0 = above[0]
        return Convergence(benchmark, ruleset, batch, m0, stdevs[b0], "below the smallest reference batch", points)
    if len(below) >= 2:
        (b0, m0), (b1, m1) = below[-2], below[-1]
        mean = m1 + (batch - b1) * (m1 - m0) / (b1 - b0)
        return Convergence(benchmark, ruleset, batch, max(mean, m1), stdevs[b1], "extrapolated", points)
    b1, m1 = below[-1]
    return Convergence(benchmark, ruleset, batch, m1, stdevs[b1], "extrapolated", points)
