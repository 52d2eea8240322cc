"""DLRM's recipes: the MLPerf reference convergence points (mlperf_logging's RCPs, Criteo Terabyte), the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from trainperf.contract import (
    Recipe,
)
from trainperf.contract.fields import Count, Counts, Positive

# Imported with the workload, not at the first evaluation: the import (~1.4 s here) is not training time.
from trainperf.errors import TrainperfError
from trainperf.workloads.common.criteo.model import check_mlps
from trainperf.workloads.dlrm import data as dlrm_data
from trainperf.workloads.dlrm import mini as dlrm_mini

FULL_DAYS = 24
# The mini dataset (generated once by `prepare`, so not a recipe field: a recipe cannot change it).
MINI_DAYS, MINI_ROWS_PER_DAY = 4, 100_000
MIN_LR = 1e-7  # the reference's floor during the polynomial decay
# Criteo Terabyte's 26 table sizes after the reference's 40M cap (NVIDIA's v0.7 HugeCTR config): the
# tables of a run without a prepared dataset (synthetic benchmarks).
CRITEO_1TB_TABLE_SIZES = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
                          2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)


@dataclass(frozen=True)
class DLRMRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps", "decay_start_step", "decay_steps")
    WARMUP_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_steps",)
    base_lr: Positive = 1.0
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    poly_power: Positive = 2.0  # fixed by the closed rules
    embedding_dim: Count = 128
    bottom_mlp: Counts = (512, 256, 128)  # after the 13 dense inputs; the last = embedding_dim
    top_mlp: Counts = (1024, 1024, 512, 256, 1)
    eval_batch_size: Count = 16384
    # Where the embedding tables live: "device" (with the MLPs) or "cpu" (host memory, the MLPs and
    # the interaction on the device). The reference tables (~96 GB in fp32) fit no single 80 GB GPU.
    embedding_device: str = "device"
    # The tables of a run without a prepared dataset (synthetic benchmarks); a dataset's own sizes win.
    table_sizes: Counts = CRITEO_1TB_TABLE_SIZES
    # At most this many rows per table, ids taken modulo it (the reference's --max-ind-range, which its
    # preprocessing already applies at 40,000,000); 0: no cap. Fits the 96 GB of reference tables on a
    # smaller machine, at the price of hashed ids (no longer the reference model).
    max_ind_range: int = 0
    # The tables' engine: "torch" (one EmbeddingBag per table, replicated by DDP on every process), or
    # "torchrec" (one TorchRec EmbeddingBagCollection sharded across the processes by TorchRec's planner,
    # FBGEMM's table-batched kernels with SGD fused into the backward: the full tables need it on GPUs).
    embeddings: str = "torch"

    CHOICES = {"embedding_device": ("device", "cpu"), "embeddings": ("torch", "torchrec")}

    def validate(self) -> None:
        super().validate()
        check_mlps(self.embedding_dim, self.bottom_mlp, self.top_mlp)
        if len(self.table_sizes) != dlrm_data.N_SPARSE:
            raise TrainperfError(f"recipe field table_sizes: {dlrm_data.N_SPARSE} table sizes expected, got "
                                 f"{len(self.table_sizes)}")
        if self.embeddings == "torchrec" and self.embedding_device == "cpu":
            raise TrainperfError("recipe fields embeddings=torchrec and embedding_device=cpu: TorchRec places the "
                                 "tables itself (in host memory behind a device cache where a GPU cannot hold them)")
        if self.embeddings == "torchrec" and self.grad_accum_steps > 1:
            raise TrainperfError("recipe fields embeddings=torchrec and grad_accum_steps > 1: the tables' update is "
                                 "fused into each backward pass, so it cannot wait for several micro-batches")


def _full(name: str, **fields: Any) -> DLRMRecipe:
    # One pass over the data at most, evaluated every 0.05 epoch (MLPerf DLRM), logged as 1.05, 1.10, …
    return DLRMRecipe(name=name, max_epochs=1, target=0.8025, eval_every=1, eval_first=1, evals_per_epoch=20,
                      log_epoch_num="1+epochs", **fields)


# The reference run_and_time.sh, then the reference convergence points (RCP) of the v2.0 round.
FULL_RECIPES = {r.name: r for r in (
    _full("reference-2048", global_batch_size=2048, base_lr=1.0, warmup_steps=0, decay_start_step=0,
          decay_steps=0),
    _full("rcp-32768", global_batch_size=32768, base_lr=18.0, warmup_steps=8000, decay_start_step=70000,
          decay_steps=30000),
    _full("rcp-55296", global_batch_size=55296, base_lr=24.0, warmup_steps=2750, decay_start_step=49315,
          decay_steps=27772),
    _full("rcp-71680", global_batch_size=71680, base_lr=26.0, warmup_steps=2500, decay_start_step=46821,
          decay_steps=15406),
)}
MINI = DLRMRecipe(name="mini", global_batch_size=512, max_epochs=2, target=0.79, eval_every=1, eval_first=1,
                  evals_per_epoch=20, log_epoch_num="1+epochs", base_lr=1.0, warmup_steps=50, decay_start_step=600,
                  decay_steps=600,
                  embedding_dim=16, bottom_mlp=(64, 16), top_mlp=(64, 32, 1), eval_batch_size=8192,
                  table_sizes=dlrm_mini.MINI_CARDINALITIES)
