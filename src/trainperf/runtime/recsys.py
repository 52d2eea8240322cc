"""Model-parallel embedding tables on TorchRec: the runtime's other way of distributing a model.

A workload whose ModelParts' `parallel` is `ShardedTables()` builds its tables as TorchRec
EmbeddingBagCollections (pooled: DLRM's bags) or EmbeddingCollections (a row a position: HSTU's sequences) on
the meta device, with their optimizer applied in the backward pass
(FBGEMM fuses it into the table-batched kernels). Here they are sharded across the process group by
TorchRec's DistributedModelParallel, with the plan TorchRec's planner chooses for the devices and
memory at hand (table-wise, row-wise, column-wise; tables in device memory, or in host memory behind a
device cache where a GPU cannot hold them); the rest of the model is data-parallel (DDP inside DMP).

TorchRec is an optional extra (trainperf.optional.TORCHREC); asking for it without it is one line naming it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from trainperf import devices, optional
from trainperf.contract import Assets, ModelParts, Recipe, RuntimeContext, ShardedTables, Workload
from trainperf.errors import TrainperfError

RESERVED = 0.15  # of each device's memory, kept out of the tables' plan


def require() -> None:
    """One line naming the extra when TorchRec (or FBGEMM, its kernels) cannot be imported."""
    # TorchRec's import and planner talk about their own internals at every run (torch.fx deprecations,
    # the planner's heuristics): trainperf prints the plan itself.
    for name in ("torch.fx._symbolic_trace", "torchrec.distributed.planner", "torchrec.distributed.planner.types",
                 "torchrec.distributed.planner.storage_reservations"):
        logging.getLogger(name).setLevel(logging.ERROR)
    optional.require("fbgemm_gpu", "embeddings=torchrec", optional.TORCHREC)
    optional.require("torchrec", "embeddings=torchrec", optional.TORCHREC)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TorchRec's warnings about itself (its DDP wrapper's deprecated arguments, the planner's dry-run
    estimates), not the user's business; other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torchrec(\.|$)")
        yield


def parse_bytes(text: str, option: str) -> int:
    """'80GB', '80G', '512GiB', '1.5TB' -> bytes (powers of 1024, as GPU memory is quoted)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match or not 0 < float(match.group(1)) < 2**60:
        raise TrainperfError(f"{option} {text!r}: expected a size such as 80GB or 512GiB")
    power = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024 ** power)


def host_memory() -> int:
    """This machine's memory in bytes (what tables kept in host memory can use)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30


def topology(world_size: int, local_world_size: int, compute_device: str, device_bytes: int,
             host_bytes: int) -> Any:
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world_size, local_world_size=local_world_size, compute_device=compute_device,
                    hbm_cap=device_bytes, ddr_cap=host_bytes)


def sharders() -> list[Any]:
    """TorchRec's sharders of both kinds of collection (each module is sharded by the one of its kind)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


def table_configs(module: torch.nn.Module) -> dict[str, Any]:
    """Every table's config in `module`'s collections, pooled or not, by name."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    configs: dict[str, Any] = {}
    for submodule in module.modules():
        if isinstance(submodule, EmbeddingBagCollection):
            configs.update({c.name: c for c in submodule.embedding_bag_configs()})
        elif isinstance(submodule, EmbeddingCollection):
            configs.update({c.name: c for c in submodule.embedding_configs()})
    return configs


def plan(module: torch.nn.Module, topo: Any, batch_size: int, group: Any = None) -> Any:
    """TorchRec's plan for the embedding collections in `module` on `topo` (`group`: agreed by every
    process of it; None: planned here alone, as `trainperf plan` does without any device)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    try:
        with _quiet():
            # 15 % of each device's memory kept for the dense model, activations and buffers (TorchRec's
            # recommended reservation; its heuristic one over-estimates the dense part without devices).
            planner = EmbeddingShardingPlanner(topology=topo, batch_size=batch_size, debug=False,
                                               constraints=_fused_only(module),
                                               storage_reservation=FixedPercentageStorageReservation(RESERVED))
            if group is not None:
                return planner.collective_plan(module, sharders(), group)
            return planner.plan(module, sharders())
    except Exception as exc:  # noqa: BLE001 - the planner's "no plan fits" is an error of its own kind
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TrainperfError(f"TorchRec's planner found no sharding plan for {topo.world_size} device(s) of "
                             f"{topo.devices[0].storage.hbm / 2**30:.0f} GiB ({first[:300]})") from None


