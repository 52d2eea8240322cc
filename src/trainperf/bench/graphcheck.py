"""Whether a workload's training step compiles as one graph and stays compiled, checked on any machine.

`--compile` and `--cuda-graphs` compile the training model (runtime/speedups.py); CUDA Graphs then replay
what was recorded, which pays only when the forward and its backward are each one graph (a graph break
splits the step into pieces the host launches one by one) and when later steps do not compile again
(a recompile per step records a graph per step). This traces the model as the harness does, but with
`fullgraph=True` (a break is an error naming its line) and `dynamic=False` (one graph per input shape, as
CUDA Graphs record one per shape), through AOTAutograd (so the backward is traced too) with no code
generation: what is measured is the graphs' structure, not compile time. Then it runs the training
step (forward, backward, optimizer) over `steps` steps of each of the workload's shape buckets'
synthetic batches and counts the graphs compiled after the first pass: recompiles.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainperf.contract import Assets, RuntimeContext, Workload
from trainperf.runtime import parallel, speedups
from trainperf.runtime.step import TrainStep

_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass
class GraphCheck:
    workload: str
    graphs: int = 0  # graphs compiled in the first pass over the buckets (forward graphs, each with its backward)
    recompiles: int = 0  # graphs compiled after the first pass: 0 when every step replays what was compiled
    buckets: int = 1  # input shapes the step is fed (Workload.shape_buckets; 1: a static shape)
    steps: int = 0
    # The compiled units: 1 (the whole model) or the modules an engine compiles (TorchRec's dense arches).
    units: int = 1
    broken: str | None = None  # the first graph break, "file:line: why" (None: the step is one graph)
    recompile_reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def one_graph(self) -> bool:
        return self.broken is None and self.graphs == self.buckets * self.units and self.recompiles == 0


def _where(exc: BaseException) -> str:
    """The innermost user frame named in dynamo's message, and its first line of reason."""
    text = str(exc)
    frames = [(path, line) for path, line in _USER_FRAME.findall(text) if "/torch/" not in path]
    where = f"{frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][1]}: " if frames else ""
    reason = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return where + reason[:160]


def check(workload: Workload, ctx: RuntimeContext, steps: int = 3, sets: list[str] | None = None) -> GraphCheck:
    """Compile `workload`'s full-scale training model (at its `step_probe` settings, then `sets`) with
    fullgraph and static shapes, and run `steps` training steps of each shape bucket's synthetic batch."""
    from torch._dynamo.backends.registry import lookup_backend

    start = time.perf_counter()
    overrides = [*workload.step_probe, *(sets or []), "compile=false", "cuda_graphs=false", "async_eval=false"]
    recipe = workload.recipe("full").with_overrides(overrides)
    workload.check_recipe(recipe)
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    batches = workload.synthetic_batches(recipe, ctx, parts.model)
    compiled: list[Any] = []
    aot_eager = lookup_backend("aot_eager")

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled.append(gm)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    speedups.compile_rnns()  # as a compiled run does
    options = {"backend": counting, "fullgraph": True, "dynamic": False}
    units = parallel.engine_for(parallel.spec_of(parts)).compile_units(parts, options)
    if units is None:
        parts.model = torch.compile(parts.model, **options)
    step = TrainStep(parts, 1000, recipe, ctx.device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    result = GraphCheck(workload=workload.name, buckets=len(batches), steps=steps, units=len(units or [None]))
    parts.model.train()
    failures_before = _guard_failures()
    # A module under DDP (TorchRec's dense arches are) is cut by dynamo's DDPOptimizer at gradient bucket
    # boundaries, on purpose and after tracing: counted as one graph here, as dynamo traced it.
    ddp_split = torch._dynamo.config.optimize_ddp
    torch._dynamo.config.optimize_ddp = False
    try:
        for i in range(steps):
            for batch in batches:
                step(batch)
            if i == 0:
                result.graphs = len(compiled)
    except Exception as exc:  # noqa: BLE001 - a break (or what dynamo cannot trace) is the finding
        result.broken = _where(exc)
    finally:
        torch._dynamo.config.optimize_ddp = ddp_split
    result.recompiles = len(compiled) - result.graphs if result.broken is None else 0
    result.recompile_reasons = _guard_failures()[len(failures_before):]
    result.seconds = time.perf_counter() - start
    torch._dynamo.reset()
    return result


def _guard_failures() -> list[str]:
    """Why dynamo recompiled, as it recorded (its guard failures), oldest first."""
    from torch._dynamo import utils

    found = getattr(utils, "guard_failures", {})
    return [str(reason).splitlines()[0][:200] for reasons in found.values() for reason in reasons]
