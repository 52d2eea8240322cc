"""Time-to-train science: reference convergence points, the batch-size tuner, the time-to-train
prediction and the scaling projection. Workload-agnostic: everything here reads what a workload
declares (recipes, dataset sizes, the RCP files of its ruleset), never a workload's name."""
