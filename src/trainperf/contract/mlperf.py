"""How MLPerf scores a benchmark: the facts `check`, `score`, `predict` and `scale --project` read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MLPerf:
    # The compliance-checker ruleset the workload is written against (its logs name it; `check`, `score`
    # and `predict` use it, and score published logs of its benchmark key by it).
    ruleset: str
    runs: int  # the runs MLPerf scores with the olympic mean
    olympic_drop: int = 1  # the runs the olympic mean drops at each end (3D U-Net: 4 of 40)
    # Whether the RCP checker reads convergence in training samples (the train_samples records): BERT logs
    # no epochs.
    rcp_in_samples: bool = False
    # Rules for the official checker where no official ruleset knows the benchmark (NCF, retired after
    # v0.5): a YAML file of the checker's format, run with the ruleset's common rules.
    own_rules: Path | None = None
    # The full dataset's training samples per epoch (ImageNet's 1,281,167 images), and what one full
    # evaluation costs in forward passes of one training sample (NCF: 138,493 users x 1,000 candidates;
    # 3D U-Net: its sliding-window patches). `predict` and `scale --project` read them; None: unknown.
    full_epoch_samples: int | None = None
    full_eval_forwards: int | None = None
    # The full evaluation set's size as the log's `eval_samples` gives it (3D U-Net: 42 cases; some closed
    # rules require the exact count). None: the evaluation is not a fixed set (MiniGo's games).
    full_eval_samples: int | None = None
    # Full recipes not meant to pass the closed rules of the ruleset (an older round's settings: MiniGo's
    # v0.6 9x9 plays 4,096 games a generation, 1.0.0 requires 8,192).
    open_recipes: frozenset[str] = frozenset()
    # The open-division rules a mini's log cannot honestly meet, each (key, the value a compliant run logs,
    # why): dlrmv4's open rules fix Yambda-5B's sample counts and bound the learning rate to the reference's
    # scaling law. The golden-record test checks a mini's log with these values put in place, so that every
    # other rule still holds; `trainperf check` on a mini's log names them as failures, as they are.
    mini_waivers: tuple[tuple[str, object, str], ...] = ()

    def __post_init__(self) -> None:
        if self.runs <= 2 * self.olympic_drop:
            raise ValueError(f"MLPerf: {self.runs} runs cannot drop {self.olympic_drop} at each end")
