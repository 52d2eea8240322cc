"""The time-to-train harness: it alone owns the MLPerf clock and log."""

from trainperf.harness.run import RunConfig, run

__all__ = ["RunConfig", "run"]
