"""What a workload returns: the parts it builds before run_start and the data it opens after."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainperf.contract.parallel import Parallelism
from trainperf.contract.quality import Quality


@dataclass(frozen=True)
class Logged:
    """A hyperparameter value logged with metadata (`mlperf_hyperparameters`): the Transformer's
    max_sequence_length carries {"method": "discard"}, which its closed rules check."""

    value: Any
    metadata: dict[str, Any]


@dataclass
class ModelParts:
    """What a workload builds during initialisation (before run_start): no data is touched here."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    # loss_fn(model, batch) -> scalar loss: the mean over the batch's samples, or, with loss_units,
    # the SUM over those units (the step divides by their count over all micro-batches and ranks).
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    # lr_schedule(steps_per_epoch or None) -> f(step) giving the LR multiplier of every param group.
    lr_schedule: Callable[[int | None], Callable[[int], float]]
    # eval_forward(model, batch) -> what the evaluation keeps of a batch (predictions, decoded ids):
    # run without gradients, under the recipe's precision, compiled with --compile and warmed up
    # before run_start. None: model(batch).
    eval_forward: Callable[[torch.nn.Module, Any], Any] | None = None
    # False: eval_forward is a search on the host around the model (beam search decoding) that compiling
    # would trace step by step and recompile per output length; it then runs eagerly under --compile.
    eval_compiles: bool = True
    # The module evaluations score (EMA weights, say) instead of `model`.
    eval_model: torch.nn.Module | None = None
    # after_step(step) runs after every optimizer step (step counts from 1): an EMA update, say.
    after_step: Callable[[int], None] | None = None
    # loss_units(batch) -> how many loss-normalising units (tokens, masked positions) a batch holds.
    loss_units: Callable[[Any], torch.Tensor | int] | None = None
    # epoch_hyperparameters(steps_per_epoch) -> hyperparameters whose values are counted in steps of
    # data not yet opened at initialisation (GNMT's remain and decay steps, fractions of all the
    # run's iterations in the reference); logged when the data is opened, after run_start.
    epoch_hyperparameters: Callable[[int | None], dict[str, Any]] | None = None
    # How the runtime distributes the model over the processes (contract/parallel.py): None is data
    # parallelism (DDP); TorchRec's sharded tables (DLRM) and FSDP2 with tensor parallelism (the LLMs)
    # are the other answers.
    parallel: Parallelism | None = None
    # How the runtime distributed the model (the sharding plan), filled by it and kept with the result.
    layout: dict[str, Any] | None = None
    # grad_norm(parameters) -> the global norm of their gradients, where the engine's distribution needs its
    # own (parameters sharded over several meshes: expert parallelism); None: torch's clip_grad_norm_.
    grad_norm: Callable[[list[torch.Tensor]], torch.Tensor] | None = None
    # The model's repeated blocks (BERT's layers, ResNet's bottlenecks): under --regional-compile each is
    # compiled in place instead of the whole model; blocks of one class share their compiled code (one
    # compilation per distinct shape). Empty: the workload offers no regional compilation.
    regions: tuple[torch.nn.Module, ...] = ()


@dataclass
class EvalPartial:
    """One process's share of an evaluation. The harness combines all processes (sums added, tensor
    gathers concatenated in rank order, object lists concatenated in rank order on rank 0) and
    `metric` turns the combined values into the quality, on rank 0 only; every rank then receives
    the verdict. With asynchronous evaluation `metric` runs in the background (a thread, or a worker
    process if the workload's `host_scoring` is "process": then it must be a module-level function)."""

    metric: Callable[[dict[str, Any]], Quality]
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    gathers: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class EpochView:
    """What the training data of one epoch may use: the epoch number, the model being trained (for
    data the model produces, e.g. self-play; the unwrapped module, in train mode) and `log`, which
    writes an MLPerf event inside the timed region (only rank 0 writes)."""

    epoch: int
    model: torch.nn.Module
    log: Callable[..., None]


@dataclass
class DataParts:
    """What a workload opens after run_start: the training batches and the evaluation."""

    # train_batches(view) -> this process's batches for epoch view.epoch, already on the device.
    train_batches: Callable[[EpochView], Iterable[Any]]
    steps_per_epoch: int | None  # None: unknown in advance (data produced during the epoch)
    train_samples: int | None  # per epoch; None: the samples trained are logged at the end
    eval_samples: int
    # evaluate(forward) -> this process's share of the evaluation set, scored (see EvalPartial).
    # forward(batch) runs the workload's eval_forward on the evaluation model.
    evaluate: Callable[[Callable[[Any], Any]], EvalPartial]
    # Running totals the data source keeps of the work behind its batches (MiniGo's self-play: games,
    # network evaluations), by name; `bench` reports each per second of its timed loop.
    counters: Callable[[], dict[str, float]] | None = None
