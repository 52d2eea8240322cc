"""The contract's former name: `trainperf.spec` and its modules are `trainperf.contract`'s, the same objects, so
that out-of-tree workloads written against it keep working. New code imports trainperf.contract."""

from __future__ import annotations

import importlib
import pkgutil
import sys

from trainperf import contract
from trainperf.contract import *  # noqa: F403 - the whole contract, under its old name
from trainperf.contract import __all__  # noqa: F401

for _module in pkgutil.iter_modules(contract.__path__):
    # The same module objects under both names: a class imported either way is one class.
    globals()[_module.name] = sys.modules[f"{__name__}.{_module.name}"] = \
        importlib.import_module(f"trainperf.contract.{_module.name}")