def _fused_only(module: torch.nn.Module) -> dict[str, Any]:
    """Every table sharded (table-, row- or column-wise), its lookup FBGEMM's table-batched kernel with the
    optimizer fused into the backward, in device memory or in host memory behind a device cache: never
    replicated on every rank (data_parallel), whose dense lookup FBGEMM's CPU build cannot backpropagate
    through (torch warns of silently wrong gradients), and which would not fuse the update."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType

    shardings = [t.value for t in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE,
                                   ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE)]
    kernels = [k.value for k in (EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.FUSED_UVM_CACHING)]
    return {name: ParameterConstraints(sharding_types=shardings, compute_kernels=kernels)
            for name in table_configs(module)}


def describe(sharding_plan: Any, module: torch.nn.Module) -> list[dict[str, Any]]:
    """One row per table: its size, how it is sharded, and the fp32 bytes of it each rank holds
    ({table, rows, dim, bytes, sharding, kernel, ranks, rank_bytes})."""
    configs = table_configs(module)
    rows = []
    for params in sharding_plan.plan.values():
        for name, options in params.items():
            config = configs.get(name)
            rank_bytes: dict[int, int] = {}
            for shard in (options.sharding_spec.shards if options.sharding_spec is not None else []):
                rank = shard.placement.rank()
                rank_bytes[rank] = rank_bytes.get(rank, 0) + 4 * shard.shard_sizes[0] * shard.shard_sizes[1]
            rows.append({"table": name, "rows": config.num_embeddings if config else None,
                         "dim": config.embedding_dim if config else None,
                         "bytes": 4 * config.num_embeddings * config.embedding_dim if config else None,
                         "sharding": getattr(options.sharding_type, "value", str(options.sharding_type)),
                         "kernel": getattr(options.compute_kernel, "value", str(options.compute_kernel)),
                         "ranks": sorted(rank_bytes), "rank_bytes": rank_bytes})
    return rows


def size_text(count: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count:.0f} B"


def summary_lines(rows: list[dict[str, Any]], world_size: int) -> list[str]:
    """A readable plan: the tables grouped by how they are sharded, and the table bytes each rank holds."""
    groups: dict[tuple[str, str], list[str]] = {}
    per_rank = [0] * world_size
    for row in rows:
        groups.setdefault((row["sharding"], row["kernel"]), []).append(row["table"])
        for rank, count in row["rank_bytes"].items():
            per_rank[int(rank)] += count
    lines = [f"{len(names)} table(s) {sharding}, {kernel}: {', '.join(names[:8])}{' …' if len(names) > 8 else ''}"
             for (sharding, kernel), names in sorted(groups.items())]
    lines.append(f"table bytes per rank (fp32, before any optimizer state or cache): max {size_text(max(per_rank))}, "
                 f"min {size_text(min(per_rank))}, all {size_text(sum(per_rank))}")
    return lines


def _group_of_one(ctx: RuntimeContext) -> None:
    """TorchRec's sharded modules use torch.distributed even alone: a lone process gets a group of one
    (an in-memory store, no rendezvous)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if ctx.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=ctx.device if ctx.device.type == "cuda" else None)


