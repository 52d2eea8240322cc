"""On a real CUDA GPU only (skipped elsewhere; `benchmarks/gpu_round.py` runs them): what the strict
fakes of tests/fakegpu.py cannot show — the default device really trains, and the memory a bench
reports with CUDA Graphs includes the graphs' pool."""

from __future__ import annotations

import json

import pytest
import torch

from trainperf.cli import main

pytestmark = pytest.mark.gpu


def test_the_default_device_trains_on_the_gpu(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "resnet", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["environment"]["device"] == f"cuda:{torch.cuda.current_device()}"
    assert result["environment"]["platform"].startswith("1x")


def _bench(tmp_path, name: str, *switches: str) -> dict:
    # The mini ResNet at a large batch: its activations dominate its memory, and it compiles in seconds.
    path = tmp_path / f"{name}.json"
    assert main(["bench", "resnet", "--synthetic", "--batch-size", "2048", "--steps", "5", "--warmup", "3",
                 "--precision", "bf16", "--channels-last", *switches, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_memory_with_cuda_graphs_counts_the_graph_pool(tmp_path):
    # Before: 746 MiB "peak" with graphs against 11,125 MiB without, on one H100 (the pool left out).
    eager = _bench(tmp_path, "eager")
    graphs = _bench(tmp_path, "graphs", "--cuda-graphs")
    assert graphs["peak_memory_mb"] >= 0.5 * eager["peak_allocated_mb"], (graphs, eager)
    assert graphs["device_in_use_mb"] >= graphs["peak_memory_mb"]
