"""Studies built on complete runs: scaling (and, later, throughput and ablations)."""
