"""Throughput mode: warm-up steps excluded, then N timed training steps; samples/s, step-time
percentiles, peak memory, data-loading share, model FLOPs per sample and MFU.

FLOPs are counted by `torch.utils.flop_counter` on one real training step (forward and backward),
never typed in. MFU = achieved model FLOP/s / the device's peak at the run's precision: a table of
published dense peaks for GPUs; for CPUs an estimate from cores x clock x SIMD width (stated as such).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainperf import devices
from trainperf.bench import memory as memory_estimate
from trainperf.contract import Assets, EpochView, ModelParts, Recipe, Workload, bare_model
from trainperf.runtime import distributed, environment, parallel, speedups
from trainperf.runtime.step import TrainStep

# Dense peak TFLOP/s (no sparsity) by GPU name fragment and precision; fp32 without TF32, tf32 on tensor cores.
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 67.0},
    "H100 SXM": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 67.0},
    "H100 NVL": {"fp8": 1671.0, "bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "H100": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"fp8": 733.0, "bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"fp8": 242.0, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "V100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
    "T4": {"bf16": 0.0, "fp16": 65.0, "fp32": 8.1},
}


@dataclass
class BenchResult:
    workload: str
    scale: str
    synthetic: bool
    batch_size: int
    steps: int
    warmup: int
    samples_per_s: float
    # The loss's units per second where the loss is a sum over units (the Transformer's target tokens).
    units_per_s: float | None
    units: str | None
    step_time_p50_ms: float
    step_time_p90_ms: float
    data_share: float  # fraction of the timed wall clock spent waiting for the next batch
    # What the timed steps held: on a GPU the caching allocator's reserved peak (what a batch must fit
    # in: CUDA Graph pools included), on a CPU the process's peak RSS.
    peak_memory_mb: float
    peak_memory_kind: str
    flops_per_sample: float
    achieved_tflops: float
    peak_tflops: float | None
    peak_source: str
    mfu: float | None
    speedups: dict[str, Any]
    device: str
    sample_name: str = "samples"  # what one sample is called in the workload's field (utterances)
    # The data source's own counters per second over the timed steps (DataParts.counters).
    counter_rates: dict[str, float] = dataclasses.field(default_factory=dict)
    # What data-parallel training all-reduces each step: the trainable parameters' gradients.
    parameters: int = 0
    gradient_bytes: int = 0
    epoch_samples: int | None = None  # the dataset's training samples per epoch, when it was opened
    # GPU only: the peak held by live tensors (graph pools not counted), and the whole device in use
    # after the steps as the driver reports it (the CUDA context and other processes included).
    peak_allocated_mb: float | None = None
    device_in_use_mb: float | None = None
    device_total_mb: float | None = None
    # With --profile: the top operators per step by device and host time (bench/profile.py).
    profile: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None  # how the model was distributed (the sharding plan)
    # Workload.formula_flops: FLOPs per sample as published MFUs count them, tokens per sample, how; its MFU.
    formula_flops_per_sample: float | None = None
    tokens_per_s: float | None = None  # per device
    formula_how: str | None = None
    formula_mfu: float | None = None
    # Workload.step_statistics after the timed steps (an MoE model's expert load).
    step_statistics: dict[str, float] = dataclasses.field(default_factory=dict)
    # The warm-up steps' wall clock: with --compile or --cuda-graphs, mostly compiling and recording.
    warmup_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_peak_tflops(precision: str) -> tuple[float | None, str]:
    """cores x clock x FLOP/cycle of the widest SIMD FMA units (2 per core assumed): an estimate."""
    info = environment.cpuinfo()
    if not info:
        return None, "unknown CPU"
    flags = info.get("flags", set())
    mhz = float(info["cpu MHz"]) if info.get("cpu MHz") else None
    if not mhz:
        return None, "CPU clock unknown"
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    per_cycle = 2 * 2 * lanes  # 2 FMA units x (multiply + add) x fp32 lanes
    if precision == "bf16" and ("avx512_bf16" in flags or "amx_bf16" in flags):
        per_cycle *= 2  # bf16 dot-product instructions process pairs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    peak = cores * mhz * 1e6 * per_cycle / 1e12
    return peak, (f"estimate: {cores} cores x {mhz:.0f} MHz x {per_cycle} FLOP/cycle "
                  f"({'AVX-512' if lanes == 16 else 'AVX2' if lanes == 8 else 'SSE'})")


def device_peak_tflops(device: torch.device, precision: str) -> tuple[float | None, str]:
    if device.type != "cuda":
        return cpu_peak_tflops(precision)
    name = devices.name(device)
    for fragment, peaks in GPU_PEAKS.items():
        if fragment in name:
            # An fp32 step whose convolutions or products may run in TF32 (cuDNN's default for convolutions)
            # is held to the TF32 peak: against the fp32 one its MFU passed 100 %.
            if precision == "fp32" and peaks.get("tf32") and devices.tf32_allowed():
                return peaks["tf32"], f"{name}: published dense TF32 peak (fp32 steps may run in TF32)"
            peak = peaks.get(precision) or None
            return peak, f"{name}: published dense {precision} peak"
    return None, f"{name}: peak unknown (not in trainperf's table)"


def count_flops(step: TrainStep, batch: Any) -> float:
    """FLOPs of one training step (forward + backward), as torch's FLOP counter sees them."""
    with FlopCounterMode(display=False) as counter:
        step(batch)
    return float(counter.get_total_flops())


