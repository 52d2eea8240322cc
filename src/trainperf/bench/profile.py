"""The operators a training step spends its time in, from torch.profiler: the top ones by device time
(what the GPU runs) and by host time (what the CPU spends dispatching, launching or computing), per
step. `bench --profile N` profiles N steps after its timed ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainperf.bench.stepcount import quiet_native_stderr


def top_operators(run_step: Callable[[], Any], steps: int, device: torch.device, limit: int = 12) -> dict[str, Any]:
    """Profile `steps` calls of `run_step` (each ending with the device synchronised) and return the
    operators per step: {"steps", "host_ms", "device_ms", "by_device": [...], "by_host": [...]}, each
    row {"name", "calls", "host_ms", "device_ms"} with self times (children not included)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities)
    with quiet_native_stderr():
        prof.start()
    try:
        for _ in range(steps):
            run_step()
    finally:
        with quiet_native_stderr():
            prof.stop()
    rows = [{"name": e.key, "calls": e.count / steps, "host_ms": e.self_cpu_time_total / 1e3 / steps,
             "device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3 / steps} for e in prof.key_averages()]
    return {
        "steps": steps,
        "host_ms": sum(r["host_ms"] for r in rows),
        "device_ms": sum(r["device_ms"] for r in rows),
        "by_device": sorted((r for r in rows if r["device_ms"] > 0), key=lambda r: -r["device_ms"])[:limit],
        "by_host": sorted(rows, key=lambda r: -r["host_ms"])[:limit],
    }


def table_text(profile: dict[str, Any], key: str, rows: int = 8) -> str:
    """One of the profile's tables ("by_device" or "by_host") as aligned text."""
    title = "device" if key == "by_device" else "host"
    lines = [f"  top operators by {title} time per step ({profile['host_ms']:.1f} ms host, "
             f"{profile['device_ms']:.1f} ms device in all):"]
    for r in profile[key][:rows]:
        lines.append(f"    {r['name'][:60]:<60} {r['calls']:>8.1f} calls {r['host_ms']:>9.2f} ms host "
                     f"{r['device_ms']:>9.2f} ms device")
    return "\n".join(lines)
