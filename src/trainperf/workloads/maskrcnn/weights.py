"""The ResNet-50 body's pretrained weights and the conventions that come with them.

Two conventions exist for an ImageNet-trained ResNet-50, and a body trained in one is wrong in the other:
- `msra`: the reference's (maskrcnn-benchmark's `R-50.pkl`, Detectron's MSRA weights): BGR input in 0..255
  minus the Caffe2 means, the stride of each stage in its first 1x1 convolution (ResNet v1), batch norm
  folded into a per-channel scale and bias;
- `torchvision`: torchvision's `resnet50` ImageNet weights: RGB in 0..1 normalised by their mean and std,
  the stride in the 3x3 convolution (ResNet v1.5).

`convention(recipe)` says which a run's `backbone_weights` follow: a `.pkl` file is Detectron's (read here,
`read_detectron`), any other file a torchvision-format state dict, torchvision's own unless
`backbone_format=msra` says it holds MSRA weights under torchvision's names. The input format and the
stride follow from it (`input_format=auto`); an explicit input format that contradicts the weights is
refused in one line (MaskRCNNRecipe.validate)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.errors import TrainperfError

MSRA, TORCHVISION = "msra", "torchvision"
INPUT_FORMAT = {MSRA: "bgr255", TORCHVISION: "rgb"}
FROZEN_BN_EPS = 1e-5  # torchvision's FrozenBatchNorm2d: scale = weight / sqrt(running_var + eps)


def convention(backbone_weights: str, backbone_format: str) -> str | None:
    """msra | torchvision for the given weights; None without weights (the reference's body, untrained)."""
    if not backbone_weights:
        return None
    if backbone_format != "auto":
        return backbone_format
    return MSRA if Path(backbone_weights).suffix == ".pkl" else TORCHVISION


def input_format(input_format: str, backbone_weights: str, backbone_format: str) -> str:
    """bgr255 | rgb: the recipe's explicit choice, checked against the weights, or the weights' (auto).
    Without weights, auto is the reference's bgr255."""
    wanted = INPUT_FORMAT[convention(backbone_weights, backbone_format) or MSRA]
    if input_format == "auto":
        return wanted
    if backbone_weights and input_format != wanted:
        kind = convention(backbone_weights, backbone_format)
        raise TrainperfError(
            f"--set input_format={input_format}: the backbone weights {backbone_weights} follow the {kind} "
            f"convention, whose input is {wanted} (use input_format={wanted} or auto"
            + (", or backbone_format=msra if they are MSRA weights under torchvision's names)"
               if kind == TORCHVISION else ")"))
    return input_format


class _Arrays(pickle.Unpickler):
    """Only numpy arrays, dicts and plain values: nothing else in the file can run."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not an array")
        return super().find_class(module, name)


def _torchvision_name(blob: str) -> str | None:
    """A Detectron R-50 blob name as torchvision's resnet50 key (None: not part of the body)."""
    if blob == "conv1_w":
        return "conv1.weight"
    if blob in ("res_conv1_bn_s", "res_conv1_bn_b"):
        return "bn1." + ("weight" if blob.endswith("_s") else "bias")
    match = re.fullmatch(r"res([2-5])_(\d+)_branch(1|2[abc])(_bn)?_([wsb])", blob)
    if not match:
        return None
    stage, block, branch, bn, kind = match.groups()
    prefix = f"layer{int(stage) - 1}.{block}."
    if branch == "1":
        module = "downsample.1" if bn else "downsample.0"
    else:
        index = "abc".index(branch[1]) + 1
        module = f"bn{index}" if bn else f"conv{index}"
    return prefix + module + "." + {"w": "weight", "s": "weight", "b": "bias"}[kind]


def read_detectron(path: Path) -> dict[str, torch.Tensor]:
    """Detectron's pickled ResNet-50 (`R-50.pkl`, the reference's MSRA ImageNet weights) as a torchvision
    resnet50 state dict of the body: convolutions as they are, each folded batch norm (scale s, bias b) as a
    frozen one with mean 0 and variance 1 - eps, which computes the same s * x + b."""
    try:
        with path.open("rb") as f:
            data = _Arrays(f, encoding="latin1").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise TrainperfError(f"{path}: cannot read Detectron weights ({type(exc).__name__}: {exc})") from None
    blobs = data.get("blobs", data) if isinstance(data, dict) else None
    if not isinstance(blobs, dict):
        raise TrainperfError(f"{path}: not Detectron weights (expected a dict of named arrays)")
    state: dict[str, torch.Tensor] = {}
    for blob, array in blobs.items():
        name = _torchvision_name(str(blob))
        if name is None or not isinstance(array, np.ndarray):
            continue
        state[name] = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        if ".bn" in name or name.startswith("bn1") or ".downsample.1." in name:
            module = name.rsplit(".", 1)[0]
            channels = array.shape[0]
            state[f"{module}.running_mean"] = torch.zeros(channels)
            state[f"{module}.running_var"] = torch.full((channels,), 1.0 - FROZEN_BN_EPS)
    if "conv1.weight" not in state:
        raise TrainperfError(f"{path}: not Detectron ResNet-50 weights (no conv1_w blob)")
    return state
