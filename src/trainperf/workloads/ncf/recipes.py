"""NCF's recipes: the MLPerf reference (v0.7 hyperparameters, HR@10 0.635) and the mini's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainperf.contract import Recipe
from trainperf.contract.fields import Count, Counts, Fraction, Positive
from trainperf.errors import TrainperfError

# The mini dataset (generated once by `prepare`, so not a recipe field: a recipe cannot change it).
MINI_USERS, MINI_ITEMS = 3000, 1000


@dataclass(frozen=True)
class NCFRecipe(Recipe):
    LR_FIELDS: ClassVar[tuple[str, ...]] = ("base_lr",)
    factors: Count = 64  # GMF embedding size
    mlp_layers: Counts = (256, 256, 128, 64)  # first = concatenated user+item MLP embeddings
    base_lr: Positive = 5e-4
    beta1: Fraction = 0.9
    beta2: Fraction = 0.999
    eps: Positive = 1e-8
    train_negatives: Count = 4
    eval_batch_users: Count = 256
    # The embeddings of a run without a converted dataset (synthetic benchmarks): ml-20m's users and
    # items; a dataset's own counts win.
    users: Count = 138_493
    items: Count = 26_744

    def validate(self) -> None:
        super().validate()
        if len(self.mlp_layers) < 2 or self.mlp_layers[0] % 2:
            raise TrainperfError("recipe field mlp_layers: at least two layers, the first of an even width (the "
                                 "user and item halves)")


FULL = NCFRecipe(name="reference", global_batch_size=2048, max_epochs=20, target=0.635, eval_every=1, eval_first=1)
MINI = NCFRecipe(name="mini", global_batch_size=1024, max_epochs=12, target=0.35, eval_every=1, eval_first=1,
                 factors=16, mlp_layers=(64, 32, 16), base_lr=4e-3, users=MINI_USERS, items=MINI_ITEMS)
