"""Speedups, applied in one place. The harness (and `bench`) get their model through `assemble`.

Switches live in the recipe (so `--set`, the CLI flags, `bench`, `scale` and `ablate` all reach them
and every result records them): precision, channels_last, compile, cuda_graphs, fused_optimizer,
async_eval, packing, static_shapes. `SWITCHES` is the one list of them. A workload declares which apply
to it; asking for one it does not support, or one the device cannot run, is a clear error, never a silent no-op.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainperf import devices
from trainperf.contract import Assets, ModelParts, Parallelism, Recipe, RuntimeContext, Workload, bare_model
from trainperf.errors import TrainperfError
from trainperf.runtime.engine import Engine


@dataclass(frozen=True)
class Switch:
    """One speedup: its recipe field, its command-line flag, and what the ablation turns on."""

    name: str  # the recipe field
    flag: str
    help: str
    off: Any  # the value that means "off"
    on: Any  # the value the ablation ladder turns on
    label: str  # the ablation's name for it
    choices: tuple[str, ...] = ()  # a multi-valued switch (precision); else a boolean flag
    ladder: bool = True  # part of the throughput ablation


# The ablation ladder adds them in this order: cheap, always-safe switches first, compilation last.
SWITCHES: tuple[Switch, ...] = (
    Switch("packing", "--packing", "pack several short sequences into one row (block-diagonal attention)", False,
           True, "packing"),
    Switch("channels_last", "--channels-last", "NHWC memory layout for convolutions", False, True,
           "channels_last"),
    Switch("precision", "--precision", "autocast precision (fp16 adds loss scaling; fp8: the Linear layers in "
           "float8 through torchao, the rest in bf16)", "fp32", "bf16", "bf16",
           choices=("fp32", "bf16", "fp16", "fp8")),
    Switch("fused_optimizer", "--fused-optimizer", "torch's fused optimizer kernels where they exist", False, True,
           "fused_optimizer"),
    Switch("static_shapes", "--static-shapes", "pad training batches to a few fixed shapes (the workload's "
           "buckets; padding kept out of the loss) so compiled graphs are reused; on with --cuda-graphs", False, True,
           "static shapes"),
    Switch("compile", "--compile", "torch.compile the model and the evaluation forward (warmed up before "
           "run_start)", False, True, "compile"),
    Switch("cuda_graphs", "--cuda-graphs", "capture the model's forward/backward as CUDA Graphs and replay them "
           "(GPU only)", False, True, "cuda_graphs"),
    Switch("graphs_backend", "--graphs-backend", "what records --cuda-graphs' graphs: inductor (compiled kernels, "
           "mode reduce-overhead) or cudagraphs (dynamo's graphs recorded as traced: no kernel compilation, for the "
           "models Inductor is slow to compile)", "inductor", "cudagraphs", "graphs without Inductor",
           choices=("inductor", "cudagraphs"), ladder=False),
    Switch("regional_compile", "--regional-compile", "compile the model's repeated blocks one by one, each block's "
           "code once, instead of the whole model (with --compile or --cuda-graphs)", False, True,
           "regional compile", ladder=False),
    Switch("async_eval", "--async-eval", "score evaluations in the background while training continues", False,
           True, "async_eval", ladder=False),
)
# fp8 runs its Linear layers in float8 (torchao) and autocasts the rest to bf16.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
# Float8 matrix products need a GPU of compute capability 8.9 or above (Ada, Hopper and later).
FP8_CAPABILITY = (8, 9)


def enabled(recipe: Recipe) -> dict[str, Any]:
    """The switches as recorded in results and logs."""
    return {s.name: getattr(recipe, s.name) for s in SWITCHES}


def all_off() -> list[str]:
    """`--set` assignments that turn every switch off."""
    return [f"{s.name}={str(s.off).lower()}" for s in SWITCHES]


# Switches that refine another (a workload supporting the one supports them): name -> the switch refined.
REFINES = {"graphs_backend": "cuda_graphs"}


def check_supported(workload: Workload, recipe: Recipe, device: torch.device) -> None:
    for switch in SWITCHES:
        value = getattr(recipe, switch.name)
        if value != switch.off and REFINES.get(switch.name, switch.name) not in workload.speedups:
            raise TrainperfError(f"{switch.name}={value}: not supported by {workload.name}")
    if recipe.graphs_backend != "inductor" and not recipe.cuda_graphs:
        raise TrainperfError(f"graphs_backend={recipe.graphs_backend} (--graphs-backend): chooses how --cuda-graphs "
                             "records its graphs; add --cuda-graphs")
    if recipe.regional_compile and not (recipe.compile or recipe.cuda_graphs):
        raise TrainperfError("regional_compile=true (--regional-compile): chooses what --compile compiles; add "
                             "--compile (or --cuda-graphs)")
    if recipe.cuda_graphs and device.type != "cuda":
        raise TrainperfError("cuda_graphs=true (--cuda-graphs): CUDA Graphs need a CUDA GPU; this run is on "
                             f"{device.type}")
    if recipe.precision == "fp8":
        if "fp8" not in workload.speedups:
            raise TrainperfError(f"precision=fp8: not supported by {workload.name} (its model is not made of "
                                 "Linear layers that float8 would speed up)")
        if device.type == "cuda" and devices.capability(device) < FP8_CAPABILITY:
            raise TrainperfError(f"precision=fp8: {devices.name(device)} has compute capability "
                                 f"{'.'.join(map(str, devices.capability(device)))}; float8 needs 8.9 or above "
                                 "(Ada, Hopper)")
    if workload.host_scoring not in ("thread", "process"):
        raise TrainperfError(f"{workload.name}: host_scoring must be 'thread' or 'process'")


def assemble(workload: Workload, recipe: Recipe, ctx: RuntimeContext, assets: Assets) -> ModelParts:
    """What a workload builds, made ready to train: built, memory layout applied, wrapped in DDP with
    several processes, compiled (the training model and the evaluation forward) when asked."""
    from trainperf.runtime import parallel

    check_supported(workload, recipe, ctx.device)
    workload.check_recipe(recipe)
    assets.check()
    parts = workload.build(recipe, ctx, assets)
    if parts.eval_forward is None:
        parts.eval_forward = _call_model
    if recipe.channels_last:
        to_channels_last(parts.model)
        if parts.eval_model is not None:
            to_channels_last(parts.eval_model)
    if recipe.precision == "fp8":
        to_float8(parts.model)
    spec = parallel.spec_of(parts)
    engine = check_parallelism(workload, spec, recipe, ctx)
    parts = engine.apply(spec, parts, recipe, ctx)
    # An engine that compiles the model itself (per block) leaves only the evaluation forward to compile here.
    options = compile_options(recipe)
    buckets = workload.shape_buckets(recipe)
    if buckets is not None:
        # One graph per bucket, each specialised to its shape (CUDA Graphs record shapes anyway), and room
        # for all of them before dynamo gives up recompiling and runs eagerly.
        options["dynamic"] = False
        shapes = int(buckets.get("shapes", 1))
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), shapes + 2))
    cpu_rnns(parts.model, ctx.device, recipe.precision)
    if recipe.compile or recipe.cuda_graphs:
        compile_rnns()
    compiled = recipe.compile or recipe.cuda_graphs
    if compiled and recipe.regional_compile:
        if engine.compiles_model or not parts.regions:  # a workload's defect, not a user's: said plainly anyway
            raise TrainperfError(f"regional_compile=true (--regional-compile): {workload.name} declares it but names "
                                 "no repeated blocks its engine leaves to compile")
        # In place: the training model (under DDP) and the evaluation forward both run the compiled blocks, and
        # the blocks' shared code is compiled once per distinct shape, not once per block.
        for region in parts.regions:
            region.compile(**options)
        parts.layout = {**(parts.layout or {}), "compiled_regions": len(parts.regions)}
    elif compiled and not engine.compiles_model:
        # --cuda-graphs: PyTorch's supported capture-and-replay (static shapes, re-capture on change).
        parts.model = torch.compile(parts.model, **options)
    if compiled and parts.eval_compiles and not recipe.regional_compile:
        # The evaluation forward is compiled on its own (it runs the unwrapped module, without DDP).
        parts.eval_forward = torch.compile(parts.eval_forward)
    return parts


def compile_options(recipe: Recipe) -> dict[str, Any]:
    """torch.compile's arguments for the recipe's compile and CUDA Graphs switches: compiled kernels
    (--compile), recorded as CUDA graphs ("reduce-overhead") or dynamo's graphs recorded without Inductor
    (--graphs-backend cudagraphs). Every engine compiles with these."""
    if not recipe.cuda_graphs:
        return {}
    if recipe.graphs_backend == "cudagraphs":
        return {"backend": "cudagraphs"}
    return {"mode": "reduce-overhead"}


def check_parallelism(workload: Workload, spec: Parallelism, recipe: Recipe, ctx: RuntimeContext) -> Engine:
    """The engine of `spec`, once it has found the recipe and the processes fit it (else one line naming the
    workload): before building (`jobs.check_switches`) and again on the processes the run really has."""
    from trainperf.runtime import parallel

    engine = parallel.engine_for(spec)
    try:
        engine.check(spec, recipe, ctx)
    except TrainperfError as exc:
        raise TrainperfError(f"{workload.name}: {exc}") from None
    return engine


def compile_rnns() -> None:
    """Let torch.compile trace LSTMs (GNMT, RNN-T) into the graph: by default dynamo breaks the graph at every
    RNN module, which splits the step into pieces that CUDA Graphs cannot record as one. The workloads' LSTMs
    (workloads/common/rnn.py) then compile as one opaque operator per layer, not unrolled over time."""
    torch._dynamo.config.allow_rnn = True


def cpu_rnns(model: torch.nn.Module, device: torch.device, precision: str) -> None:
    """bf16 RNNs on a CPU without bf16 instructions: oneDNN cannot build its bf16 LSTM there ("could not
    create a primitive descriptor"), torch's native kernel can, so oneDNN is left off for this process."""
    if (device.type == "cpu" and precision == "bf16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and any(isinstance(m, torch.nn.RNNBase) for m in model.modules())):
        torch.backends.mkldnn.enabled = False


def to_channels_last(model: torch.nn.Module) -> None:
    """Every 2-D convolution's weights NHWC and every 3-D one's NDHWC (3D U-Net's; torch refuses
    channels_last for a 5-D tensor). Converting the weights is enough: convolutions then run channels
    last, and their outputs stay so."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() in (4, 5):
            layout = torch.channels_last if weight.dim() == 4 else torch.channels_last_3d
            for tensor in module.parameters(recurse=False):
                if tensor.dim() == weight.dim():
                    tensor.data = tensor.data.to(memory_format=layout)


def to_float8(model: torch.nn.Module) -> int:
    """Swap the model's Linear layers for torchao's float8 training layers (runtime/float8.py: dynamic
    tensorwise scaling, inputs and weights in e4m3, gradients in e5m2; frozen weights without gradients);
    returns how many were swapped."""
    from trainperf.runtime import float8

    return float8.convert(model)


def _call_model(model: torch.nn.Module, batch: Any) -> Any:
    return model(batch)


def evaluation_model(parts: ModelParts) -> torch.nn.Module:
    """The module evaluations score: the workload's eval_model (EMA weights) or the trained module,
    unwrapped from DDP (its forward would sync buffers, and shards differ in size)."""
    return parts.eval_model if parts.eval_model is not None else bare_model(parts.model)


def autocast(recipe: Recipe, device: torch.device) -> contextlib.AbstractContextManager:
    if recipe.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[recipe.precision])


def grad_scaler(recipe: Recipe, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling against gradient underflow; bf16 has fp32's range and does not."""
    if recipe.precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


def evaluate_with(parts: ModelParts, recipe: Recipe, device: torch.device) -> Callable[[Any], Any]:
    """forward(batch) for a workload's evaluate: its eval_forward on the evaluation model, without
    gradients, under the recipe's precision (the caller puts the model in eval mode)."""
    model = evaluation_model(parts)
    forward = parts.eval_forward or _call_model
    graphed = recipe.cuda_graphs

    def run(batch: Any) -> Any:
        if graphed:  # each batch a new iteration of CUDA graph trees (it copies out what is still held)
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), autocast(recipe, device):
            return forward(model, batch)

    return run


def warm_up(workload: Workload, recipe: Recipe, ctx: RuntimeContext, parts: ModelParts,
            make_step: Callable[[], Callable[[Any], torch.Tensor]], steps: int = 3) -> None:
    """Compile (and capture) before run_start, on synthetic batches, as the rules allow: `steps`
    training steps, then the evaluation forward in eval mode at three batch sizes (full, half and one,
    so that no later evaluation batch, however small, compiles anything in the timed region).
    The model, evaluation model and optimizer states are restored afterwards: no synthetic data
    influences training."""
    eval_model = evaluation_model(parts)
    saved = [(m, copy.deepcopy(m.state_dict())) for m in {id(m): m for m in (parts.model, eval_model)}.values()]
    optim_state = copy.deepcopy(parts.optimizer.state_dict())
    batches = workload.synthetic_batches(recipe, ctx, parts.model)  # one per shape bucket: a graph each
    step = make_step()
    for _ in range(steps):
        for batch in batches:
            step(batch)
    if not parts.eval_compiles:
        _restore(parts, saved, optim_state)
        return
    eval_batch = workload.synthetic_eval_batch(recipe, ctx, parts.model)
    forward = evaluate_with(parts, recipe, ctx.device)
    was_training = eval_model.training
    eval_model.eval()
    # Three sizes: the whole batch and half of it make the batch dimension dynamic; a batch of one
    # (the last batch of many evaluation sets) is a graph of its own, as the compiler specialises
    # sizes 0 and 1.
    size = workload.batch_samples(eval_batch)
    # CUDA graph trees run a function once to warm it and record it at its second call: twice each.
    for parts_count in (1, 2, size):
        for _ in range(2 if recipe.cuda_graphs else 1):
            forward(workload.split_batch(eval_batch, parts_count)[0])
    eval_model.train(was_training)
    _restore(parts, saved, optim_state)


def _restore(parts: ModelParts, saved: list[tuple[torch.nn.Module, dict[str, Any]]], optim_state: dict[str, Any]
             ) -> None:
    for module, state in saved:
        module.load_state_dict(state)
    parts.optimizer.load_state_dict(optim_state)
    parts.optimizer.zero_grad(set_to_none=True)
