"""FSDP2 with tensor and sequence parallelism: the engine behind spec.FullyShard, composed as torchtitan
composes it (its `parallelize` functions), from torch.distributed's own pieces:

1. a device mesh of the launched processes, ("dp", "tp") with the tensor-parallel processes adjacent
   (one node's GPUs share NVLink);
2. tensor + sequence parallelism over "tp" (`parallelize_module` with the model's own plan);
3. activation checkpointing of the blocks (torch's checkpoint wrapper: every block, or every other);
4. `torch.compile` of each block (the recipe's compile switch): small graphs, compiled once and reused;
   with `--cuda-graphs` each block's forward and backward recorded as CUDA graphs and replayed;
5. `fully_shard` of each block, then of the root, over "dp": parameters, gradients and optimizer state
   sharded, each block's weights gathered just before it runs; in bf16 the gathers carry bf16 weights and
   the gradients are reduced in fp32 (MixedPrecisionPolicy).

With expert parallelism (ep > 1, tp 1) the mesh is ("dp_mod_ep", "ep") as torchtitan lays it out: each MoE
layer keeps the experts of its place on "ep" and exchanges tokens over it; its experts are fully sharded
over "dp_mod_ep" (the processes holding the same experts), their gradients divided by all the processes
(each expert's gradient already sums the whole "ep" group's tokens), and everything else is fully sharded
over all processes. The gradients then live on two meshes: their norm is summed from every process's
shards (`ep_grad_norm`), which counts each element once because nothing is replicated.

torchtitan itself is not a dependency: its parallelize functions take its own job config and model
classes, and what they do with torch's APIs is the twenty lines below. What is kept by hand: which
blocks are checkpointed, and the optimizer rebuilt over the sharded parameters.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from trainperf.contract import ExpertLayer, FullyShard, ModelParts, Parallelism, Recipe, RuntimeContext, ShardedModel
from trainperf.errors import TrainperfError
from trainperf.runtime import speedups
from trainperf.runtime.engine import Engine

_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def _plain(name: str) -> str:
    for wrapper in _WRAPPERS:
        name = name.replace(wrapper, "")
    return name


def mesh_shape(world: int, tp: int) -> tuple[int, int]:
    if world % tp:
        raise TrainperfError(f"tensor parallelism tp={tp}: the {world} processes are not a multiple of it")
    return world // tp, tp


def _sharded(model: nn.Module) -> ShardedModel:
    """The model as the contract declares what FSDP reads of it (spec.ShardedModel)."""
    if not isinstance(model, ShardedModel) or not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise TrainperfError(f"{type(model).__name__}: FSDP needs a spec.ShardedModel with its repeated blocks as "
                             "`blocks` (an nn.ModuleList)")
    return model


def rebind_optimizer(optimizer: torch.optim.Optimizer, before: dict[int, str], model: nn.Module
                     ) -> torch.optim.Optimizer:
    """The same optimizer (class, groups, hyperparameters) over the parameters the model holds now:
    sharding replaces each parameter by a DTensor of its shard. Before any step, so there is no state."""
    now = {_plain(name): p for name, p in model.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        groups.append({**options, "params": [now[_plain(before[id(p)])] for p in group["params"]]})
    # The defaults too, where the constructor takes them: some choices act there only (fused kernels).
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})


def extra_units(model: nn.Module) -> list[nn.Module]:
    """Modules outside the blocks that the model asks to be sharded as units of their own
    (ShardedModel.shard_units: DeepSeek's multi-token prediction block), so that the root does not gather them."""
    return list(_sharded(model).shard_units())


def materialize(model: nn.Module, device: torch.device) -> None:
    """A model built on the meta device, sharded: storage for this process's shards (and its buffers) on
    `device`, then the model's own `init_weights()`. On a GPU, DTensor's random number tracker is meant to
    draw each shard as its part of the whole tensor (untested here); on a CPU mesh every shard draws the
    same numbers (torch's fallback), so a CPU run with meta_init is initialised differently from one
    without."""
    sharded = _sharded(model)
    if type(sharded).init_weights is ShardedModel.init_weights:
        sharded.init_weights()  # says, before any storage is allocated, that it cannot
    model.to_empty(device=device)
    sharded.init_weights()


class FSDPEngine(Engine):
    compiles_model = True

    def check(self, spec: Parallelism, recipe: Recipe, ctx: RuntimeContext) -> None:
        assert isinstance(spec, FullyShard)
        mesh_shape(ctx.world_size, spec.tp)
        if recipe.cuda_graphs and spec.tp > 1:
            # Tensor parallelism's collectives sit inside each block, so they would be recorded in its graphs.
            raise TrainperfError(f"cuda_graphs with tensor parallelism tp={spec.tp}: its collectives would run inside "
                                 "the blocks' graphs, which is not built or tested; use tp=1")
        if recipe.cuda_graphs and spec.ep > 1:
            # Each MoE layer's all-to-all takes its split sizes (tokens per expert) from the host every step.
            raise TrainperfError(f"cuda_graphs with expert parallelism ep={spec.ep}: the all-to-all's split sizes "
                                 "are read by the host every step, which a CUDA graph cannot record; use ep=1")
        if recipe.precision == "fp16" and ctx.world_size > 1:
            # torch's GradScaler finds infinities in this process's shard only: ranks would skip different steps.
            raise TrainperfError("precision=fp16: not with FSDP over several processes (use bf16)")
        if spec.ep > 1 and ctx.world_size == 1:
            raise TrainperfError(f"expert parallelism ep={spec.ep}: needs launched processes (--nproc {spec.ep}, or "
                                 "--set ep=1 on one)")
        if spec.ep > 1 and ctx.world_size % spec.ep:
            raise TrainperfError(f"expert parallelism ep={spec.ep}: the {ctx.world_size} processes are not a multiple "
                                 "of it")
        if recipe.precision == "fp8" and spec.tp > 1:
            raise TrainperfError(f"precision=fp8 with tp={spec.tp}: float8 layers need torchao's own tensor-parallel "
                                 "styles, not built; use tp=1")

    def disclosure(self, spec: Parallelism, recipe: Recipe) -> dict[str, Any]:
        assert isinstance(spec, FullyShard)
        # Under bf16 (and fp8's bf16 rest) the parameters are gathered in bf16; gradients reduce in fp32.
        comm = "bfloat16" if recipe.precision in ("bf16", "fp8") else "fp32"
        return {**super().disclosure(spec, recipe), "tensor_parallelism": spec.tp, "expert_parallelism": spec.ep,
                "lowest_numerical_precision_in_comm": comm}

    def replicas(self, spec: Parallelism) -> int:
        assert isinstance(spec, FullyShard)
        return spec.tp  # the mesh's tp processes are adjacent ranks

    def apply(self, spec: Parallelism, parts: ModelParts, recipe: Recipe, ctx: RuntimeContext) -> ModelParts:
        assert isinstance(spec, FullyShard)
        model = _sharded(parts.model)
        blocks = model.blocks
        before = {id(p): name for name, p in model.named_parameters()}
        mesh = self._mesh(spec, ctx)
        experts = self._shard_experts(model, spec, mesh) if spec.ep > 1 else []
        if spec.tp > 1:
            if mesh is None:
                raise TrainperfError(f"tensor parallelism tp={spec.tp}: needs launched processes (--nproc)")
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, mesh["tp"], model.tensor_parallel_plan())
        if spec.checkpointing != "none":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            every = 1 if spec.checkpointing == "full" else 2
            for i in range(0, len(blocks), every):
                # A block with dropout (LoRA's adapters) must draw the same masks when recomputed, or its
                # gradients are not those of its forward; without, saving the random state is wasted.
                random = any(isinstance(m, nn.Dropout) and m.p > 0 for m in blocks[i].modules())
                blocks[i] = checkpoint_wrapper(blocks[i], preserve_rng_state=random)
        if recipe.compile or recipe.cuda_graphs:
            # With CUDA Graphs each block is recorded on its own ("reduce-overhead": torch's CUDA graph trees),
            # and FSDP's gathers and reduce-scatters run between the blocks' replays, from its hooks outside
            # the compiled forward; the step marks each iteration's start (TrainStep).
            options = speedups.compile_options(recipe)
            for i in range(len(blocks)):
                blocks[i] = torch.compile(blocks[i], **options)
        if mesh is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            dp = mesh["dp"] if spec.ep == 1 else mesh._flatten("dp")
            # The blocks' float inputs are left as they are: the rotary tables must stay fp32 (a bf16 angle is
            # off by ~4e-3 at 8,192 positions); autocast runs the blocks' products in bf16 anyway.
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                          cast_forward_inputs=False) \
                if recipe.precision in ("bf16", "fp8") else MixedPrecisionPolicy()
            for layer in experts:
                fully_shard(layer.experts, mesh=mesh["dp_mod_ep"], mp_policy=policy)
                layer.experts.set_gradient_divide_factor(float(ctx.world_size))
                if ctx.device.type == "cpu" and ctx.world_size > spec.ep:
                    # The experts' group of several processes: gloo has no pre-multiplied sum (NCCL's PreMulSum),
                    # so sum, then scale. (A group of one reduces nothing and keeps torch's path.)
                    layer.experts.set_force_sum_reduction_for_comms(True)
            last = len(blocks) - 1
            for i, block in enumerate(blocks):
                # The last block's weights are needed again at once by the backward: keep them gathered.
                fully_shard(block, mesh=dp, mp_policy=policy,
                            reshard_after_forward=spec.reshard_after_forward and i < last)
            for unit in extra_units(model):  # gathered on their own, not with the root's embeddings
                fully_shard(unit, mesh=dp, mp_policy=policy, reshard_after_forward=spec.reshard_after_forward)
            fully_shard(model, mesh=dp, mp_policy=policy, reshard_after_forward=False)
        if any(p.is_meta for p in model.parameters()):
            materialize(model, ctx.device)
        parts.optimizer = rebind_optimizer(parts.optimizer, before, model)
        shape = {"dp": ctx.world_size // spec.tp, "tp": spec.tp}
        summary = (f"FSDP2 over {ctx.world_size // spec.tp} data-parallel processes, tensor parallelism over "
                   f"{spec.tp}, activation checkpointing {spec.checkpointing}")
        if spec.ep > 1:
            shape = {"dp": ctx.world_size, "ep": spec.ep, "dp_mod_ep": ctx.world_size // spec.ep}
            summary = (f"FSDP2 over {ctx.world_size} data-parallel processes, each MoE layer's experts split over "
                       f"{spec.ep} (expert parallelism) and sharded over {ctx.world_size // spec.ep}, activation "
                       f"checkpointing {spec.checkpointing}")
            parts.grad_norm = ep_grad_norm
        if recipe.cuda_graphs:
            summary += "; each block's forward and backward replayed as CUDA graphs, FSDP's collectives between them"
        parts.layout = {"engine": "fsdp", "mesh": shape, "checkpointing": spec.checkpointing,
                        "compiled_blocks": bool(recipe.compile or recipe.cuda_graphs),
                        "graphed_blocks": bool(recipe.cuda_graphs), "summary": [summary]}
        return parts

    @staticmethod
    def _shard_experts(model: nn.Module, spec: FullyShard, mesh: Any) -> list[ExpertLayer]:
        layers = [m for m in model.modules() if isinstance(m, ExpertLayer)]
        if not layers:
            raise TrainperfError(f"expert parallelism ep={spec.ep}: {type(model).__name__} has no mixture-of-experts "
                                 "layers (spec.ExpertLayer)")
        ep = mesh["ep"]
        for layer in layers:
            layer.shard_experts(ep.get_group(), ep.get_local_rank(), spec.ep)
        return layers

    @staticmethod
    def _mesh(spec: FullyShard, ctx: RuntimeContext) -> Any:
        if not ctx.distributed:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        if spec.ep > 1:
            return init_device_mesh(ctx.device.type, (ctx.world_size // spec.ep, spec.ep),
                                    mesh_dim_names=("dp_mod_ep", "ep"))
        return init_device_mesh(ctx.device.type, mesh_shape(ctx.world_size, spec.tp), mesh_dim_names=("dp", "tp"))


def ep_grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of the gradients of parameters sharded over several meshes, none replicated: every
    process's shards' squares summed, then all-reduced over all processes (a device tensor, no host read)."""
    import torch.distributed as dist

    local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]
    squares = torch.stack([n.float() ** 2 for n in torch._foreach_norm(local)]).sum() if local else \
        torch.zeros((), device=params[0].device)
    dist.all_reduce(squares)
    return squares.sqrt()