RESERVED_KIND = "CUDA max_memory_reserved: tensors, allocator cache and CUDA Graph pools"


def peak_memory(device: torch.device) -> dict[str, Any]:
    """The BenchResult memory fields after the timed steps (see BenchResult)."""
    if device.type == "cuda":
        peaks = devices.memory_peaks(device)
        return {"peak_memory_mb": peaks.reserved_mib, "peak_memory_kind": RESERVED_KIND,
                "peak_allocated_mb": peaks.allocated_mib, "device_in_use_mb": peaks.in_use_mib,
                "device_total_mb": peaks.total_mib}
    return {"peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_memory_kind": "process peak RSS"}


def run_bench(workload: Workload, recipe: Recipe, scale: str, data_dir: Path | None, synthetic: bool,
              steps: int, warmup: int, device: str | None = None, profile_steps: int = 0,
              check_memory: bool = True) -> BenchResult:
    ctx = dataclasses.replace(distributed.init_from_env(device), seed=0)
    dev = ctx.device
    torch.manual_seed(0)
    assets = Assets(workload.assets(recipe, data_dir))
    parts = speedups.assemble(workload, recipe, ctx, assets)
    ctx = parallel.data_context(parts, ctx)  # tensor parallelism's processes share their rows

    def make_step(model_parts: ModelParts, spe: int) -> TrainStep:
        return TrainStep(model_parts, spe, recipe, dev, ctx=ctx, split=workload.split_batch,
                         count=workload.batch_samples)

    if check_memory:  # before the batch is made: one line, not the OOM killer
        memory_estimate.check_fits(workload, recipe, ctx, parts)
    step = make_step(parts, max(steps, 1))
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    batch_size = workload.batch_samples(batch)
    # FLOPs from the step of the eager module under the runtime's wrappers (the counter does not see
    # inside compiled graphs, and DDP's hooks are no model FLOPs); the optimizer steps once more.
    eager = dataclasses.replace(parts, model=bare_model(parts.model))
    flops = count_flops(make_step(eager, 1), batch) / batch_size

    data = None
    if synthetic:
        def batches() -> Any:
            while True:
                yield batch
    else:
        data = workload.load_data(recipe, data_dir, ctx)

        def batches() -> Any:
            epoch = 1
            while True:
                yield from data.train_batches(EpochView(epoch=epoch, model=bare_model(parts.model),
                                                        log=lambda *args, **kwargs: None))
                epoch += 1
    feed = batches()
    parts.model.train()
    warming = time.perf_counter()
    for _ in range(warmup):
        step(next(feed))
    ctx.synchronize()
    warmup_s = time.perf_counter() - warming
    devices.reset_peaks(dev)
    waits, samples = 0.0, 0
    counted = data.counters if data is not None and data.counters is not None else (lambda: {})
    before = counted()
    # The loop must not tax the step: no wait for the device between steps (the host queues the next step
    # while the device runs this one, as in training), step times from device events read at the end, and
    # loss units summed on the device (reading a count back each step would be a synchronisation).
    timer = StepTimer(dev)
    unit_sum: Any = 0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        current = next(feed)
        waits += time.perf_counter() - t0
        timer.start()
        step(current)
        timer.stop()
        samples += workload.batch_samples(current)
        if parts.loss_units is not None:
            unit_sum = unit_sum + parts.loss_units(current)
    ctx.synchronize()
    total = time.perf_counter() - start
    times = timer.seconds()
    units = int(unit_sum)
    after = counted()
    profiled = None
    if profile_steps:
        from trainperf.bench.profile import top_operators

        profiled = top_operators(lambda: (step(next(feed)), ctx.synchronize()), profile_steps, dev)
    statistics_after = workload.step_statistics(bare_model(parts.model))
    distributed.shutdown()
    trainable = [p for p in bare_model(parts.model).parameters() if p.requires_grad]
    rate = samples / total
    achieved = flops * rate / 1e12
    peak, source = device_peak_tflops(dev, recipe.precision)
    peaks = peak_memory(dev)
    ordered = sorted(times)
    formula = workload.formula_flops(recipe)
    # `rate` is this process's rows per second; a tensor-parallel group's processes share their rows.
    per_device = rate / max(1, ctx.world_size // max(1, ctx.data_world))
    formula_fields = {} if formula is None else {
        "formula_flops_per_sample": formula[0], "tokens_per_s": per_device * formula[1], "formula_how": formula[2],
        "formula_mfu": formula[0] * per_device / 1e12 / peak if peak else None}
    return BenchResult(
        workload=workload.name, scale=scale, synthetic=synthetic, batch_size=batch_size, steps=steps,
        warmup=warmup, samples_per_s=rate,
        units_per_s=units / total if parts.loss_units is not None else None,
        units=workload.loss_units_name if parts.loss_units is not None else None,
        step_time_p50_ms=statistics.median(ordered) * 1e3,
        step_time_p90_ms=ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3,
        data_share=waits / total, **peaks, flops_per_sample=flops,
        achieved_tflops=achieved, peak_tflops=peak, peak_source=source,
        mfu=achieved / peak if peak else None, speedups=speedups.enabled(recipe), device=str(dev),
        sample_name=workload.sample_name,
        counter_rates={k: (after[k] - before.get(k, 0.0)) / total for k in after},
        parameters=sum(p.numel() for p in trainable),
        gradient_bytes=sum(p.numel() * p.element_size() for p in trainable),
        epoch_samples=data.train_samples if data is not None else None, profile=profiled, layout=parts.layout,
        step_statistics=statistics_after, warmup_s=warmup_s, **formula_fields,
    )


class StepTimer:
    """Each step's time without waiting for the device between steps: CUDA events recorded around the
    step and read after the last one (on a CPU, where work finishes in the call, the host's clock)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pairs: list[tuple[Any, Any]] = []
        self.host: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            begin = devices.timing_event(self.device)
            begin.record()
            self.pairs.append((begin, None))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = devices.timing_event(self.device)
            end.record()
            self.pairs[-1] = (self.pairs[-1][0], end)
        else:
            self.host.append(time.perf_counter() - self._t0)

    def seconds(self) -> list[float]:
        """The steps' times, in seconds (call after the device has finished)."""
        if self.cuda:
            return [begin.elapsed_time(end) / 1e3 for begin, end in self.pairs]
        return list(self.host)


def _flops(value: float) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale / 10:
            return f"{value / scale:.3f} {unit}"
    return f"{value:.0f} FLOP"


def describe(result: BenchResult) -> str:
    mfu = f"{result.mfu:.1%}" if result.mfu is not None else "n/a"
    switches = ", ".join(f"{k}={v}" for k, v in result.speedups.items())
    return "\n".join([
        f"{result.workload} {result.scale} on {result.device} ({'synthetic data' if result.synthetic else 'real data'}"
        f", batch {result.batch_size}, {result.steps} timed steps after {result.warmup} warm-up)",
        f"  switches: {switches}",
        f"  throughput: {_rate(result.samples_per_s)} {result.sample_name}/s"
        + (f" ({result.units_per_s:,.0f} {result.units}/s)" if result.units_per_s is not None else ""),
        f"  step time: p50 {result.step_time_p50_ms:.2f} ms, p90 {result.step_time_p90_ms:.2f} ms",
        f"  data loading: {result.data_share:.1%} of the time"
        + "".join(f"; {_rate(v)} {k}/s" for k, v in result.counter_rates.items()),
        f"  peak memory: {result.peak_memory_mb:,.0f} MiB ({result.peak_memory_kind})"
        + (f"; tensors alone {result.peak_allocated_mb:,.0f} MiB" if result.peak_allocated_mb is not None else "")
        + (f"; device in use {result.device_in_use_mb:,.0f} of {result.device_total_mb:,.0f} MiB (CUDA context "
           "included)" if result.device_in_use_mb is not None and result.device_total_mb else ""),
        f"  model FLOPs: {_flops(result.flops_per_sample)} per sample (forward + backward, torch.utils.flop_counter)",
        f"  achieved: {result.achieved_tflops:.3f} TFLOP/s; peak {result.peak_tflops or 0:.2f} TFLOP/s "
        f"({result.peak_source}); MFU {mfu}",
        *([f"  counted as published: {_flops(result.formula_flops_per_sample)} per sample "
           f"({result.formula_how}); {result.tokens_per_s:,.0f} tokens/s per device; MFU "
           + (f"{result.formula_mfu:.1%}" if result.formula_mfu is not None else "n/a")]
          if result.formula_flops_per_sample is not None and result.tokens_per_s is not None else []),
        *(f"  sharding: {line}" for line in (result.layout or {}).get("summary", [])),
        *([_statistics(result.step_statistics)] if result.step_statistics else []),
    ])


def _statistics(values: dict[str, float]) -> str:
    if "expert_load_max_over_mean" in values:
        return (f"  expert load (tokens per expert, max / mean, this process's last step): worst layer "
                f"{values['expert_load_max_over_mean']:.2f}, mean over {values['moe_layers']:.0f} layers "
                f"{values['expert_load_max_over_mean_avg']:.2f}")
    return "  " + ", ".join(f"{k} {v:.4g}" for k, v in values.items())


def _rate(value: float) -> str:
    # Full-size models on a CPU run below 0.1 samples/s: keep three significant digits there.
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"
