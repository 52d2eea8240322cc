"""Optional dependencies: the extra that brings each, and one line naming it when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from trainperf.errors import TrainperfError

# TorchRec's own package asks for the CUDA build of FBGEMM and pins an old torchmetrics: trainperf's extras
# name the FBGEMM build and TorchRec's other needs, and TorchRec itself goes in without its dependencies.
TORCHREC = ("pip install -e '.[recsys-cpu]' && pip install --no-deps torchrec==1.9.2 (on a GPU: '.[recsys-cuda]', "
            "with the fbgemm-gpu build of your CUDA)")


TORCHAO = "pip install -e '.[fp8]' (or pip install torchao)"


def require(module: str, feature: str, install: str) -> ModuleType:
    """`module`, imported; or one line saying that `feature` needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrainperfError(f"{feature}: {module} cannot be imported ({exc}); install it: {install}") from None
