"""What the science commands measure on this machine: a short bench of one device, and the link
between devices (given, or probed between local processes)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from trainperf import jobs
from trainperf.bench import throughput
from trainperf.bench.memory import BatchTooLarge
from trainperf.contract import Recipe, Workload
from trainperf.errors import TrainperfError
from trainperf.science import predict
from trainperf.science.project import Inputs, Link, measure_link


def bench_at(workload: Workload, recipe: Recipe, scale: str, data: str | None, batch: int, steps: int, warmup: int,
             device: str | None, say: Callable[[str], None] = print, check_memory: bool = True
             ) -> tuple[throughput.BenchResult, str]:
    """A short bench at `batch` per device: real data where the dataset is there (its loading counted),
    else device-resident synthetic batches, and which of the two it was."""
    variant = recipe.with_overrides([f"global_batch_size={batch}"])
    folder = jobs.data_dir(workload, scale, data) if (data or scale == "mini") else None
    synthetic = folder is None or (scale == "full" and bool(workload.data_problems(scale, folder)))
    if not synthetic:
        folder = jobs.prepared_data(workload, scale, data)
    try:
        result = throughput.run_bench(workload, variant, scale, folder, synthetic, steps, warmup, device,
                                      check_memory=check_memory)
    except BatchTooLarge as exc:
        if not exc.fits:
            raise
        # The throughput per sample is what a prediction uses: a smaller batch that fits, said aloud.
        say(f"{exc}; benching at batch {exc.fits:,} instead")
        return bench_at(workload, recipe, scale, data, exc.fits, steps, warmup, device, say, check_memory=False)
    return result, ("synthetic batches: data loading not included" if synthetic else "real data, loading included")


def link(bandwidth: float | None, latency: float | None, devices: int, out_dir: Path, device: str | None,
         say: Callable[[str], None] = print) -> Link:
    if bandwidth is not None or latency is not None:
        # Written so that NaN fails too; an infinite bandwidth or latency is no link either.
        if bandwidth is None or latency is None or not (0 < bandwidth < math.inf and 0 <= latency < math.inf):
            raise TrainperfError("--bandwidth GB/s (> 0) and --latency µs (>= 0) go together")
        return Link(bandwidth, latency, f"given: {bandwidth:g} GB/s, {latency:g} µs")
    if devices < 2:
        return Link(1.0, 0.0, "one device: no communication")
    say(f"measuring all-reduce between {devices} local processes (give --bandwidth and --latency to skip)")
    return measure_link(devices, out_dir, device)


def projection_inputs(workload: Workload, recipe: Recipe, scale: str, data: str | None, per_device: int,
                      bench_batch: int | None, steps: int, warmup: int, device: str | None,
                      peak_tflops: float | None = None, mfu: float | None = None, epochs_given: float | None = None
                      ) -> tuple[Inputs, throughput.BenchResult]:
    """What a projection starts from. Compute per step: this machine's bench at the per-device batch,
    or (projecting another device) the model's counted FLOPs over `peak_tflops` x `mfu`. Epochs to
    converge at each global batch: the RCPs at full scale where the ruleset has them, else the same at
    every size (speedups then need no epoch count)."""
    if (peak_tflops is None) != (mfu is None):
        raise TrainperfError("--peak-tflops and --mfu go together (compute time from the model's FLOPs)")
    if mfu is not None and not 0 < mfu <= 1:
        raise TrainperfError(f"--mfu {mfu}: expected a fraction in (0, 1]")
    if peak_tflops is not None and not 0 < peak_tflops < math.inf:
        raise TrainperfError(f"--peak-tflops {peak_tflops}: expected a finite number > 0")
    by_flops = peak_tflops is not None and mfu is not None
    batch = bench_batch or (min(per_device, 4) if by_flops else per_device)
    bench, how = bench_at(workload, recipe, scale, data, batch, 1 if by_flops else steps, 0 if by_flops else warmup,
                          device)
    if by_flops:
        compute_s = bench.flops_per_sample * per_device / (peak_tflops * 1e12 * mfu)
        source = (f"{bench.flops_per_sample / 1e9:.3g} GFLOP per sample (counted) x {per_device} / "
                  f"({peak_tflops:g} TFLOP/s x MFU {mfu:g})")
    else:
        compute_s = per_device / bench.samples_per_s
        source = f"bench on {bench.device} at batch {batch}, {how}"
    epoch_samples = workload.mlperf.full_epoch_samples if scale == "full" else bench.epoch_samples
    unit = epoch_samples or 1_000_000  # without a dataset size, epochs of a million samples

    def epochs(global_batch: int) -> tuple[float, str]:
        if epochs_given is not None:
            return epochs_given, "given"
        if scale != "full":
            return 1.0, "the same at every size (mini: no RCP)"
        try:
            conv = predict.convergence(workload, recipe, global_batch)
        except TrainperfError:
            return 1.0, "the same at every size (no RCP in this ruleset)"
        style = "samples" if workload.mlperf.rcp_in_samples else recipe.log_epoch_num
        return predict.samples_at(conv.mean, style, epoch_samples) / unit, f"RCP {conv.ruleset}, {conv.how}"

    cadence = recipe.cadence
    per_epoch = unit / cadence.every_samples if cadence.by_samples else cadence.per_epoch / cadence.every
    forwards = workload.mlperf.full_eval_forwards if scale == "full" else None
    return Inputs(workload.name, per_device, compute_s, source, bench.gradient_bytes, epoch_samples, forwards,
                  per_epoch, epochs), bench


def predict_here(workload: Workload, recipe: Recipe, nproc: int, data: str | None, bench_batch: int | None,
                 steps: int, warmup: int, device: str | None, samples_per_s: float | None = None,
                 epochs: float | None = None, eval_s: float | None = None, bandwidth: float | None = None,
                 latency: float | None = None, overlap: float = 1.0, out_dir: Path = Path("runs")
                 ) -> predict.Prediction:
    """The full-scale prediction on `nproc` devices of this machine's kind: a bench of one device (or
    `samples_per_s`, a known per-device throughput), the all-reduce model for more than one."""
    from trainperf.science import project

    if nproc < 1 or recipe.global_batch_size % nproc:
        raise TrainperfError(f"--nproc {nproc}: expected a divisor of global_batch_size {recipe.global_batch_size}")
    per_device = recipe.global_batch_size // nproc
    if not 0 <= overlap <= 1:
        raise TrainperfError(f"--overlap {overlap}: expected a fraction from 0 to 1")
    if samples_per_s is not None:
        if not 0 < samples_per_s < math.inf:
            raise TrainperfError(f"--samples-per-s {samples_per_s}: expected > 0")
        if nproc > 1:
            raise TrainperfError("--nproc with --samples-per-s: the gradients' size comes from a bench; drop "
                                 "--samples-per-s")
        rate, spread, source, grad_bytes = samples_per_s, 0.0, "given per device", 0
    else:
        jobs.check_switches(workload, recipe, device)
        bench, how = bench_at(workload, recipe, "full", data, bench_batch or per_device, steps, warmup, device)
        rate, grad_bytes = bench.samples_per_s, bench.gradient_bytes
        spread = max(bench.step_time_p90_ms / bench.step_time_p50_ms - 1, 0.0)
        source = f"bench on {bench.device}, batch {bench.batch_size}, {how}"
    total_rate = rate * nproc
    if nproc > 1:
        ring = link(bandwidth, latency, nproc, out_dir, device)
        step, whole, exposed = project.step_s(per_device / rate, grad_bytes, nproc, ring, overlap)
        total_rate = recipe.global_batch_size / step
        source += (f"; {nproc} devices: all-reduce {whole * 1e3:.2f} ms per step, {exposed * 1e3:.2f} ms exposed "
                   f"({ring.source})")
    return predict.predict(workload, recipe, nproc, total_rate, source, spread, epochs=epochs, eval_s=eval_s)
