"""Assets: the files `build` reads, by name, checked before initialisation."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from trainperf.errors import TrainperfError


class Assets(Mapping[str, Path]):
    """Files `build` reads, by name (prepared-dataset metadata, pretrained weights, a start checkpoint,
    a target model). The harness checks they exist before initialisation; reading one that is
    broken is a one-line error naming the file."""

    def __init__(self, paths: Mapping[str, Path] | None = None) -> None:
        self._paths = {name: Path(p) for name, p in (paths or {}).items()}

    def __getitem__(self, name: str) -> Path:
        if name not in self._paths:
            raise TrainperfError(f"asset {name!r} was not declared by the workload")
        return self._paths[name]

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def problems(self) -> list[str]:
        return [f"{path}: missing ({name})" for name, path in self._paths.items() if not path.is_file()]

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise TrainperfError(problems[0])

    def json(self, name: str) -> Any:
        import json

        path = self[name]
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TrainperfError(f"{path}: cannot read {name} ({exc})") from None

    def state_dict(self, name: str, like: Mapping[str, torch.Tensor] | None = None, what: str = "the model"
                   ) -> dict[str, Any]:
        """A PyTorch state dict, loaded with weights_only=True (no code from the file runs). With `like`
        (the state dict of the module it is for), every key of `like` must be there with its shape
        (`num_batches_tracked` may be absent): a mismatch is one line naming the tensor and `what`."""
        path = self[name]
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - pickle, zip and I/O errors all mean a bad file
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            raise TrainperfError(f"{path}: cannot load {name} ({type(exc).__name__}: {first})") from None
        if not isinstance(state, dict):
            raise TrainperfError(f"{path}: {name} is not a state dict (got {type(state).__name__})")
        if like is not None:
            self.check_like(path, state, like, what)
        return state

    @staticmethod
    def check_like(path: Path, state: Mapping[str, Any], like: Mapping[str, torch.Tensor], what: str) -> None:
        """Every key of `like` in `state` with its shape (`num_batches_tracked` may be absent), or one line
        naming the file, the tensor and `what`."""
        expected = {k: v for k, v in like.items() if not k.endswith("num_batches_tracked")}
        missing = sorted(set(expected) - set(state))
        if missing:
            raise TrainperfError(f"{path}: not a state dict of {what} (missing {missing[0]}, "
                                 f"+{len(missing) - 1} more)")
        for key, value in expected.items():
            found = state[key]
            shape = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
            if shape != tuple(value.shape):
                raise TrainperfError(f"{path}: {key} has shape {shape}, {what} needs {tuple(value.shape)}")
