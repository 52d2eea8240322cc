"""DLRM-DCNv2's recipes: the reference convergence points of MLPerf's `rcps_dlrm_dcnv2.json` (identical in
rulesets 5.1.0 and 6.0.0: Adagrad at 0.004, 0.0034 at 135,168; no warmup or decay) and the mini's. The closed
rules (`closed_dlrm_dcnv2.yaml`, byte-identical in 3.0.0-6.0.0) fix Adagrad with ε 1e-8, no learning-rate
decay, no weight decay, an initial accumulator of 0; the reference (mlcommons/training
`recommendation_v2/torchrec_dlrm`) trains one epoch at most and evaluates 20 times an epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Counts, Positive
from trainperf.errors import TrainperfError
from trainperf.workloads.common.criteo.model import check_mlps
from trainperf.workloads.dlrm_dcnv2 import synthetic
from trainperf.workloads.dlrm_dcnv2.data import MULTI_HOT_SIZES, N_SPARSE, TABLE_SIZES


@dataclass(frozen=True)
class DCNv2Recipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    base_lr: Positive = 0.004
    eps: Positive = 1e-8
    embedding_dim: Count = 128
    bottom_mlp: Counts = (512, 256, 128)  # after the 13 dense inputs; the last = embedding_dim
    top_mlp: Counts = (1024, 1024, 512, 256, 1)
    dcn_layers: Count = 3
    dcn_rank: Count = 512
    table_sizes: Counts = TABLE_SIZES
    multi_hot_sizes: Counts = MULTI_HOT_SIZES
    eval_batch_size: Count = 65_536
    # At most this many rows per table, ids taken modulo it; 0: none. A full-shape step on a machine that cannot
    # hold the 26 billion table parameters (bench, the CPU's probes): not the reference model.
    max_ind_range: int = 0
    # The tables' engine: TorchRec's, as the reference's (sharded by its planner, FBGEMM's kernels with
    # Adagrad fused into the backward). The one choice, named so that `plan` and `bench` say it.
    embeddings: str = "torchrec"

    CHOICES = {"embeddings": ("torchrec",)}

    def validate(self) -> None:
        super().validate()
        check_mlps(self.embedding_dim, self.bottom_mlp, self.top_mlp)
        for name in ("table_sizes", "multi_hot_sizes"):
            if len(getattr(self, name)) != N_SPARSE:
                raise TrainperfError(f"recipe field {name}: {N_SPARSE} values expected, got {len(getattr(self, name))}")
        if self.grad_accum_steps > 1:
            raise TrainperfError("recipe field grad_accum_steps > 1: the tables' update is fused into each backward "
                                 "pass, so it cannot wait for several micro-batches")


def _rcp(gbs: int, lr: float = 0.004) -> DCNv2Recipe:
    return DCNv2Recipe(name=f"gbs{gbs}", global_batch_size=gbs, base_lr=lr, max_epochs=1, target=0.80275,
                       eval_every=1, eval_first=1, evals_per_epoch=20, log_epoch_num="epochs")


# 55,296 first: the batch of the published 8-GPU results.
FULL_RECIPES = {r.name: r for r in (_rcp(55_296), _rcp(32_768), _rcp(65_536), _rcp(102_400), _rcp(135_168, 0.0034),
                                    _rcp(160_000))}

MINI = DCNv2Recipe(
    name="mini", global_batch_size=512, base_lr=0.03, max_epochs=1, target=0.80, eval_every=1, eval_first=1,
    evals_per_epoch=20, log_epoch_num="epochs", embedding_dim=16, bottom_mlp=(64, 16), top_mlp=(64, 32, 1),
    dcn_layers=3, dcn_rank=32, table_sizes=synthetic.TABLES, multi_hot_sizes=synthetic.HOTNESS,
    eval_batch_size=8192)
