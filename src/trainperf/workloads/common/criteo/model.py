"""The MLPs of a click model with DLRM's interaction."""

from __future__ import annotations

from trainperf.errors import TrainperfError


def check_mlps(embedding_dim: int, bottom_mlp: tuple[int, ...], top_mlp: tuple[int, ...]) -> None:
    """A DLRM's MLPs as its interaction needs them: the bottom one ends at the tables' width (its output is one
    of the vectors the interaction combines), the top one at the click logit."""
    if bottom_mlp[-1:] != (embedding_dim,):
        raise TrainperfError(f"recipe: bottom_mlp must end with embedding_dim={embedding_dim}, got {bottom_mlp}")
    if top_mlp[-1:] != (1,):
        raise TrainperfError(f"recipe: top_mlp must end with 1 (the click logit), got {top_mlp}")
