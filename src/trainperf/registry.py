"""Workload name -> class, imported lazily so a workload's heavy dependencies load only when used."""

from __future__ import annotations

import importlib

from trainperf.errors import TrainperfError
from trainperf.spec import Workload

# name -> "module:Class"; adding a workload is one line here plus its package.
_WORKLOADS: dict[str, str] = {
    "resnet": "trainperf.workloads.resnet:ResNetWorkload",
    "ncf": "trainperf.workloads.ncf:NCFWorkload",
    "dlrm": "trainperf.workloads.dlrm:DLRMWorkload",
    "ssd": "trainperf.workloads.ssd:SSDWorkload",
    "retinanet": "trainperf.workloads.retinanet:RetinaNetWorkload",
    "transformer": "trainperf.workloads.transformer:TransformerWorkload",
    "gnmt": "trainperf.workloads.gnmt:GNMTWorkload",
    "bert": "trainperf.workloads.bert:BertWorkload",
    "rnnt": "trainperf.workloads.rnnt:RNNTWorkload",
    "unet3d": "trainperf.workloads.unet3d:UNet3DWorkload",
    "maskrcnn": "trainperf.workloads.maskrcnn:MaskRCNNWorkload",
    "minigo": "trainperf.workloads.minigo:MiniGoWorkload",
}


def names() -> list[str]:
    return list(_WORKLOADS)


def by_benchmark(benchmark: str) -> Workload | None:
    """The workload whose MLPerf key is `benchmark`, if trainperf has one."""
    for name in _WORKLOADS:
        workload = get(name)
        if workload.benchmark == benchmark:
            return workload
    return None


def get(name: str) -> Workload:
    """Instantiate the workload called `name`, or raise a one-line error listing the known ones."""
    target = _WORKLOADS.get(name)
    if target is None:
        raise TrainperfError(f"unknown workload {name!r}; known workloads: " + ", ".join(_WORKLOADS))
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls()
