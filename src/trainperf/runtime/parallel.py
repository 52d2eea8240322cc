"""The engines behind the contract's parallelism records (spec/parallel.py): one per record type,
looked up by the record's `engine` name, so the harness and the step never ask which one a workload
chose. DDP and TorchRec are two of them, FSDP2 with tensor parallelism (fsdp.py) a third; a test or a
plugin may register another (`register`)."""

from __future__ import annotations

import dataclasses

from trainperf.errors import TrainperfError
from trainperf.runtime.engine import Engine
from trainperf.spec import DataParallel, ModelParts, Parallelism, Recipe, RuntimeContext


class DDPEngine(Engine):
    def apply(self, spec: Parallelism, parts: ModelParts, recipe: Recipe, ctx: RuntimeContext) -> ModelParts:
        from trainperf.runtime import distributed

        return distributed.wrap_data_parallel(parts, ctx)


class TorchRecEngine(Engine):
    def check(self, spec: Parallelism, recipe: Recipe, ctx: RuntimeContext) -> None:
        if recipe.compile or recipe.cuda_graphs:
            raise TrainperfError("compile and cuda_graphs do not apply to model-parallel embedding tables "
                                 "(TorchRec's sharded modules)")

    def apply(self, spec: Parallelism, parts: ModelParts, recipe: Recipe, ctx: RuntimeContext) -> ModelParts:
        from trainperf.runtime import recsys

        return recsys.shard(parts, ctx, max(1, recipe.global_batch_size // ctx.world_size))


def _fsdp() -> Engine:
    from trainperf.runtime.fsdp import FSDPEngine

    return FSDPEngine()


ENGINES: dict[str, Engine] = {"ddp": DDPEngine(), "torchrec": TorchRecEngine()}
LAZY = {"fsdp": _fsdp}  # imported when first asked for: torch.distributed.fsdp and tensor are heavy


def register(name: str, engine: Engine) -> None:
    ENGINES[name] = engine


def engine_for(spec: Parallelism | None) -> Engine:
    name = (spec or DataParallel()).engine
    if name not in ENGINES and name in LAZY:
        ENGINES[name] = LAZY[name]()
    if name not in ENGINES:
        raise TrainperfError(f"parallelism {name!r}: no engine for it (known: {', '.join(sorted({*ENGINES, *LAZY}))})")
    return ENGINES[name]


def spec_of(parts: ModelParts) -> Parallelism:
    return parts.parallel or DataParallel()


def data_context(parts: ModelParts, ctx: RuntimeContext) -> RuntimeContext:
    """The context the data pipelines and the evaluation use once the model is distributed: its replica
    groups (tensor parallelism's) read one shard between them."""
    spec = spec_of(parts)
    return dataclasses.replace(ctx, replicas=engine_for(spec).replicas(spec))
