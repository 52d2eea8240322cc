"""The engines behind the contract's parallelism records (contract/parallel.py): one per record type,
looked up by the record's `engine` name, so the harness and the step never ask which one a workload
chose. DDP and TorchRec are two of them, FSDP2 with tensor parallelism (fsdp.py) a third; a test or a
plugin may register another (`register`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainperf.contract import DataParallel, ModelParts, Parallelism, Recipe, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.runtime.engine import Engine


class DDPEngine(Engine):
    def apply(self, spec: Parallelism, parts: ModelParts, recipe: Recipe, ctx: RuntimeContext) -> ModelParts:
        from trainperf.runtime import distributed

        return distributed.wrap_data_parallel(parts, ctx)


class TorchRecEngine(Engine):
    # The sharded tables' lookups and all-to-alls stay eager (TorchRec's and FBGEMM's calls do not trace);
    # compile, and CUDA Graphs through it, apply to the dense modules around them, as TorchRec's users do.
    compiles_model = True

    def apply(self, spec: Parallelism, parts: ModelParts, recipe: Recipe, ctx: RuntimeContext) -> ModelParts:
        from trainperf.runtime import recsys

        parts = recsys.shard(parts, ctx, ctx.batch_share(recipe.global_batch_size))
        if recipe.compile or recipe.cuda_graphs:
            from trainperf.runtime import speedups

            compiled = self.compile_units(parts, speedups.compile_options(recipe))
            parts.layout = {**(parts.layout or {}), "compiled_dense_modules": compiled}
        return parts

    def compile_units(self, parts: ModelParts, options: dict[str, Any]) -> list[str] | None:
        from trainperf.runtime import recsys

        return recsys.compile_dense(parts.model, options)


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
