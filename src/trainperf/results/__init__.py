"""Run folders, result files and the official compliance check."""
