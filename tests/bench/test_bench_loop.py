"""`bench` must not tax the step: its timed loop waits for the device once, after the last step, however many
steps it times (a wait per step would stop the host queueing the next step while the device runs this one)."""

from __future__ import annotations

import pytest

from trainperf import devices, registry
from trainperf.bench import throughput


@pytest.mark.slow
def test_the_timed_loop_waits_for_the_device_once_whatever_its_length(monkeypatch):
    waits: list[str] = []
    real = devices.synchronize
    monkeypatch.setattr(devices, "synchronize", lambda device: (waits.append(str(device)), real(device))[1])
    workload = registry.get("ncf")
    recipe = workload.recipe("full").with_overrides(workload.step_probe)
    counts = []
    for steps in (2, 6):
        waits.clear()
        result = throughput.run_bench(workload, recipe, "full", None, True, steps, 1, "cpu", check_memory=False)
        counts.append(len(waits))
        assert result.steps == steps and result.step_time_p50_ms > 0
    assert counts[0] == counts[1], counts
