"""trainperf: time-to-train benchmarks by MLPerf Training rules."""

__version__ = "0.1.0"