def shard(parts: ModelParts, ctx: RuntimeContext, batch_size: int) -> ModelParts:
    """DistributedModelParallel over the process group, the plan chosen for this machine's devices; the
    optimizer the embeddings' fused one (in the backward) with the workload's dense one."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    require()
    _group_of_one(ctx)
    if ctx.device.type == "cuda":
        device_bytes, compute = devices.total_memory(ctx.device), "cuda"
    else:
        device_bytes, compute = host_memory(), "cpu"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    topo = topology(ctx.world_size, local, compute, device_bytes, host_memory())
    chosen = plan(parts.model, topo, batch_size, dist.group.WORLD)
    layout_rows = describe(chosen, parts.model)
    dense = parts.optimizer
    with _quiet():
        # The dense part's DDP without static_graph (TorchRec's default): with it, DDP read a flag of every
        # dense parameter back to the host in each backward (25 synchronisations a step in DLRM-DCNv2's).
        model = DistributedModelParallel(parts.model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                         device=ctx.device, plan=chosen, sharders=sharders(),
                                         data_parallel_wrapper=DefaultDataParallelWrapper(static_graph=False))
    wrapped = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                    lambda _params: dense)
    parts.model = model
    parts.optimizer = _fused_and_dense(model.fused_optimizer, wrapped)
    parts.layout = {"engine": "torchrec", "world_size": ctx.world_size, "compute_device": compute,
                    "device_bytes": device_bytes, "tables": layout_rows,
                    "summary": summary_lines(layout_rows, ctx.world_size)}
    return parts


def compile_dense(model: torch.nn.Module, options: dict[str, Any]) -> list[str]:
    """Compile, in place (parameter names unchanged), each largest submodule holding no sharded table and
    some trainable parameter: the dense arches around TorchRec's lookups. Their names, for the record."""
    from torchrec.distributed.types import ShardedModule

    compiled: list[str] = []

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, ShardedModule):  # the tables: TorchRec's and FBGEMM's own kernels
                continue
            if any(isinstance(m, ShardedModule) for m in child.modules()):
                visit(child, path + ".")
            elif any(p.requires_grad for p in child.parameters()):
                child.compile(**options)
                compiled.append(path)

    visit(model, "")
    return compiled


def _fused_and_dense(fused: Any, dense: Any) -> Any:
    """The embeddings' optimizer with the dense one, as one torch optimizer (an LR schedule drives both).
    FBGEMM applies the embeddings' update inside the backward pass with the learning rate its kernels
    were last given, and their optimizer's `step` does nothing but give it; so `zero_grad`, at the start
    of each training step, gives them this step's rate: the schedule reaches the embedding update of the
    same step, as it does the dense one."""
    from torchrec.optim.keyed import CombinedOptimizer

    class FusedAndDense(CombinedOptimizer):
        def zero_grad(self, set_to_none: bool = True) -> None:
            super().zero_grad(set_to_none=set_to_none)
            fused.step()

    return FusedAndDense([("embeddings", fused), ("dense", dense)])


# `trainperf plan` of tables: TorchRec's planner enumerates every table's shardings over every device (512
# devices: ~100 s, 2,048: over 5 minutes on a 2-core CPU; 50,000 never ended). The largest MLPerf DLRM systems
# are below this.
MAX_PLAN_DEVICES = 1024


def plan_for(workload: Workload, recipe: Recipe, devices_count: int, local_devices: int, device_bytes: int,
             host_bytes: int, batch_size: int) -> dict[str, Any]:
    """The plan of `workload`'s model-parallel tables at `recipe` on `devices_count` GPUs of `device_bytes`
    (`local_devices` per node, `host_bytes` of host memory each), planned here: no data, no devices, the
    tables never allocated (the meta device)."""
    require()
    ctx = RuntimeContext(device=torch.device("cpu"))
    with _quiet():
        parts = workload.build(recipe, ctx, Assets(workload.assets(recipe, None)))
    if not isinstance(parts.parallel, ShardedTables):
        raise TrainperfError(f"{workload.name}: no model-parallel embedding tables with these settings")
    topo = topology(devices_count, local_devices, "cuda", device_bytes, host_bytes)
    rows = describe(plan(parts.model, topo, batch_size), parts.model)
    return {"workload": workload.name, "recipe": recipe.name, "devices": devices_count,
            "local_devices": local_devices, "device_bytes": device_bytes, "host_bytes": host_bytes,
            "batch_size_per_device": batch_size, "tables": rows, "summary": summary_lines(rows, devices_count)}


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def plan_table(result: dict[str, Any]) -> str:
    """The plan as text: one line per table, then the summary."""
    width = max([5, *(len(row["table"]) for row in result["tables"])])  # DLRM's t_cat_0 to HSTU's crossed names
    lines = [f"{'table':<{width}} {'rows':>12} {'dim':>4} {'size':>11} {'sharding':<16} {'kernel':<18} ranks"]
    for row in sorted(result["tables"], key=lambda r: (len(r["table"]), r["table"])):
        size = size_text(row["bytes"] or 0)
        lines.append(f"{row['table']:<{width}} {row['rows'] or 0:>12,} {row['dim'] or 0:>4} {size:>11} "
                     f"{row['sharding']:<16} {row['kernel']:<18} {_ranks_text(row['ranks'])}")
    return "\n".join(lines + result["summary"])
