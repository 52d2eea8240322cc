"""Scaling projection: time-to-train on N data-parallel devices from one device's measurements.

Step time on N devices = compute time of the per-device batch + the part of the gradients' ring
all-reduce that backward does not hide:

    all-reduce(bytes, N) = 2 (N-1)/N x bytes / bandwidth + buckets x 2 (N-1) x latency
    exposed = max(all-reduce - overlap x backward, all-reduce of the last bucket)

with backward taken as 2/3 of the step's compute (its FLOPs are twice the forward's) and gradients
sent in DDP's 25 MiB buckets. The step count comes from the epochs to converge at the global batch
N x b (the RCP files, where the benchmark's ruleset has them; otherwise the same at every N, said so)
and the dataset's samples per epoch; evaluations (one forward per evaluation sample, a third of a
training sample's work, spread over the N devices) are added.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trainperf.errors import TrainperfError

BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
BACKWARD_SHARE = 2 / 3  # backward FLOPs are twice the forward's
EVAL_SHARE = 1 / 3  # an evaluation forward is a third of a training sample's work


@dataclass
class Link:
    """The all-reduce ring: bus bandwidth per device (GB/s) and per-hop latency (µs)."""

    bandwidth_gbs: float
    latency_us: float
    source: str


@dataclass
class Inputs:
    """One device's measurements and the workload's facts the projection needs."""

    workload: str
    per_device_batch: int
    compute_s: float  # one step of the per-device batch, no communication
    compute_source: str
    gradient_bytes: int
    epoch_samples: int | None
    eval_forwards: int | None
    evals_per_epoch: float  # evaluations per epoch (1 / eval_every, or evals_per_epoch)
    epochs: Callable[[int], tuple[float, str]]  # global batch -> (epochs to converge, where from)


@dataclass
class ProjectionRow:
    devices: int
    global_batch: int
    epochs: float
    epochs_source: str
    compute_ms: float
    allreduce_ms: float
    exposed_ms: float
    step_ms: float
    steps: int | None
    time_to_train_s: float | None
    speedup: float | None
    efficiency: float | None


def allreduce_s(nbytes: int, devices: int, link: Link, bucket_bytes: int = BUCKET_BYTES) -> float:
    """Ring all-reduce time of `nbytes` across `devices`, in buckets (each pays the ring's latency)."""
    if devices <= 1 or nbytes <= 0:
        return 0.0
    buckets = max(1, math.ceil(nbytes / bucket_bytes))
    hops = 2 * (devices - 1)
    return hops / devices * nbytes / (link.bandwidth_gbs * 1e9) + buckets * hops * link.latency_us * 1e-6


def step_s(compute_s: float, gradient_bytes: int, devices: int, link: Link, overlap: float
           ) -> tuple[float, float, float]:
    """(step time, whole all-reduce time, exposed all-reduce time) on `devices` devices."""
    total = allreduce_s(gradient_bytes, devices, link)
    last = allreduce_s(min(gradient_bytes, BUCKET_BYTES), devices, link)
    hidden = overlap * BACKWARD_SHARE * compute_s
    exposed = min(total, max(total - hidden, last)) if devices > 1 else 0.0
    return compute_s + exposed, total, exposed


def project(inputs: Inputs, devices: Sequence[int], link: Link, overlap: float = 1.0) -> list[ProjectionRow]:
    if not 0.0 <= overlap <= 1.0:
        raise TrainperfError(f"--overlap {overlap}: expected a fraction between 0 and 1")
    rows: list[ProjectionRow] = []
    base: tuple[int, float] | None = None
    for n in devices:
        gbs = inputs.per_device_batch * n
        epochs, source = inputs.epochs(gbs)
        step, total, exposed = step_s(inputs.compute_s, inputs.gradient_bytes, n, link, overlap)
        steps = ttt = None
        if inputs.epoch_samples:
            steps = math.ceil(epochs * inputs.epoch_samples / gbs)
            ttt = steps * step
            if inputs.eval_forwards:
                per_sample = inputs.compute_s / inputs.per_device_batch  # one training sample on one device
                evals = max(1, math.ceil(epochs * inputs.evals_per_epoch))
                ttt += evals * inputs.eval_forwards * per_sample * EVAL_SHARE / n
        else:  # no dataset size: time per epoch-equivalent of 1,000,000 samples, for the ratios
            ttt = epochs * (1_000_000 / gbs) * step
        if base is None:
            base = (n, ttt)
        speedup = base[1] / ttt if ttt else None
        rows.append(ProjectionRow(
            devices=n, global_batch=gbs, epochs=epochs, epochs_source=source, compute_ms=inputs.compute_s * 1e3,
            allreduce_ms=total * 1e3, exposed_ms=exposed * 1e3, step_ms=step * 1e3, steps=steps,
            time_to_train_s=ttt if inputs.epoch_samples else None, speedup=speedup,
            efficiency=speedup / (n / base[0]) if speedup else None))
    return rows


def table_text(rows: Sequence[ProjectionRow]) -> str:
    lines = [f"{'devices':>7} {'global batch':>12} {'epochs':>8} {'compute ms':>10} {'all-reduce ms':>13} "
             f"{'exposed ms':>10} {'step ms':>8} {'time-to-train':>14} {'speedup':>8} {'efficiency':>10}  epochs from"]
    for r in rows:
        ttt = "-" if r.time_to_train_s is None else duration(r.time_to_train_s)
        lines.append(f"{r.devices:>7} {r.global_batch:>12} {r.epochs:>8.2f} {r.compute_ms:>10.2f} "
                     f"{r.allreduce_ms:>13.2f} {r.exposed_ms:>10.2f} {r.step_ms:>8.2f} {ttt:>14} "
                     f"{_fmt(r.speedup, '.2f'):>8} "
                     f"{_fmt(r.efficiency, '.0%'):>10}  {r.epochs_source}")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def duration(seconds: float) -> str:
    """Seconds as a reader wants them: s, min, h or days."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.0f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def save(rows: Sequence[ProjectionRow], out_dir: Path, title: str, details: dict) -> list[Path]:
    """projection.json and projection.png (speedup against devices, with the ideal line)."""
    from trainperf import plots
    from trainperf.files import write_bytes_atomic, write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "projection.json", out_dir / "projection.png"]
    write_json_atomic(paths[0], {"title": title, **details, "rows": [asdict(r) for r in rows]})
    chart_rows = [{"devices": r.devices, "time_to_train_s": r.time_to_train_s, "speedup": r.speedup}
                  for r in rows]
    write_bytes_atomic(paths[1], plots.scaling_chart(chart_rows, title))
    return paths


# ---------------------------------------------------------------------------------------------
# the link, measured: a short all-reduce benchmark between local processes
# ---------------------------------------------------------------------------------------------
PROBE_SIZES = (4 * 2**10, 64 * 2**10, 1 * 2**20, 16 * 2**20)


def probe_in_group(out: Path, repeats: int = 10, device: str | None = None) -> None:
    """Run inside each process of a launched group: time all_reduce at several sizes; rank 0 fits
    latency and bandwidth to the ring model and writes them to `out` (JSON)."""
    import torch
    import torch.distributed as dist

    from trainperf.runtime import distributed

    ctx = distributed.init_from_env(device)
    try:
        n = ctx.world_size
        if n < 2:
            raise TrainperfError("the all-reduce probe needs at least 2 processes")
        timings: dict[int, float] = {}
        for size in PROBE_SIZES:
            tensor = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
            for _ in range(2):
                dist.all_reduce(tensor)
            ctx.synchronize()
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                dist.all_reduce(tensor)
                ctx.synchronize()
                samples.append(time.perf_counter() - t0)
            timings[size] = statistics.median(samples)
    finally:
        distributed.shutdown()
    if ctx.is_main:
        from trainperf.files import write_json_atomic

        write_json_atomic(out, {"devices": n, "backend": "nccl" if ctx.device.type == "cuda" else "gloo",
                                "timings_s": {str(k): v for k, v in timings.items()}, **asdict(fit(timings, n))})


def fit(timings: dict[int, float], devices: int) -> Link:
    """Least squares of t = a + bytes x c; latency = a / 2(N-1), bandwidth = 2(N-1)/N / c."""
    xs = list(timings)
    ys = [timings[x] for x in xs]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    intercept = max(mean_y - slope * mean_x, 0.0)
    hops = 2 * (devices - 1)
    if slope <= 0:
        raise TrainperfError("all-reduce probe: times did not grow with size; pass --bandwidth and --latency")
    return Link(bandwidth_gbs=hops / devices / slope / 1e9, latency_us=intercept / hops * 1e6,
                source=f"measured: all_reduce of 4 KiB-16 MiB between {devices} local processes")


def measure_link(devices: int, out_dir: Path, device: str | None = None) -> Link:
    """Launch `devices` local processes (torch's elastic launcher) running the probe."""
    from trainperf import devices as device_table
    from trainperf.runtime import distributed

    device_table.resolve(device)  # a bad --device is one line here, not a failure in every launched process
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "allreduce.json"
    argv = ["allreduce", "--nproc", str(devices), "--json", str(out)] + (["--device", device] if device else [])
    code = distributed.launch_local(devices, argv).code
    if code != 0 or not out.is_file():
        raise TrainperfError(f"all-reduce probe on {devices} processes failed (exit code {code})")
    data = json.loads(out.read_text(encoding="utf-8"))
    return Link(data["bandwidth_gbs"], data["latency_us"], data["source"])
